//! Processes traced while the daemon runs (`alloc_trace_pids`, `_units`,
//! `_comms`): looked for every few seconds, traced from then until they exit (or execute
//! another program, or pass their budget). Their heap is what they
//! allocated since and have not freed.

use std::{
    collections::HashMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use aya::Ebpf;

use super::{AllocationTracer, selection};
use crate::filter::Filter;

/// How often /proc is searched for the processes named.
const SCAN_EVERY: Duration = Duration::from_secs(5);
/// Processes whose tracing was refused, remembered (with the program they
/// ran) so as not to be asked again at every search (a Go program stays
/// one, until it executes another).
const MAX_PASSED: usize = 4096;

#[derive(Debug, Default)]
pub(super) struct Targets {
    filters: Vec<Filter>,
    last_scan: Option<Instant>,
    passed: HashMap<u32, Option<PathBuf>>,
}

impl Targets {
    pub(super) fn new(targets: &selection::AllocTargets) -> Self {
        Self {
            filters: targets.filters(),
            ..Self::default()
        }
    }
}

impl AllocationTracer {
    /// Starts tracing the processes named that are not yet traced.
    pub(super) fn scan(&mut self, ebpf: &mut Ebpf) {
        let targets = &mut self.continuous;
        if targets.filters.is_empty() || targets.last_scan.is_some_and(|at| at.elapsed() < SCAN_EVERY) {
            return;
        }
        targets.last_scan = Some(Instant::now());
        let traces = &self.traces;
        let passed = &self.continuous.passed;
        // The daemon's own allocations are not its business.
        let own = std::process::id();
        let proc_root = &self.proc_root;
        let known = |pid| {
            pid == own
                || traces.get(&pid).is_some_and(|trace| trace.continuous.is_some())
                || passed
                    .get(&pid)
                    .is_some_and(|program| *program == executable(proc_root, pid))
        };
        for pid in selection::running(&self.proc_root, &self.continuous.filters, known) {
            match self.start(ebpf, pid, Duration::ZERO, true) {
                Ok(()) => tracing::info!(pid, "traced while it runs"),
                // Room may come: asked again at the next search.
                Err(super::AllocError::TooMany(_) | super::AllocError::UserShare { .. }) => {}
                Err(err) => {
                    tracing::info!(pid, "not traced while it runs: {err}");
                    if self.continuous.passed.len() >= MAX_PASSED {
                        self.continuous.passed.clear();
                    }
                    let program = executable(&self.proc_root, pid);
                    self.continuous.passed.insert(pid, program);
                }
            }
        }
        let proc_root = &self.proc_root;
        self.continuous.passed.retain(|&pid, _| proc_root.exists(pid));
    }
}

/// The program `pid` runs (its executable's path), to tell an exec.
fn executable(proc_root: &crate::procfs::ProcRoot, pid: u32) -> Option<PathBuf> {
    std::fs::read_link(proc_root.file(pid, "exe")).ok()
}
