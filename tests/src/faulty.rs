//! `profilerd-faulty`, the daemon with a fault hook (PROFILERD_FAULT), run
//! with its log captured line by line, to test the supervision.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use crate::daemon::free_port;

/// `profilerd-faulty` (profiler-daemon/examples/profilerd_faulty.rs): the
/// daemon with the fault hook, built beside `profilerd` from the same
/// library by `cargo build --release --all-targets`.
pub fn fault_injection_bin() -> PathBuf {
    crate::built_bin(
        "examples/profilerd-faulty",
        "cargo build --release -p profiler-daemon --example profilerd-faulty",
    )
}

/// A running daemon whose standard error is read line by line, each line
/// with the instant it arrived (and echoed to the test's output).
pub struct LoggedDaemon {
    child: Child,
    pub addr: String,
    lines: mpsc::Receiver<(Instant, String)>,
    /// Every line read so far.
    pub log: Vec<(Instant, String)>,
}

impl LoggedDaemon {
    /// Starts `bin` on a free loopback port with `env` set, and waits until
    /// /metrics answers 200 (the BPF programs are attached by then).
    pub fn start(bin: &Path, env: &[(&str, &str)]) -> Self {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut child = Command::new(bin)
            .args(["--listen", &addr])
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("starting {}: {err}", bin.display()));
        let stderr = child.stderr.take().expect("a piped stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[profilerd] {line}");
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        let mut daemon = Self {
            child,
            addr,
            lines,
            log: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = daemon.try_wait() {
                panic!("profilerd exited before serving: {status}\n{}", daemon.log_text());
            }
            let answer = ureq::get(&format!("http://{}/metrics", daemon.addr))
                .config()
                .timeout_global(Some(Duration::from_secs(5)))
                .build()
                .call();
            if answer.is_ok_and(|answer| answer.status() == 200) {
                return daemon;
            }
            assert!(
                Instant::now() < deadline,
                "profilerd did not serve /metrics within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.read_lines();
        self.child.try_wait().ok().flatten()
    }

    fn read_lines(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.log.push(line);
        }
    }

    /// When the first line containing `needle` arrived, waiting up to `timeout`.
    pub fn wait_for_line(&mut self, needle: &str, timeout: Duration) -> Instant {
        let deadline = Instant::now() + timeout;
        loop {
            self.read_lines();
            if let Some((at, _)) = self.log.iter().find(|(_, line)| line.contains(needle)) {
                return *at;
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {needle:?} within {timeout:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The exit status and when it was seen, waiting up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> (ExitStatus, Instant) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                let at = Instant::now();
                // The last lines, written just before the exit.
                std::thread::sleep(Duration::from_millis(200));
                self.read_lines();
                return (status, at);
            }
            assert!(
                Instant::now() < deadline,
                "profilerd still running {timeout:?} later:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn log_text(&self) -> String {
        self.log.iter().map(|(_, line)| format!("{line}\n")).collect()
    }
}

impl Drop for LoggedDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
