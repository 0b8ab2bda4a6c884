//! What a workload really ran, from the kernel's own accounting, and the
//! samples that CPU time is worth. A test expects that, not what wall-clock
//! time promises: on a busy machine a workload runs less than its wall time,
//! and a right profile of it has fewer samples.

use std::time::{Duration, Instant};

/// The highest count accepted, relative to the CPU time's worth: more samples
/// than the workload ran for is as wrong as too few.
pub const MAX_RATIO: f64 = 1.2;

/// CPU time a process has run so far: the sum of its threads' schedstat first
/// field (ns on CPU, not rounded to ticks). Threads that already exited are
/// not counted: use it for workloads whose threads live as long as they do.
pub fn cpu_time(pid: u32) -> Duration {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap_or_else(|err| panic!("listing the threads of pid {pid}: {err}"));
    let ns: u64 = tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .map(|stat| {
            stat.split_whitespace()
                .next()
                .and_then(|ns| ns.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("pid {pid}: schedstat without a first field: {stat:?}"))
        })
        .sum();
    Duration::from_nanos(ns)
}

/// The CPU time some processes run between [`CpuMeter::start`] and
/// [`CpuMeter::stop`]: read both at the moments the profile's window begins
/// and ends.
pub struct CpuMeter {
    pids: Vec<u32>,
    start: Duration,
}

impl CpuMeter {
    pub fn start(pids: &[u32]) -> Self {
        Self {
            pids: pids.to_vec(),
            start: pids.iter().map(|&pid| cpu_time(pid)).sum(),
        }
    }

    /// The CPU time run since [`CpuMeter::start`], still measuring.
    pub fn so_far(&self) -> Duration {
        let now: Duration = self.pids.iter().map(|&pid| cpu_time(pid)).sum();
        now.saturating_sub(self.start)
    }

    pub fn stop(self) -> Duration {
        let end: Duration = self.pids.iter().map(|&pid| cpu_time(pid)).sum();
        end.saturating_sub(self.start)
    }
}

/// How long a test lets a workload take to get the CPU time it asked for:
/// on a loaded machine that is longer than the CPU time, and bounded.
pub const RUN_LIMIT: Duration = Duration::from_secs(60);

/// Lets `pid` run until it has used `cpu` more CPU time than at the call, or
/// [`RUN_LIMIT`] of wall time has passed; returns the CPU time it used. A
/// test waits for what the workload ran, not for a wall time that only
/// promises it: on a busy machine the same answer then holds.
pub fn run_for(pid: u32, cpu: Duration) -> Duration {
    let start = cpu_time(pid);
    let deadline = Instant::now() + RUN_LIMIT;
    loop {
        let ran = cpu_time(pid).saturating_sub(start);
        let now = Instant::now();
        if ran >= cpu || now >= deadline {
            return ran;
        }
        // Never more than what is left to run: it cannot finish sooner.
        std::thread::sleep((cpu - ran).min(deadline - now).max(Duration::from_millis(10)));
    }
}

/// The samples `cpu` of CPU time is worth at `frequency` Hz.
#[derive(Clone, Copy, Debug)]
pub struct Expected {
    pub cpu: Duration,
    pub frequency: u64,
}

impl Expected {
    pub fn new(cpu: Duration, frequency: u64) -> Self {
        Self { cpu, frequency }
    }

    pub fn samples(&self) -> f64 {
        self.cpu.as_secs_f64() * self.frequency as f64
    }

    /// Panics unless `got` is between `min_ratio` and [`MAX_RATIO`] times the
    /// expected count. Below `floor` expected samples the check would prove
    /// nothing, so that fails too, saying the workload was starved.
    pub fn check(&self, what: &str, got: u64, min_ratio: f64, floor: u64) {
        let expected = self.samples();
        eprintln!(
            "{what}: {got} samples, {expected:.0} expected ({:.3} s CPU at {} Hz, ratio {:.2})",
            self.cpu.as_secs_f64(),
            self.frequency,
            got as f64 / expected.max(1.0)
        );
        assert!(
            expected >= floor as f64,
            "{what}: the workload ran only {:.3} s of CPU ({expected:.0} samples' worth at {} Hz, \
             at least {floor} needed): the machine starved it; the test proves nothing like this",
            self.cpu.as_secs_f64(),
            self.frequency
        );
        let (low, high) = (expected * min_ratio, expected * MAX_RATIO);
        assert!(
            (low..=high).contains(&(got as f64)),
            "{what}: expected {expected:.0} samples ({:.3} s of CPU at {} Hz; {low:.0} to {high:.0} accepted), got {got}",
            self.cpu.as_secs_f64(),
            self.frequency
        );
    }
}

/// Stops a process (SIGSTOP) and waits until the kernel says it is stopped,
/// so its CPU time no longer moves.
pub fn pause(pid: u32) {
    signal(pid, libc::SIGSTOP);
    wait_for_state(pid, |state| state == 'T', "stopped");
}

/// Lets a paused process run again.
pub fn resume(pid: u32) {
    signal(pid, libc::SIGCONT);
    wait_for_state(pid, |state| state != 'T', "running again");
}

pub(crate) fn signal(pid: u32, signal: i32) {
    let pid = i32::try_from(pid).unwrap_or_else(|_| panic!("pid {pid} out of range"));
    // SAFETY: kill(2) takes no pointers; the pid is a child of this test,
    // not reaped yet, so it cannot name another process.
    let rc = unsafe { libc::kill(pid, signal) };
    assert!(
        rc == 0,
        "kill({pid}, {signal}): {}",
        std::io::Error::last_os_error()
    );
}

fn wait_for_state(pid: u32, wanted: impl Fn(char) -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_else(|err| panic!("pid {pid} is gone: {err}"));
        // The state follows the parenthesised comm, which may hold anything.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .unwrap_or_else(|| panic!("pid {pid}: unreadable stat {stat:?}"));
        assert!(
            !matches!(state, 'Z' | 'X'),
            "pid {pid} exited before it was {what}: the workload should outlive this step"
        );
        if wanted(state) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "pid {pid} not {what} 10 s after the signal (state {state})"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}
