//! What the unwinding tests share: a window in which the daemon and perf
//! (the oracle) sample the same running workloads, the CPU those workloads
//! ran in it, and the assertions on the share of stacks that hold a chain.

use std::{collections::HashMap, time::Duration};

use crate::{
    cpu::{CpuMeter, Expected},
    daemon::Daemon,
    elf, parse_folded,
    perf_oracle::{PerfProfile, PerfRecord},
    stacks::{Stack, Stacks},
};

/// How much CPU time a workload runs before its window opens: its start-up
/// (the dynamic loader, which never reaches main) and the daemon's first look
/// at its mappings (tables compiled and loaded) are over.
pub const WARM_UP: Duration = Duration::from_secs(2);

/// Lets `pids` run [`WARM_UP`] of CPU time each. In CPU time, not wall time:
/// on a busy machine the daemon, which loads their unwind tables meanwhile,
/// is as slowed as they are, and gets the longer wall time this takes.
pub fn warm_up(pids: &[u32]) {
    for &pid in pids {
        crate::cpu::run_for(pid, WARM_UP);
    }
}

/// perf's frequency: prime, so it does not beat with the SIGALRM
/// workload's 1 kHz timer, and ~3,000 samples for the oracle in 6 s.
pub const PERF_HZ: u32 = 499;

/// The CPU time each workload must run in the daemon's window: the floor
/// [`Window::daemon_of`] asks at 99 Hz (100 samples' worth) and a margin.
pub const MIN_CPU: Duration = Duration::from_millis(1200);

/// The longest a window grows to on a busy machine.
pub const MAX_SECONDS: u64 = 60;

/// What the daemon and perf saw of some processes over one window.
pub struct Window {
    /// The daemon's window: the seconds asked, or more on a busy machine.
    pub seconds: u64,
    /// CPU each process ran in the daemon's window.
    pub cpu: HashMap<u32, Duration>,
    /// The seconds perf recorded (those asked), and the CPU each process
    /// ran in them.
    pub perf_seconds: u64,
    pub perf_cpu: HashMap<u32, Duration>,
    /// The daemon's stacks of each process.
    pub daemon: HashMap<u32, Stacks>,
    /// perf's, if it ran.
    pub perf: Option<PerfProfile>,
}

impl Window {
    /// Samples `pids` for `seconds` with the daemon (and perf at [`PERF_HZ`]
    /// if `oracle`), then reads the daemon's /folded for the same window.
    pub fn observe(daemon: &Daemon, pids: &[u32], seconds: u64, oracle: bool) -> Self {
        // perf's own `seconds` begin once it has set up, which a busy machine
        // makes late: the CPU is measured over exactly the `seconds` the
        // daemon's window (the last `seconds` when asked) holds, not over
        // perf's start-up too.
        let perf = oracle.then(|| PerfRecord::start(pids, PERF_HZ, seconds));
        let meters: Vec<(u32, CpuMeter)> = pids.iter().map(|&pid| (pid, CpuMeter::start(&[pid]))).collect();
        std::thread::sleep(Duration::from_secs(seconds));
        let perf_cpu = meters.iter().map(|(pid, meter)| (*pid, meter.so_far())).collect();
        // A busy machine gives the workloads less CPU in those seconds than
        // the check needs to mean anything: the daemon's window grows, a whole
        // second at a time (it is asked for the last N seconds), until each
        // has run MIN_CPU.
        let mut window = seconds;
        while window < MAX_SECONDS && meters.iter().any(|(_, meter)| meter.so_far() < MIN_CPU) {
            std::thread::sleep(Duration::from_secs(1));
            window += 1;
        }
        let cpu = meters
            .into_iter()
            .map(|(pid, meter)| (pid, meter.stop()))
            .collect();
        let daemon_stacks = pids
            .iter()
            .map(|&pid| (pid, daemon_stacks(daemon, pid, window)))
            .collect();
        Self {
            seconds: window,
            cpu,
            perf_seconds: seconds,
            perf_cpu,
            daemon: daemon_stacks,
            perf: perf.map(|perf| perf.finish_recording().script()),
        }
    }

    /// The daemon's stacks of `pid`, after checking that their number is what
    /// the CPU it ran is worth at `frequency` Hz.
    pub fn daemon_of(&self, pid: u32, what: &str, frequency: u64) -> &Stacks {
        let stacks = &self.daemon[&pid];
        Expected::new(self.cpu[&pid], frequency).check(
            &format!("{what} (pid {pid}) in the daemon's last {} s", self.seconds),
            stacks.total(),
            0.8,
            100,
        );
        stacks
    }

    /// perf's stacks of `pid`, likewise checked against its CPU time (perf
    /// attaches a little after the window opens: 0.7).
    pub fn perf_of(&self, pid: u32, what: &str) -> Stacks {
        let perf = self.perf.as_ref().expect("this window ran perf");
        let stacks = perf.of(pid);
        Expected::new(self.perf_cpu[&pid], u64::from(PERF_HZ)).check(
            &format!("{what} (pid {pid}) in perf's {} s", self.perf_seconds),
            stacks.total(),
            0.7,
            300,
        );
        stacks
    }
}

/// The daemon's /folded stacks of `pid` over the last `seconds`.
pub fn daemon_stacks(daemon: &Daemon, pid: u32, seconds: u64) -> Stacks {
    let path = format!("/folded?pid={pid}&seconds={seconds}");
    let response = daemon.get(&path);
    assert_eq!(response.status, 200, "GET {path}: {}", response.text());
    Stacks::from_folded(&parse_folded(&response.text()))
}

/// A share of some samples that must reach a bar.
pub struct Bar<'a> {
    /// What is measured, for messages: "samples of cxx_sort".
    pub what: &'a str,
    /// The samples it is a share of.
    pub among: &'a dyn Fn(&Stack) -> bool,
    /// The chain (root first) the stacks must hold.
    pub chain: &'a [&'a str],
    pub min_percent: f64,
}

impl Bar<'_> {
    /// The share of [`Self::among`] samples holding the chain, and how many
    /// samples that is a share of.
    pub fn measure(&self, stacks: &Stacks) -> (f64, u64) {
        let among = stacks.filter(self.among);
        let chain = self.chain;
        (among.share(|stack| stack.has_chain(chain)), among.total())
    }

    /// Panics unless the oracle's stacks reach the bar: if perf cannot unwind
    /// the workload as expected, the workload is wrong, not the daemon.
    pub fn check_oracle(&self, perf: &Stacks) {
        self.check_as(
            perf,
            "perf --call-graph dwarf (the oracle: the workload itself is wrong)",
        );
    }

    pub fn check_daemon(&self, daemon: &Stacks) {
        self.check_as(daemon, "profilerd");
    }

    fn check_as(&self, stacks: &Stacks, source: &str) {
        let (share, total) = self.measure(stacks);
        eprintln!(
            "{source}: {share:.2}% of {total} {} hold {} ({:.2}% of all its samples reach main)",
            self.what,
            self.chain.join(" -> "),
            stacks.reaching_main()
        );
        // A handful is no measure of a percentage.
        assert!(
            total >= 50,
            "{source}: only {total} {} to measure (at least 50 needed); stacks:\n{}",
            self.what,
            stacks.offending(|_| false, 8)
        );
        let chain = self.chain;
        let among = stacks.filter(self.among);
        assert!(
            share >= self.min_percent,
            "{source}: expected >= {}% of {} to hold {} (root first), got {share:.2}% of {total}; \
             the most frequent stacks without it:\n{}",
            self.min_percent,
            self.what,
            chain.join(" -> "),
            among.offending(|stack| stack.has_chain(chain), 8)
        );
    }
}

/// Whether the code of `function` in `binary` sets up a frame pointer: it
/// moves %rsp to %rbp among its first instructions (GCC schedules others
/// around the `push %rbp`).
pub fn sets_up_frame_pointer(binary: &str, function: &str) -> bool {
    const PROLOGUE: usize = 32;
    let image = std::fs::read(binary).unwrap_or_else(|err| panic!("reading {binary}: {err}"));
    let at = elf::function_file_offset(&image, function) as usize;
    let code = image
        .get(at..at + PROLOGUE)
        .unwrap_or_else(|| panic!("{function} at {at:#x} in {binary}"));
    let mov_rsp_rbp = [0x48, 0x89, 0xe5];
    code.windows(3).any(|bytes| bytes == mov_rsp_rbp)
}

/// Panics unless every function in `functions` of `binary` is built as the
/// test needs it: with a frame pointer or without.
pub fn assert_frame_pointers(binary: &str, functions: &[&str], with: bool) {
    for function in functions {
        assert_eq!(
            sets_up_frame_pointer(binary, function),
            with,
            "{function} in {binary} should be built {} a frame pointer (tests/build.rs)",
            if with { "with" } else { "without" }
        );
    }
}
