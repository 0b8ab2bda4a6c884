//! Processes traced while the daemon runs (`alloc_trace_comms`): found by
//! name every few seconds, traced from then until they exit (or execute
//! another program, or pass their budget). Their heap is what they
//! allocated since and have not freed.

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use aya::Ebpf;

use super::AllocationTracer;

/// How often /proc is searched for the processes named.
const SCAN_EVERY: Duration = Duration::from_secs(5);
/// Processes whose tracing was refused, remembered so as not to be asked
/// again at every search (a Go program stays one).
const MAX_PASSED: usize = 4096;

#[derive(Debug, Default)]
pub(super) struct Targets {
    comms: Vec<String>,
    last_scan: Option<Instant>,
    passed: HashSet<u32>,
}

impl Targets {
    pub(super) fn new(comms: Vec<String>) -> Self {
        Self {
            comms,
            ..Self::default()
        }
    }
}

impl AllocationTracer {
    /// Starts tracing the processes named that are not yet traced.
    pub(super) fn scan(&mut self, ebpf: &mut Ebpf) {
        let targets = &mut self.continuous;
        if targets.comms.is_empty() || targets.last_scan.is_some_and(|at| at.elapsed() < SCAN_EVERY) {
            return;
        }
        targets.last_scan = Some(Instant::now());
        let Ok(entries) = std::fs::read_dir(self.proc_root.path()) else {
            return;
        };
        let pids: Vec<u32> = entries
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
            .collect();
        for pid in pids {
            let known = self
                .traces
                .get(&pid)
                .is_some_and(|trace| trace.continuous.is_some());
            if known || self.continuous.passed.contains(&pid) {
                continue;
            }
            let Ok(comm) = self.proc_root.read(pid, "comm") else {
                continue;
            };
            if !self.continuous.comms.iter().any(|name| name == comm.trim_end()) {
                continue;
            }
            match self.start(ebpf, pid, Duration::ZERO, true) {
                Ok(()) => tracing::info!(pid, comm = comm.trim_end(), "traced while it runs"),
                // Room may come: asked again at the next search.
                Err(super::AllocError::TooMany(_) | super::AllocError::UserShare { .. }) => {}
                Err(err) => {
                    tracing::info!(pid, "not traced while it runs: {err}");
                    if self.continuous.passed.len() >= MAX_PASSED {
                        self.continuous.passed.clear();
                    }
                    self.continuous.passed.insert(pid);
                }
            }
        }
        let proc_root = &self.proc_root;
        self.continuous.passed.retain(|&pid| proc_root.exists(pid));
    }
}
