//! A small /proc of made-up processes in a scratch directory, for unit
//! tests of the code that reads /proc (no root, no real process needed).

use std::path::{Path, PathBuf};

use super::ProcRoot;

/// Removed when dropped.
pub struct FixtureProc {
    dir: PathBuf,
}

impl FixtureProc {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("profilerd-proc-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch /proc");
        Self { dir }
    }

    pub fn root(&self) -> ProcRoot {
        ProcRoot::new(self.dir.clone())
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Writes `/proc/PID/NAME`.
    pub fn write(&self, pid: u32, name: &str, text: &str) -> &Self {
        let path = self.dir.join(pid.to_string()).join(name);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("the process's directory");
        std::fs::write(&path, text).expect("a /proc file");
        self
    }

    /// A `status` with these real, effective, saved (and fs) uids and gids.
    pub fn status(uids: [u32; 3], gids: [u32; 3], permitted: u64, ns_pids: &[u32]) -> String {
        let ids = |ids: [u32; 3]| format!("{}\t{}\t{}\t{}", ids[0], ids[1], ids[2], ids[1]);
        let ns: Vec<String> = ns_pids.iter().map(u32::to_string).collect();
        format!(
            "Name:\tfixture\nUid:\t{}\nGid:\t{}\nCapInh:\t0000000000000000\nCapPrm:\t{permitted:016x}\nNSpid:\t{}\n",
            ids(uids),
            ids(gids),
            ns.join("\t")
        )
    }
}

impl Drop for FixtureProc {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// This test's own uid and gid.
pub fn own_ids() -> (u32, u32) {
    (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw())
}
