//! alloc_sites, the workload that counts its own allocations per call site
//! (tests/workloads/alloc_sites.c): how it runs, and what it counted.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use super::{CHURN_SITE, LEAK_SITE, SITES, eventually};
use crate::container::Container;

/// alloc_sites's path (built by tests/build.rs without frame pointers).
pub fn binary() -> &'static str {
    env!("WORKLOAD_ALLOC_SITES")
}

/// How alloc_sites runs: its arguments.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// "all" or "churn".
    pub mode: &'static str,
    /// Its whole life, unless stopped earlier.
    pub seconds: f64,
    pub leak_per_s: u64,
    /// Bytes the non-leaking sites allocate per second between them.
    pub sites_per_s: u64,
}

impl Options {
    /// Every site, for `seconds`, at these rates.
    pub fn all(seconds: f64, leak_per_s: u64, sites_per_s: u64) -> Self {
        Self {
            mode: "all",
            seconds,
            leak_per_s,
            sites_per_s,
        }
    }

    /// The malloc storm: about 2 million malloc(64) + free a second.
    pub fn churn(seconds: f64) -> Self {
        Self {
            mode: "churn",
            seconds,
            leak_per_s: 0,
            sites_per_s: 0,
        }
    }

    fn args(&self, stats: &Path) -> Vec<String> {
        vec![
            stats.display().to_string(),
            self.seconds.to_string(),
            self.mode.to_owned(),
            self.leak_per_s.to_string(),
            self.sites_per_s.to_string(),
        ]
    }
}

/// A temporary directory of this test process, removed on drop.
pub(super) struct TempDir(pub(super) PathBuf);

impl TempDir {
    pub(super) fn new(name: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("profilerd-allocs-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|err| panic!("creating {}: {err}", dir.display()));
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running alloc_sites; killed on drop. Its stdin is a pipe this holds:
/// should the test process die, the pipe closes and the workload ends.
pub struct AllocSites {
    /// alloc_sites itself, or what runs it (nsenter, for a container).
    child: Child,
    /// alloc_sites's pid in the host's pid namespace.
    pid: u32,
    stdin: Option<ChildStdin>,
    /// Its stats file, as the host reaches it.
    stats: PathBuf,
    _dir: Option<TempDir>,
}

impl AllocSites {
    pub fn start(options: Options) -> Self {
        Self::start_with(&[], options)
    }

    /// Runs `wrapper... alloc_sites ARGS` (valgrind, for one).
    pub fn start_with(wrapper: &[&str], options: Options) -> Self {
        Self::spawn(wrapper, None, options)
    }

    /// Runs alloc_sites under another name (its comm, at most 15 bytes),
    /// through a link in its directory: a test that chooses it by name must
    /// not pick up the alloc_sites of a test in the suite's other lane.
    pub fn start_as(name: &str, options: Options) -> Self {
        Self::spawn(&[], Some(name), options)
    }

    fn spawn(wrapper: &[&str], name: Option<&str>, options: Options) -> Self {
        let dir = TempDir::new(options.mode);
        let stats = dir.0.join("stats");
        let args = options.args(&stats);
        let link = name.map(|name| crate::NameLink::new(binary(), name));
        let program = link.as_ref().map_or(binary(), crate::NameLink::path);
        let mut command = match wrapper.split_first() {
            Some((wrapper, rest)) => {
                let mut command = Command::new(wrapper);
                command.args(rest).arg(program);
                command
            }
            None => Command::new(program),
        };
        let mut child = command
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| panic!("starting {wrapper:?} alloc_sites {args:?}: {err}"));
        let stdin = child.stdin.take();
        if let Some(name) = name {
            // exec succeeded (spawn returned): the name is the link's.
            crate::assert_comm(child.id(), name);
        }
        Self {
            pid: child.id(),
            child,
            stdin,
            stats,
            _dir: Some(dir),
        }
    }

    /// Runs alloc_sites inside `container`, in every namespace of its PID 1
    /// (its mount namespace: the container's own root and libc; its pid
    /// namespace: a pid of its own there), from a copy of the binary put in
    /// the container's root (its volatile overlay: the cached rootfs stays
    /// pristine). The stats file is in the container's /tmp, which the host
    /// reads through [`Container::root`].
    pub fn start_in_container(container: &Container, options: Options) -> Self {
        let root = container.root();
        let inside = "/usr/local/bin/alloc_sites";
        let copy = root.join(inside.trim_start_matches('/'));
        std::fs::copy(binary(), &copy)
            .unwrap_or_else(|err| panic!("copying alloc_sites to {}: {err}", copy.display()));
        let stats_inside = format!("/tmp/profilerd-allocs-{}-stats", std::process::id());
        let stats = root.join(stats_inside.trim_start_matches('/'));
        let _ = std::fs::remove_file(&stats);
        let args = options.args(Path::new(&stats_inside));
        let argv: Vec<&str> = std::iter::once(inside)
            .chain(args.iter().map(String::as_str))
            .collect();
        let mut child = container
            .command(&argv)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| panic!("starting alloc_sites {args:?} in the container: {err}"));
        let stdin = child.stdin.take();
        // nsenter forks into the pid namespace, then its child execs
        // alloc_sites: that child's host pid, once it is alloc_sites.
        let nsenter = child.id();
        let pid = eventually(Duration::from_secs(10), || {
            let children =
                std::fs::read_to_string(format!("/proc/{nsenter}/task/{nsenter}/children")).ok()?;
            let pid: u32 = children.split_whitespace().next()?.parse().ok()?;
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "alloc_sites")
                .then_some(pid)
        });
        let mut workload = Self {
            child,
            pid: 0,
            stdin,
            stats,
            _dir: None,
        };
        workload.pid = pid.unwrap_or_else(|| {
            panic!(
                "no alloc_sites under nsenter ({nsenter}) in the container within 10 s (nsenter {})",
                if workload.running() { "runs" } else { "exited" }
            )
        });
        workload
    }

    /// Its pid in the host's pid namespace: what was started (valgrind's,
    /// when wrapped: valgrind runs the program in its own process), or
    /// nsenter's child in a container.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Its stats as last written; waits (10 s at most) for the first ones.
    pub fn stats(&mut self) -> Stats {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // Written to a temporary file and renamed: whole, or not yet there.
            if let Ok(text) = std::fs::read_to_string(&self.stats) {
                return Stats::parse(&text);
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "alloc_sites exited ({status}) before writing {}",
                    self.stats.display()
                );
            }
            assert!(
                Instant::now() < deadline,
                "alloc_sites wrote no {} within 10 s",
                self.stats.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until it has run `at_least` (by its own clock), and returns
    /// its stats then. A minute at most: a stall.
    pub fn wait_until_run(&mut self, at_least: Duration) -> Stats {
        let deadline = Instant::now() + at_least + Duration::from_secs(60);
        loop {
            let stats = self.stats();
            if stats.elapsed() >= at_least {
                return stats;
            }
            assert!(
                self.running(),
                "alloc_sites exited after {:?}, before running {at_least:?}",
                stats.elapsed()
            );
            assert!(
                Instant::now() < deadline,
                "alloc_sites had run only {:?} of the {at_least:?} awaited a minute later",
                stats.elapsed()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for it to end by itself (`within` at most) and returns its
    /// exit status and its last stats.
    pub fn wait_exit(&mut self, within: Duration) -> (ExitStatus, Stats) {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return (status, self.stats());
            }
            assert!(
                Instant::now() < deadline,
                "alloc_sites still runs {within:?} after it was due to end"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for AllocSites {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One stats file of alloc_sites (see its header for the keys).
#[derive(Clone, Debug)]
pub struct Stats {
    values: BTreeMap<String, String>,
}

impl Stats {
    pub fn parse(text: &str) -> Self {
        let values = text
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(key, value)| (key.to_owned(), value.to_owned()))
            .collect();
        Self { values }
    }

    pub fn value(&self, key: &str) -> u64 {
        let text = self
            .values
            .get(key)
            .unwrap_or_else(|| panic!("{key} missing from alloc_sites's stats: {:?}", self.values));
        text.parse()
            .unwrap_or_else(|_| panic!("{key}={text} in alloc_sites's stats is not a number"))
    }

    pub fn pid(&self) -> u32 {
        u32::try_from(self.value("pid")).expect("a pid")
    }

    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.value("elapsed_ns"))
    }

    pub fn done(&self) -> bool {
        self.value("done") == 1
    }

    pub fn calls(&self, site: &str) -> u64 {
        self.value(&format!("{site}.calls"))
    }

    pub fn bytes(&self, site: &str) -> u64 {
        self.value(&format!("{site}.bytes"))
    }

    /// The most the non-leaking sites ever hold live.
    pub fn max_outstanding_bytes(&self) -> u64 {
        self.value("max_outstanding_bytes")
    }

    /// What happened between `before` and this.
    pub fn since(&self, before: &Stats) -> Delta {
        let mut bytes = BTreeMap::new();
        let mut calls = BTreeMap::new();
        for site in SITES.iter().chain(&[LEAK_SITE, CHURN_SITE]) {
            bytes.insert(site.to_string(), self.bytes(site) - before.bytes(site));
            calls.insert(site.to_string(), self.calls(site) - before.calls(site));
        }
        Delta {
            elapsed: self.elapsed() - before.elapsed(),
            bytes,
            calls,
        }
    }
}

/// The counts of alloc_sites over an interval.
#[derive(Clone, Debug)]
pub struct Delta {
    pub elapsed: Duration,
    pub bytes: BTreeMap<String, u64>,
    pub calls: BTreeMap<String, u64>,
}

impl Delta {
    pub fn bytes(&self, site: &str) -> u64 {
        self.bytes[site]
    }

    /// Bytes per second of `site` over the interval.
    pub fn rate(&self, site: &str) -> f64 {
        self.bytes(site) as f64 / self.elapsed.as_secs_f64()
    }

    /// Bytes per second of the non-leaking sites together.
    pub fn sites_rate(&self) -> f64 {
        SITES.iter().map(|site| self.rate(site)).sum()
    }
}
