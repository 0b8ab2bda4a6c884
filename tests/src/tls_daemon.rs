//! A profilerd serving TLS for the TLS tests, and curl as its client (in
//! the client's network namespace, see [`crate::pki::Remote`]).

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::pki::Remote;

/// A daemon started with `args`, its log in a file; SIGTERM on drop.
pub struct TlsDaemon {
    child: Child,
    log: PathBuf,
}

impl TlsDaemon {
    /// Starts it and waits (30 s at most) until `ready` says it answers.
    pub fn start(args: &[String], log: PathBuf, ready: impl Fn() -> bool) -> Self {
        let file = std::fs::File::create(&log).expect("creating the daemon's log");
        let child = Command::new(crate::profilerd_bin())
            .args(args)
            .env("RUST_LOG", "info,profilerd::serve::tls=debug")
            .stderr(Stdio::from(file))
            .spawn()
            .expect("starting profilerd");
        let mut daemon = Self { child, log };
        let started = Instant::now();
        while !ready() {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                panic!("profilerd exited before answering: {status}\n{}", daemon.log());
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "profilerd did not answer over TLS within 30 s:\n{}",
                daemon.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        daemon
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn hangup(&self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGHUP) };
    }

    pub fn assert_running(&mut self, when: &str) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("profilerd exited {when}: {status}\n{}", self.log());
        }
    }
}

impl Drop for TlsDaemon {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What curl got: its exit code, the HTTP status (0 for none), the
/// response head, the body and how long it took.
pub struct Fetched {
    pub exit: i32,
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
    pub stderr: String,
    pub took: Duration,
}

impl Fetched {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `curl ARGS URL` run in `remote`'s namespace.
pub fn curl(remote: &Remote, args: &[&str], url: &str) -> Fetched {
    let body_file = std::env::temp_dir().join(format!("profilerd-tls-body-{}", std::process::id()));
    let _ = std::fs::remove_file(&body_file);
    let started = Instant::now();
    let output = remote
        .command("curl")
        .args(["-sS", "--max-time", "60", "-D", "-", "-w", "%{http_code}", "-o"])
        .arg(&body_file)
        .args(args)
        .arg(url)
        .output()
        .expect("running curl in the client's namespace");
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let (head, status) = stdout.split_at(stdout.len().saturating_sub(3));
    let body = std::fs::read(&body_file).unwrap_or_default();
    let _ = std::fs::remove_file(&body_file);
    Fetched {
        exit: output.status.code().unwrap_or(-1),
        status: status.parse().unwrap_or(0),
        head: head.to_owned(),
        body,
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        took,
    }
}

pub fn path_arg(path: &Path) -> String {
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// Polls `attempt` every 500 ms until it returns Ok, for 30 s at most.
pub fn within_30s<T>(what: &str, mut attempt: impl FnMut() -> Result<T, String>) -> T {
    let started = Instant::now();
    loop {
        match attempt() {
            Ok(value) => return value,
            Err(last) => assert!(
                started.elapsed() < Duration::from_secs(30),
                "{what} within 30 s; last: {last}"
            ),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
