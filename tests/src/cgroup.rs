//! A cgroup v2 of the test's own, removed when dropped.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

pub struct TestCgroup {
    parent: PathBuf,
    /// The cgroup's directory.
    pub dir: PathBuf,
}

impl TestCgroup {
    /// `/sys/fs/cgroup/profilerd-test-PID/NAME` (NAME may look like a unit).
    pub fn create(name: &str) -> Self {
        // Unified layout, or hybrid (v2 beside the v1 hierarchies).
        let root = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .iter()
            .map(Path::new)
            .find(|root| root.join("cgroup.procs").exists() && !root.join("tasks").exists())
            .expect("a cgroup v2 hierarchy");
        let parent = root.join(format!("profilerd-test-{}", std::process::id()));
        let dir = parent.join(name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|err| panic!("creating {}: {err}", dir.display()));
        Self { parent, dir }
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // A killed process leaves its cgroup a moment after the kill.
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&self.dir).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = std::fs::remove_dir(&self.parent);
    }
}

impl TestCgroup {
    /// Starts `program ARGS` in this cgroup from its exec on, as a
    /// service's process is. Paths go as arguments, not in the script: a
    /// clone's path may hold spaces.
    pub fn spawn(&self, program: &str, args: &[&str]) -> crate::Workload {
        let procs = self.dir.join("cgroup.procs");
        let mut all = vec![
            "-c",
            r#"echo $$ > "$1" && shift && exec "$@""#,
            "sh",
            procs.to_str().expect("utf-8 cgroup path"),
            program,
        ];
        all.extend_from_slice(args);
        crate::Workload::spawn("/bin/sh", &all)
    }
}
