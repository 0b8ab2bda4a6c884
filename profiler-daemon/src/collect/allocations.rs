//! Allocation tracing, on the drain thread (it owns the BPF object): the
//! probes of `profiler-ebpf/src/alloc.rs` attached to one process at a time
//! for the windows readers ask for, and taken off when the last one ends,
//! when the process exits or execs, or when tracing costs it more than its
//! budget. Nothing is probed while nobody asks; the programs themselves are
//! loaded (verified) at the first request, not at start-up.

mod allocator;
mod continuous;
mod requests;
mod selection;
mod state;

use std::{
    collections::HashMap,
    num::NonZeroU32,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use aya::{
    Ebpf,
    programs::{
        UProbe,
        uprobe::{UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};
use profiler_common::programs;

pub use allocator::{
    ALLOCATOR_NAMES, AllocatorReader, FileAllocator, JEMALLOC_EXTENDED, JEMALLOC_PREFIXES, is_allocator_name,
    op_of,
};
pub use requests::{
    AllocCommand, AllocError, AllocationLimits, AllocationStats, ContinuousTrace, TraceSummary,
};
pub use selection::{AllocTargets, running};
pub use state::{AllocationMapHandles, AllocationMaps};

use crate::procfs::ProcRoot;

struct Trace {
    /// The traced process's owner (real uid); None if unknown.
    owner: Option<u32>,
    readers: usize,
    until: Instant,
    links: Vec<(&'static str, UProbeLinkId)>,
    /// The process's CPU time and its probed calls at the last check.
    checked_cpu_ns: u64,
    checked_calls: u64,
    cut_short: Option<String>,
    summary: TraceSummary,
    /// Traced while the daemon runs (`alloc_trace_comms`), not only for
    /// windows; since this time (Unix ms).
    continuous: Option<u64>,
}

pub struct AllocationTracer {
    maps: AllocationMaps,
    loaded: bool,
    traces: HashMap<u32, Trace>,
    reader: Box<dyn AllocatorReader + Send>,
    proc_root: ProcRoot,
    limits: AllocationLimits,
    continuous: continuous::Targets,
    pub stats: Arc<AllocationStats>,
}

impl AllocationTracer {
    pub fn new(
        maps: AllocationMaps,
        proc_root: ProcRoot,
        limits: AllocationLimits,
        reader: Box<dyn AllocatorReader + Send>,
    ) -> Self {
        Self {
            maps,
            loaded: false,
            traces: HashMap::new(),
            reader,
            proc_root,
            limits,
            continuous: continuous::Targets::default(),
            stats: Arc::default(),
        }
    }

    /// Traces the processes `targets` names while the daemon runs.
    pub fn tracing_continuously(mut self, targets: &AllocTargets) -> Self {
        self.continuous = continuous::Targets::new(targets);
        self
    }

    pub fn handle(&mut self, ebpf: &mut Ebpf, command: AllocCommand) {
        match command {
            AllocCommand::Start { pid, seconds, reply } => {
                let started = self.start(ebpf, pid, seconds, false);
                if let Err(err) = &started {
                    self.stats.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(pid, "allocation tracing refused: {err}");
                }
                let _ = reply.send(started);
            }
            AllocCommand::End { pid, reply } => {
                let summary = self.end_one(ebpf, pid);
                let _ = reply.send(summary);
            }
            AllocCommand::Continuous { reply } => {
                let mut traced: Vec<ContinuousTrace> = self
                    .traces
                    .iter()
                    .filter_map(|(&pid, trace)| {
                        Some(ContinuousTrace {
                            pid,
                            since_ms: trace.continuous?,
                        })
                    })
                    .collect();
                traced.sort_unstable_by_key(|trace| trace.pid);
                let _ = reply.send(traced);
            }
        }
    }

    /// Traces `pid` for a reader's `seconds`, or while the daemon runs
    /// (`continuous`).
    fn start(
        &mut self,
        ebpf: &mut Ebpf,
        pid: u32,
        seconds: Duration,
        continuous: bool,
    ) -> Result<(), AllocError> {
        if let Some(trace) = self.traces.get_mut(&pid) {
            if continuous {
                trace.continuous.get_or_insert_with(crate::unix_now_ms);
                return Ok(());
            }
            let until = Instant::now() + seconds;
            trace.readers += 1;
            trace.until = trace.until.max(until);
            return Ok(());
        }
        if self.traces.len() >= self.limits.max_processes {
            return Err(AllocError::TooMany(self.limits.max_processes));
        }
        // One user's processes may take half the slots, not all: another's
        // (root's included) can still be traced. Root's own are not bounded.
        let owner = self.proc_root.real_uid(pid);
        if let Some(uid) = owner.filter(|&uid| uid != 0) {
            let limit = (self.limits.max_processes / 2).max(1);
            if self.traces.values().filter(|trace| trace.owner == owner).count() >= limit {
                return Err(AllocError::UserShare { uid, limit });
            }
        }
        let files = allocator::probed_files(&self.proc_root, pid, self.reader.as_mut())?;
        self.load(ebpf)
            .map_err(|reason| AllocError::Attach { pid, reason })?;
        self.maps.forget(pid);
        self.maps
            .trace(pid)
            .map_err(|reason| AllocError::Attach { pid, reason })?;
        let mut trace = Trace {
            owner,
            readers: usize::from(!continuous),
            // Set once attached: loading the programs first takes seconds.
            until: Instant::now(),
            links: Vec::new(),
            checked_cpu_ns: process_cpu_ns(&self.proc_root, pid).unwrap_or(0),
            checked_calls: 0,
            cut_short: None,
            summary: TraceSummary::default(),
            continuous: None,
        };
        let scope = UProbeScope::OneProcess(NonZeroU32::new(pid).ok_or(AllocError::NoProcess(pid))?);
        let mut attached = Ok(());
        // Returns first: a call whose entry is seen must have its return
        // seen too, or its thread would stay "inside" it for good.
        let order = files
            .iter()
            .map(|file| (programs::ALLOC_RETURN, file, file.returns()))
            .chain(
                files
                    .iter()
                    .map(|file| (programs::ALLOC_ENTER, file, file.entries.clone())),
            );
        for (name, file, points) in order {
            let points = points.iter().map(|&(offset, op)| UProbeAttachPoint {
                location: offset.into(),
                cookie: Some(op),
            });
            match uprobe(ebpf, name).and_then(|program| {
                program
                    .attach(points, &file.path, scope)
                    .map_err(|err| crate::error::Chain(&err).to_string())
            }) {
                Ok(link) => trace.links.push((name, link)),
                Err(reason) => attached = Err(reason),
            }
        }
        if let Err(reason) = attached {
            detach(ebpf, &mut trace);
            self.maps.untrace(pid);
            if !self.proc_root.exists(pid) {
                return Err(AllocError::NoProcess(pid));
            }
            return Err(AllocError::Attach { pid, reason });
        }
        trace.until = Instant::now() + seconds;
        trace.continuous = continuous.then(crate::unix_now_ms);
        self.stats.started.fetch_add(1, Ordering::Relaxed);
        self.stats.traced_now.fetch_add(1, Ordering::Relaxed);
        tracing::info!(pid, files = files.len(), "allocation tracing started");
        self.traces.insert(pid, trace);
        Ok(())
    }

    /// Loads the two programs, once (the verifier's work is paid at the
    /// first request, not at start-up).
    fn load(&mut self, ebpf: &mut Ebpf) -> Result<(), String> {
        if self.loaded {
            return Ok(());
        }
        let started = Instant::now();
        for name in [programs::ALLOC_ENTER, programs::ALLOC_RETURN] {
            let program_started = Instant::now();
            uprobe(ebpf, name)?
                .load()
                .map_err(|err| format!("loading {name}: {}", crate::error::Chain(&err)))?;
            tracing::debug!(took = ?program_started.elapsed(), "{name} loaded");
        }
        self.loaded = true;
        tracing::info!(took = ?started.elapsed(), "allocation probes loaded");
        Ok(())
    }

    /// One reader is done with `pid`: its summary; the last one ends the
    /// tracing.
    fn end_one(&mut self, ebpf: &mut Ebpf, pid: u32) -> TraceSummary {
        let Some(trace) = self.traces.get_mut(&pid) else {
            return TraceSummary {
                cut_short: Some("the tracing had ended".into()),
                ..TraceSummary::default()
            };
        };
        trace.readers = trace.readers.saturating_sub(1);
        if let Some(traced) = self.maps.figures(pid) {
            trace.summary = TraceSummary {
                calls: traced.calls,
                sampled: traced.sampled,
                freed: traced.freed,
                cut_short: trace.cut_short.clone(),
            };
        }
        let summary = trace.summary.clone();
        if trace.readers == 0 && trace.continuous.is_none() {
            self.end(ebpf, pid, None);
        }
        summary
    }

    /// Stops tracing `pid` (first its entry, so nothing more is recorded,
    /// then the probes) and forgets what the kernel held for it.
    fn end(&mut self, ebpf: &mut Ebpf, pid: u32, reason: Option<String>) {
        let Some(mut trace) = self.traces.remove(&pid) else {
            return;
        };
        self.maps.untrace(pid);
        detach(ebpf, &mut trace);
        self.maps.forget(pid);
        self.stats.traced_now.fetch_sub(1, Ordering::Relaxed);
        match reason {
            Some(reason) => tracing::warn!(pid, "allocation tracing ended early: {reason}"),
            None => tracing::info!(pid, "allocation tracing ended"),
        }
    }

    /// Called on every turn of the drain loop: ends the tracing of windows
    /// past their end (a reader that went away), of processes gone, and of
    /// those over their budget.
    pub fn tick(&mut self, ebpf: &mut Ebpf) {
        let now = Instant::now();
        let mut ending = Vec::new();
        for (&pid, trace) in &mut self.traces {
            // A reader asks to end at its window's end; a second later, it
            // is not coming. A process traced continuously ends with itself.
            let over = match trace.continuous {
                Some(_) => !self.proc_root.exists(pid),
                None => now > trace.until + Duration::from_secs(2),
            };
            if over {
                ending.push((pid, None));
                continue;
            }
            if trace.cut_short.is_some() {
                continue;
            }
            let Some(traced) = self.maps.figures(pid) else {
                trace.cut_short = Some("the process exited or executed another program".into());
                ending.push((pid, trace.cut_short.clone()));
                continue;
            };
            trace.summary = TraceSummary {
                calls: traced.calls,
                sampled: traced.sampled,
                freed: traced.freed,
                cut_short: None,
            };
            let Some(cpu_ns) = process_cpu_ns(&self.proc_root, pid) else {
                continue;
            };
            let calls = traced.calls - trace.checked_calls.min(traced.calls);
            let cpu = cpu_ns.saturating_sub(trace.checked_cpu_ns);
            let cost = calls.saturating_mul(self.limits.cost_per_call_ns);
            // Judged over at least a quarter second of the process's CPU.
            if cpu >= 250_000_000 || cost >= 250_000_000 {
                if cost.saturating_mul(100) > cpu.saturating_mul(self.limits.budget_percent) {
                    let reason = format!(
                        "the probes cost an estimated {:.1}% of the process's CPU ({calls} calls in {:.2} s of CPU), over the budget of {}% (allocations.budget_percent)",
                        cost as f64 * 100.0 / cpu.max(1) as f64,
                        cpu as f64 / 1e9,
                        self.limits.budget_percent
                    );
                    self.stats.over_budget.fetch_add(1, Ordering::Relaxed);
                    trace.cut_short = Some(reason.clone());
                    trace.summary.cut_short = Some(reason.clone());
                    // The probes go now; the readers still get their summary.
                    self.maps.untrace(pid);
                    detach(ebpf, trace);
                    tracing::warn!(pid, "allocation tracing stopped: {reason}");
                    continue;
                }
                trace.checked_calls = traced.calls;
                trace.checked_cpu_ns = cpu_ns;
            }
        }
        for (pid, reason) in ending {
            self.end(ebpf, pid, reason);
        }
        self.scan(ebpf);
    }

    /// Ends every tracing (the daemon stops).
    pub fn end_all(&mut self, ebpf: &mut Ebpf) {
        let pids: Vec<u32> = self.traces.keys().copied().collect();
        for pid in pids {
            self.end(ebpf, pid, None);
        }
    }
}

fn uprobe<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut UProbe, String> {
    let program = ebpf
        .program_mut(name)
        .ok_or_else(|| format!("the BPF object has no program {name}"))?;
    program
        .try_into()
        .map_err(|err: aya::programs::ProgramError| format!("{name}: {err}"))
}

fn detach(ebpf: &mut Ebpf, trace: &mut Trace) {
    for (name, link) in trace.links.drain(..) {
        if let Ok(program) = uprobe(ebpf, name)
            && let Err(err) = program.detach(link)
        {
            tracing::warn!("detaching {name}: {err}");
        }
    }
}

/// The process's CPU time (user + system, all its threads), from /proc/PID/stat.
fn process_cpu_ns(proc: &ProcRoot, pid: u32) -> Option<u64> {
    let stat = proc.read(pid, "stat").ok()?;
    // After the command name's closing parenthesis: fields 3 onwards.
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    let hz = u64::try_from(hz).ok()?.max(1);
    Some(ticks * (1_000_000_000 / hz))
}
