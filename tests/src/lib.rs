//! Test harness: runs real workloads under the real profilerd binary and reads
//! what it wrote. Everything here panics with a message saying what was expected.

pub mod allocations;
pub mod attacker;
pub mod capture;
pub mod cgroup;
pub mod chromium;
pub mod container;
pub mod cpu;
pub mod daemon;
pub mod elf;
pub mod elf_mutants;
pub mod faulty;
pub mod fleet;
pub mod hostile;
pub mod offcpu;
pub mod parca;
pub mod perf_oracle;
pub mod pki;
pub mod pprof;
pub mod promtool;
pub mod protowire;
pub mod pyroscope;
pub mod python;
pub mod rootfs;
pub mod stacks;
pub mod tls_daemon;
pub mod unwind;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Mutex, MutexGuard},
    time::Duration,
};

/// BPF tests measure CPU shares: they must not run alongside each other.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The profilerd binary built by `cargo build --release -p profiler-daemon`
/// (or $PROFILERD_BIN).
pub fn profilerd_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("PROFILERD_BIN") {
        return PathBuf::from(path);
    }
    built_bin(
        "profilerd",
        "cargo build --release -p profiler-daemon, or set PROFILERD_BIN",
    )
}

/// A binary of this build, `name` in the target directory above the test
/// binary (target/<profile>/deps/<test> -> target/<profile>/<name>); the
/// panic says to build it with `how`.
pub fn built_bin(name: &str, how: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join(name))
        .expect("a target directory above the test binary");
    assert!(
        bin.exists(),
        "{name} not found at {}: build it first ({how})",
        bin.display()
    );
    bin
}

/// A directory for test outputs that are worth keeping (screenshots, profiles).
pub fn artifacts_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("artifacts");
    std::fs::create_dir_all(&dir).expect("creating tests/artifacts");
    dir
}

/// A running workload, killed when dropped.
pub struct Workload {
    pub child: Child,
    pub name: String,
}

impl Workload {
    pub fn spawn(path: &str, args: &[&str]) -> Self {
        let child = Command::new(path)
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| panic!("starting workload {path}: {err}"));
        Self {
            child,
            name: path.rsplit('/').next().unwrap_or(path).to_owned(),
        }
    }

    /// Starts `path` under another name (its comm, at most 15 bytes, and so
    /// its service name when no systemd unit names it), through a symbolic
    /// link: a test that finds its workload by name must not count the
    /// same program run by a test in the suite's other lane.
    pub fn spawn_as(path: &str, name: &str, args: &[&str]) -> Self {
        let link = NameLink::new(path, name);
        let workload = Self::spawn(link.path(), args);
        // spawn returns once exec succeeded (the kernel holds the file:
        // dropping the link is safe), its comm the link's name soon after.
        assert_comm(workload.pid(), name);
        workload
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn wait(mut self) {
        let status = self.child.wait().expect("waiting for workload");
        assert!(status.success(), "workload {} failed: {status}", self.name);
    }

    /// Waits for the workload to succeed and returns the CPU time it ran in
    /// its whole life (user + system, from wait4).
    pub fn wait_cpu(self) -> Duration {
        let pid = self.child.id() as libc_pid;
        let name = self.name.clone();
        // wait4 reaps it behind std's back: drop must not kill or wait on a
        // pid that may be reused from now on.
        std::mem::forget(self);
        let (status, (_, cpu_seconds)) = wait_with_rusage(pid);
        assert!(status == 0, "workload {name} failed (wait status {status})");
        Duration::from_secs_f64(cpu_seconds)
    }

    /// CPU time it has run so far (see [`cpu::cpu_time`]).
    pub fn cpu_time(&self) -> Duration {
        cpu::cpu_time(self.pid())
    }

    /// Lets it run until it has used `cpu` more CPU time (see [`cpu::run_for`]).
    pub fn run_for(&self, cpu: Duration) -> Duration {
        cpu::run_for(self.pid(), cpu)
    }

    /// Runs it for `cpu` of CPU time, stops it and kills it: its whole life
    /// took `cpu` (a little more), however busy the machine. Returns the CPU
    /// time it ran, which is all it will ever run.
    pub fn run_to_end(mut self, cpu: Duration) -> Duration {
        self.run_for(cpu);
        self.pause();
        let ran = self.cpu_time();
        let _ = self.child.kill();
        let _ = self.child.wait();
        ran
    }

    /// SIGSTOP, returning once it is stopped: its CPU time stands still.
    pub fn pause(&self) {
        cpu::pause(self.pid());
    }

    pub fn resume(&self) {
        cpu::resume(self.pid());
    }
}

/// A symbolic link named `name` to `path`, in a directory of its own,
/// removed on drop: exec'd, it makes a process whose comm is `name`.
pub struct NameLink(PathBuf);

impl NameLink {
    pub fn new(path: impl AsRef<Path>, name: &str) -> Self {
        assert!(
            (1..=15).contains(&name.len()) && !name.contains('/'),
            "a comm is a file name of 1 to 15 bytes, not {name:?}"
        );
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("profilerd-name-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|err| panic!("creating {}: {err}", dir.display()));
        let link = dir.join(name);
        std::os::unix::fs::symlink(path.as_ref(), &link)
            .unwrap_or_else(|err| panic!("linking {} as {name}: {err}", path.as_ref().display()));
        Self(link)
    }

    pub fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 temp path")
    }
}

impl Drop for NameLink {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Panics unless process `pid` is named `name` (its /proc comm) within a
/// second: a parent resumes from spawn before the exec it waited for has
/// renamed the child.
pub fn assert_comm(pid: u32, name: &str) {
    let comm = || std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while comm().trim_end() != name && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(comm().trim_end(), name, "process {pid}'s name");
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One line of folded output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoldedLine {
    pub comm: String,
    /// Root first.
    pub frames: Vec<String>,
    pub count: u64,
}

impl FoldedLine {
    pub fn has_frame(&self, name: &str) -> bool {
        self.frames.iter().any(|frame| frame == name)
    }

    pub fn has_frame_containing(&self, needle: &str) -> bool {
        self.frames.iter().any(|frame| frame.contains(needle))
    }
}

pub fn parse_folded(text: &str) -> Vec<FoldedLine> {
    text.lines()
        .map(|line| {
            let (stack, count) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("folded line without a count: {line:?}"));
            let mut parts = stack.split(';');
            FoldedLine {
                comm: parts.next().unwrap_or_default().to_owned(),
                frames: parts.map(str::to_owned).collect(),
                count: count
                    .parse()
                    .unwrap_or_else(|_| panic!("folded line with a bad count: {line:?}")),
            }
        })
        .collect()
}

/// What `profilerd record` produced.
pub struct Recording {
    pub output: String,
    pub stderr: String,
    /// The `key=value` pairs of its counters summary line.
    pub counters: HashMap<String, u64>,
    /// Peak RSS of the profilerd process, KiB (from wait4).
    pub max_rss_kib: u64,
    pub cpu_seconds: f64,
}

impl Recording {
    pub fn folded(&self) -> Vec<FoldedLine> {
        parse_folded(&self.output)
    }

    pub fn counter(&self, name: &str) -> u64 {
        *self.counters.get(name).unwrap_or_else(|| {
            panic!(
                "counter {name} missing from profilerd's summary:\n{}",
                self.stderr
            )
        })
    }
}

/// Starts `profilerd record ARGS -o FILE`; call [`RecordRun::finish`] to wait.
pub struct RecordRun {
    child: Child,
    output: PathBuf,
    /// Reads its stderr as it comes (so we know when it samples) and
    /// returns all of it.
    stderr: Option<std::thread::JoinHandle<String>>,
}

/// What the recorder logs once its sampler is attached to every CPU.
const ATTACHED: &str = "sampler attached";

impl RecordRun {
    /// Returns once the sampler is attached: whatever runs from then on is sampled.
    pub fn start(args: &[&str]) -> Self {
        let output = std::env::temp_dir().join(format!(
            "profilerd-test-{}-{}.out",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let mut child = Command::new(profilerd_bin())
            .arg("record")
            .args(args)
            .arg("--output")
            .arg(&output)
            // Its log line that says the sampler is attached (record logs warnings only by default).
            .env("RUST_LOG", "warn,profilerd::collect::sampler=info")
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting profilerd record");
        let pipe = child.stderr.take().expect("record's stderr is piped");
        let (attached_tx, attached_rx) = std::sync::mpsc::channel();
        let stderr = std::thread::spawn(move || {
            use std::io::BufRead;
            let mut text = String::new();
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                if line.contains(ATTACHED) {
                    let _ = attached_tx.send(());
                }
                text.push_str(&line);
                text.push('\n');
            }
            text
        });
        let run = Self {
            child,
            output,
            stderr: Some(stderr),
        };
        // Loading BPF takes longer on a busy machine; a minute is a stall.
        if attached_rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let pid = run.pid();
            // Still loading or already dead (a zombie takes the signal too).
            cpu::signal(pid, libc::SIGKILL);
            let stderr = run.finish_unchecked().1;
            panic!("profilerd record (pid {pid}) never logged {ATTACHED:?}; stderr:\n{stderr}");
        }
        run
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Ends the recording now (SIGINT, as Ctrl-C): it drains and writes
    /// what it has. The window of a test is then the test's to choose.
    pub fn interrupt(&self) {
        cpu::signal(self.pid(), libc::SIGINT);
    }

    pub fn finish(self) -> Recording {
        let output_path = self.output.clone();
        let ((status, usage), stderr) = self.finish_unchecked();
        assert!(
            status == 0,
            "profilerd record failed (wait status {status}); it needs root and a loadable BPF program. stderr:\n{stderr}"
        );
        let output = std::fs::read_to_string(&output_path)
            .unwrap_or_else(|err| panic!("reading {}: {err}\nstderr:\n{stderr}", output_path.display()));
        let _ = std::fs::remove_file(&output_path);
        let counters = stderr
            .lines()
            .filter(|line| line.contains("bpf counters:"))
            .flat_map(|line| line.split_whitespace())
            .filter_map(|pair| pair.split_once('='))
            .filter_map(|(key, value)| Some((key.to_owned(), value.parse().ok()?)))
            .collect();
        Recording {
            output,
            stderr,
            counters,
            max_rss_kib: usage.0,
            cpu_seconds: usage.1,
        }
    }

    /// Waits for it to end: (wait status, (peak RSS KiB, CPU s)) and its stderr.
    fn finish_unchecked(mut self) -> ((i32, (u64, f64)), String) {
        let waited = wait_with_rusage(self.child.id() as libc_pid);
        let stderr = self
            .stderr
            .take()
            .and_then(|reader| reader.join().ok())
            .unwrap_or_default();
        // The Child was reaped by wait4 above; forget it so drop does not wait again.
        std::mem::forget(self.child);
        (waited, stderr)
    }
}

#[allow(non_camel_case_types)]
type libc_pid = i32;

/// wait4(2): exit status plus (peak RSS KiB, user+system CPU seconds).
fn wait_with_rusage(pid: libc_pid) -> (i32, (u64, f64)) {
    #[repr(C)]
    struct Timeval {
        sec: i64,
        usec: i64,
    }
    #[repr(C)]
    struct Rusage {
        utime: Timeval,
        stime: Timeval,
        maxrss: i64,
        rest: [i64; 13],
    }
    unsafe extern "C" {
        fn wait4(pid: i32, status: *mut i32, options: i32, rusage: *mut Rusage) -> i32;
    }
    let mut status = 0;
    let mut usage = Rusage {
        utime: Timeval { sec: 0, usec: 0 },
        stime: Timeval { sec: 0, usec: 0 },
        maxrss: 0,
        rest: [0; 13],
    };
    // SAFETY: valid pointers to initialised structs laid out as the kernel's.
    let rc = unsafe { wait4(pid, &mut status, 0, &mut usage) };
    assert!(
        rc == pid,
        "wait4({pid}) failed: {}",
        std::io::Error::last_os_error()
    );
    let cpu = usage.utime.sec as f64
        + usage.utime.usec as f64 / 1e6
        + usage.stime.sec as f64
        + usage.stime.usec as f64 / 1e6;
    (status, (usage.maxrss as u64, cpu))
}

/// Runs a whole recording: `profilerd record ARGS` while `during` runs.
pub fn record_while(args: &[&str], during: impl FnOnce(&RecordRun)) -> Recording {
    let run = RecordRun::start(args);
    during(&run);
    run.finish()
}

/// VmRSS of a process in KiB, if it still runs.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Sum of counts of the lines that satisfy `keep`.
pub fn count(lines: &[FoldedLine], keep: impl Fn(&FoldedLine) -> bool) -> u64 {
    lines
        .iter()
        .filter(|line| keep(line))
        .map(|line| line.count)
        .sum()
}

/// Thread id -> thread name of a running process, from /proc.
pub fn thread_names(pid: u32) -> HashMap<u32, String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap_or_else(|err| panic!("listing threads of {pid}: {err}"))
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let tid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(entry.path().join("comm")).ok()?;
            Some((tid, name.trim_end().to_owned()))
        })
        .collect()
}
