//! The collect stage's metrics: the sampler's BPF counters, the maps'
//! occupancy, the drains, the process snapshots, the open-file bound and
//! the unwind tables ([`super::unwind_tables::metrics`]).

use std::{
    fmt,
    sync::{Arc, atomic::Ordering::Relaxed},
    time::{Duration, Instant},
};

use profiler_common::Counter as BpfCounter;
use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};

use super::{
    BpfCounters, MapSizes, OpenFileStats, Refusal, WatcherStats,
    unwind_tables::{UnwindStats, metrics as unwinding},
};
use crate::telemetry::{
    Live, Telemetry, counter, float_counter, float_gauge, gauge, labelled_counters, labelled_gauges,
};

/// What the drain stage has done, published after every drain (in the
/// pipeline's status: the drain and symbolize threads update it).
#[derive(Clone, Debug, Default)]
pub struct DrainStatus {
    /// BPF counters as of the last drain.
    pub bpf: BpfCounters,
    pub drains: u64,
    pub last_drain: Duration,
    /// Map entries that could not be read or deleted.
    pub map_read_errors: u64,
    /// Off-CPU waits still going on at a drain whose stacks were gone by
    /// then: counted without their stacks.
    pub wait_stacks_lost: u64,
    /// Sampled threads' off-CPU made exact, summed over drains.
    pub off_cpu_exact: super::OffCpuExact,
    /// What the CPU ledger credited, summed over drains.
    pub cpu_credits: super::CpuCredits,
    /// Entries found in the counts, user-stack and kernel-stack maps at the last drain.
    pub map_entries: MapEntries,
    pub drain_seconds_total: f64,
    /// When the maps were last drained (liveness).
    pub last_drain_at: Option<Instant>,
}

/// Occupancy of one buffer's maps when it was drained.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapEntries {
    pub counts: usize,
    pub user_stacks: usize,
    pub kernel_stacks: usize,
}

/// Where the collect stage's figures are, handed over as the stage is built.
#[derive(Debug)]
pub struct CollectFigures {
    pub drain: Live<DrainStatus>,
    pub map_sizes: MapSizes,
    pub watcher: Arc<WatcherStats>,
    pub open_files: Arc<OpenFileStats>,
    /// `--unwind auto` only.
    pub unwind: Option<Arc<UnwindStats>>,
    /// Allocation tracing (`--unwind auto` only).
    pub allocations: Option<Arc<crate::collect::allocations::AllocationStats>>,
}

/// Registers the collect stage's collector.
pub fn register(telemetry: &mut Telemetry, figures: CollectFigures) {
    telemetry.register_collector(CollectMetrics(figures));
}

#[derive(Debug)]
struct CollectMetrics(CollectFigures);

impl Collector for CollectMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let figures = &self.0;
        let status = figures.drain.get();
        let out = &mut encoder;
        encode_sampler(out, &status.bpf)?;
        if let Some(allocations) = &figures.allocations {
            encode_allocations(out, allocations)?;
        }
        encode_drains(out, &status, figures.map_sizes)?;
        counter(
            out,
            "process_snapshots",
            "Mappings snapshots taken when processes were first sampled",
            figures.watcher.snapshots.load(Relaxed),
        )?;
        counter(
            out,
            "process_snapshot_failures",
            "Processes gone or unreadable before their mappings could be read",
            figures.watcher.snapshot_failures.load(Relaxed),
        )?;
        let age = status.last_drain_at.map_or(-1.0, |at| at.elapsed().as_secs_f64());
        float_gauge(
            out,
            "last_drain_age_seconds",
            "Seconds since the BPF maps were last drained (-1: not yet)",
            age,
        )?;
        encode_open_files(out, &figures.open_files)?;
        unwinding::encode(out, &status.bpf, figures.unwind.as_deref())?;
        encode_python_walks(out, &status.bpf)
    }
}

fn encode_sampler(out: &mut DescriptorEncoder, bpf: &BpfCounters) -> fmt::Result {
    counter(
        out,
        "samples",
        "Samples taken by the BPF sampler (all CPUs)",
        bpf.get(BpfCounter::Samples),
    )?;
    counter(
        out,
        "idle_samples",
        "Samples of the idle task, not recorded",
        bpf.get(BpfCounter::Idle),
    )?;
    let reasons: Vec<_> = BpfCounter::ALL
        .iter()
        .filter(|c| c.is_error())
        .map(|&c| (c.name(), bpf.get(c)))
        .collect();
    labelled_counters(
        out,
        "samples_lost",
        "Samples and off-CPU waits lost or degraded in BPF, by reason (see profiler-common's Counter; off_cpu_* reasons are waits)",
        "reason",
        &reasons,
    )?;
    let events: Vec<_> = BpfCounter::ALL
        .iter()
        .filter(|c| !c.is_error() && !matches!(c, BpfCounter::Samples | BpfCounter::Idle))
        .map(|&c| (c.name(), bpf.get(c)))
        .collect();
    labelled_counters(
        out,
        "sampler_events",
        "Normal sampler events (no data lost): unwinding outcomes, and with --off-cpu the context switches recorded (off_cpu_recorded_switches: all, or sampled under --off-cpu-sample-every and --off-cpu-budget), dropped as shorter than the minimum (off_cpu_short) and recorded (off_cpu_waits)",
        "event",
        &events,
    )
}

fn encode_drains(out: &mut DescriptorEncoder, status: &DrainStatus, sizes: MapSizes) -> fmt::Result {
    let entries = status.map_entries;
    labelled_gauges(
        out,
        "map_entries",
        "Entries in a BPF map when its buffer was last drained",
        "map",
        &[
            ("counts", entries.counts as i64),
            ("user_stacks", entries.user_stacks as i64),
            ("kernel_stacks", entries.kernel_stacks as i64),
        ],
    )?;
    labelled_gauges(
        out,
        "map_capacity",
        "Capacity of a BPF map (per buffer)",
        "map",
        &[
            ("counts", i64::from(sizes.counts)),
            ("user_stacks", i64::from(sizes.user_stacks)),
            ("kernel_stacks", i64::from(sizes.kernel_stacks)),
        ],
    )?;
    counter(out, "drains", "Drains of the BPF maps", status.drains)?;
    float_counter(
        out,
        "drain_seconds",
        "Time spent draining the BPF maps",
        status.drain_seconds_total,
    )?;
    counter(
        out,
        "map_read_errors",
        "BPF map entries that could not be read or deleted",
        status.map_read_errors,
    )?;
    counter(
        out,
        "off_cpu_wait_stacks_lost",
        "Off-CPU waits still going on at a drain whose stacks were gone: counted without their stacks",
        status.wait_stacks_lost,
    )?;
    counter(
        out,
        "off_cpu_threads_made_exact",
        "Threads (at each drain) whose sampled off-CPU waits, many enough, were scaled to the kernel's count of their time off CPU",
        status.off_cpu_exact.threads,
    )?;
    counter(
        out,
        "off_cpu_exact_unread",
        "Threads (at each drain) with sampled waits whose time off CPU could not be read (exited ones included): their waits keep their weights",
        status.off_cpu_exact.unread,
    )?;
    counter(
        out,
        "off_cpu_exact_capped",
        "Threads (at each drain) with sampled waits left weighted: more than a drain reads (256)",
        status.off_cpu_exact.capped,
    )?;
    encode_cpu_credits(out, &status.cpu_credits)
}

/// The CPU ledger (collect/thread_cpu.rs): CPU threads used where no
/// sample landed, credited at the drains.
fn encode_cpu_credits(out: &mut DescriptorEncoder, credits: &super::CpuCredits) -> fmt::Result {
    let seconds = |ns: u64| ns as f64 / 1e9;
    labelled_counters(
        out,
        "thread_cpu_credited_seconds",
        "CPU time the drains credited to threads beyond their samples (added), taken off samples that carried what an earlier drain credited (taken_back), added without any stack of the thread (unplaced, under [cpu between samples]), or that samples carried beyond what there was to take back (excess)",
        "action",
        &[
            ("added", seconds(credits.added_ns)),
            ("taken_back", seconds(credits.taken_back_ns)),
            ("unplaced", seconds(credits.unplaced_ns)),
            ("excess", seconds(credits.excess_ns)),
        ],
    )?;
    float_counter(
        out,
        "thread_cpu_ledger_seconds",
        "CPU time the drains spent reading threads' CPU times and crediting them",
        seconds(credits.cost_ns),
    )?;
    counter(
        out,
        "thread_cpu_reads",
        "Threads whose CPU time a drain read from /proc",
        credits.threads_read,
    )?;
    counter(
        out,
        "thread_cpu_processes_unfollowed",
        "Sampled processes whose threads' CPU was not followed between samples: the bound on threads followed was reached",
        credits.processes_unfollowed,
    )?;
    counter(
        out,
        "thread_cpu_exits_unrecorded",
        "Followed threads gone without an exit record: their last CPU is what their samples said",
        credits.exits_unrecorded,
    )
}

/// The bound on descriptors held for mapped files (shared by the process
/// watcher and the symbolizer; the addresses it left unresolved are the
/// symbolizer's `mapped_files_closed_addresses`).
fn encode_open_files(out: &mut DescriptorEncoder, files: &OpenFileStats) -> fmt::Result {
    gauge(
        out,
        "mapped_files_open",
        "Descriptors held for mapped files",
        files.open.load(Relaxed) as i64,
    )?;
    gauge(
        out,
        "mapped_files_open_max",
        "Bound on descriptors held for mapped files",
        files.max_open.load(Relaxed) as i64,
    )?;
    counter(
        out,
        "mapped_files_opened",
        "Mapped files opened",
        files.opened.load(Relaxed),
    )?;
    counter(
        out,
        "mapped_files_evicted",
        "Mapped files closed to stay within the bound (least recently used first)",
        files.evicted.load(Relaxed),
    )?;
    counter(
        out,
        "mapped_files_reopened",
        "Closed files opened again through their still-running process's mapping",
        files.reopened.load(Relaxed),
    )?;
    let refused = Refusal::ALL.map(|reason| (reason.name(), files.refused(reason)));
    labelled_counters(
        out,
        "mapped_files_refused",
        "Mappings whose file was not opened, by reason",
        "reason",
        &refused,
    )
}

/// The sampler's walks of CPython threads (the names of their frames are
/// the symbolizer's, the processes found the `python` module's).
fn encode_python_walks(out: &mut DescriptorEncoder, bpf: &BpfCounters) -> fmt::Result {
    let ends = [
        ("complete", BpfCounter::PythonComplete),
        ("depth_limit", BpfCounter::PythonDepthLimit),
        ("read_fault", BpfCounter::PythonReadFault),
        ("invalid", BpfCounter::PythonInvalid),
        ("no_thread_state", BpfCounter::PythonNoThreadState),
    ]
    .map(|(label, counter)| (label, bpf.get(counter)));
    labelled_counters(
        out,
        "python_walks",
        "Walks of a CPython thread's frames (stacks that met the eval loop), by how they ended",
        "end",
        &ends,
    )?;
    counter(
        out,
        "python_frames",
        "Python frames the sampler recorded",
        bpf.get(BpfCounter::PythonFrames),
    )
}

/// Allocation tracing: windows started and refused, processes cut off at
/// their budget, processes traced now.
fn encode_allocations(
    out: &mut DescriptorEncoder,
    stats: &crate::collect::allocations::AllocationStats,
) -> fmt::Result {
    counter(
        out,
        "alloc_traces_started",
        "Processes whose allocations began to be traced",
        stats.started.load(Relaxed),
    )?;
    counter(
        out,
        "alloc_traces_refused",
        "Requests to trace a process's allocations that were refused (the answer said why)",
        stats.refused.load(Relaxed),
    )?;
    counter(
        out,
        "alloc_traces_over_budget",
        "Tracings stopped because the probes cost the process more than its budget",
        stats.over_budget.load(Relaxed),
    )?;
    gauge(
        out,
        "alloc_traced_processes",
        "Processes whose allocations are traced now",
        i64::try_from(stats.traced_now.load(Relaxed)).unwrap_or(i64::MAX),
    )
}
