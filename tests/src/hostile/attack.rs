//! The attack process and the tmpfs its files live in.

use std::{
    io::{BufRead as _, BufReader, Read as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// An attack running as its own process; killed when dropped.
pub struct Attack {
    pub name: String,
    child: Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
}

impl Attack {
    pub fn spawn(name: &str, mut command: Command) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("starting the attack {name}: {err}"));
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        if let Some(pipe) = child.stdout.take() {
            let lines = stdout.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    lines.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                }
            });
        }
        if let Some(mut pipe) = child.stderr.take() {
            let text = stderr.clone();
            std::thread::spawn(move || {
                let mut all = String::new();
                let _ = pipe.read_to_string(&mut all);
                text.lock().unwrap_or_else(|e| e.into_inner()).push_str(&all);
            });
        }
        Self {
            name: name.to_owned(),
            child,
            stdout,
            stderr,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its output so far, stdout then stderr.
    pub fn output(&self) -> String {
        let stdout = self.stdout.lock().unwrap_or_else(|e| e.into_inner()).join("\n");
        let stderr = self.stderr.lock().unwrap_or_else(|e| e.into_inner()).clone();
        format!("{stdout}\n{stderr}").trim().to_owned()
    }

    /// Panics if the attack has exited: a test must not pass because its
    /// attack stopped (or never got going).
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            // Let the readers catch its last words.
            std::thread::sleep(Duration::from_millis(100));
            panic!(
                "the attack {} exited early ({status}): {}",
                self.name,
                self.output()
            );
        }
    }

    /// Waits, at most `timeout`, for a line of its stdout that starts with `prefix`.
    pub fn wait_for(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let found = self
                .stdout
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .find(|line| line.starts_with(prefix))
                .cloned();
            if let Some(line) = found {
                return line;
            }
            self.assert_running();
            assert!(
                Instant::now() < deadline,
                "the attack {} did not say {prefix:?} within {timeout:?}: {}",
                self.name,
                self.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Attack {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tmpfs of its own (mode `mode`, executable files allowed), unmounted
/// when dropped: attacker files live there, so that rewriting megabytes in
/// a loop stays in memory and inode numbers start afresh.
pub struct Scratch {
    pub path: PathBuf,
}

impl Scratch {
    pub fn mount(name: &str, mode: &str) -> Self {
        let path = std::env::temp_dir().join(format!("profilerd-hostile-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap_or_else(|err| panic!("creating {}: {err}", path.display()));
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("mode={mode},size=1g"), "tmpfs"])
            .arg(&path)
            .status()
            .expect("running mount (the tests need root)");
        assert!(
            status.success(),
            "mounting a tmpfs on {}: {status}",
            path.display()
        );
        Self { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Lazily: a process of the test may still hold a file open there.
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        let _ = std::fs::remove_dir(&self.path);
    }
}
