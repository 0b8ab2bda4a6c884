//! The symbolize stage's metrics: its caches and process table, the cgroups
//! it names, what keeps hostile input at bay (the worker process, the
//! quarantine, the debug links not followed, the perf maps refused), and the Python frames' names
//! (encoded by [`crate::python::metrics`], counted here).

use std::{
    fmt,
    time::{Duration, Instant},
};

use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};

use super::{ResolverStats, SymbolizerStats};
use crate::{
    cgroup::CgroupStats,
    python,
    telemetry::{Live, Telemetry, counter, float_counter, float_gauge, gauge, labelled_counters},
};

/// What the symbolize stage has done, published after every batch (in the
/// pipeline's status).
#[derive(Clone, Debug, Default)]
pub struct SymbolizeStatus {
    pub stats: SymbolizerStats,
    pub last_symbolize: Duration,
    pub symbolize_seconds_total: f64,
    /// When a batch was last symbolized (liveness).
    pub last_symbolized_at: Option<Instant>,
}

/// Registers the symbolize stage's collector; `status` reads its latest.
pub fn register(telemetry: &mut Telemetry, status: Live<SymbolizeStatus>) {
    telemetry.register_collector(SymbolizeMetrics(status));
}

#[derive(Debug)]
struct SymbolizeMetrics(Live<SymbolizeStatus>);

impl Collector for SymbolizeMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let status = self.0.get();
        let stats = &status.stats;
        let out = &mut encoder;
        float_counter(
            out,
            "symbolize_seconds",
            "Time spent symbolizing drained samples",
            status.symbolize_seconds_total,
        )?;
        encode_caches(out, stats)?;
        encode_cgroups(out, stats.cgroups)?;
        let age = status
            .last_symbolized_at
            .map_or(-1.0, |at| at.elapsed().as_secs_f64());
        float_gauge(
            out,
            "last_symbolized_batch_age_seconds",
            "Seconds since a drained batch was last symbolized and stored (-1: not yet)",
            age,
        )?;
        encode_isolation(out, &stats.resolver)?;
        encode_perf_maps(out, stats.perf_maps)?;
        python::metrics::encode_names(out, &stats.python)
    }
}

/// JIT code named from perf maps (hostile files: what was refused and why).
fn encode_perf_maps(out: &mut DescriptorEncoder, stats: super::PerfMapStats) -> fmt::Result {
    counter(
        out,
        "perf_map_reads",
        "Chunks of JIT perf maps (/tmp/perf-PID.map) read by the worker",
        stats.reads,
    )?;
    counter(
        out,
        "perf_maps_refused",
        "Perf maps not read: not a regular file, a symbolic link on the way, or not owned by the process's owner",
        stats.refused,
    )?;
    counter(
        out,
        "perf_map_bad_lines",
        "Perf map lines that named no symbol (bad numbers, absurd ranges, too long)",
        stats.bad_lines,
    )?;
    counter(
        out,
        "perf_maps_capped",
        "Perf maps read up to their bound (symbols or bytes per process): the rest is not read",
        stats.capped,
    )?;
    gauge(
        out,
        "perf_map_symbols",
        "JIT symbols held from perf maps",
        i64::try_from(stats.symbols).unwrap_or(i64::MAX),
    )
}

/// The symbol caches and the process table.
fn encode_caches(out: &mut DescriptorEncoder, stats: &SymbolizerStats) -> fmt::Result {
    let resolver = stats.resolver;
    counter(
        out,
        "symbol_cache_hits",
        "Addresses found in the symbol caches",
        resolver.cache_hits,
    )?;
    counter(
        out,
        "symbol_cache_misses",
        "Addresses that had to be symbolized",
        resolver.cache_misses,
    )?;
    counter(
        out,
        "symbol_stacks_reused",
        "Stacks taken whole from an earlier batch (every frame named, no JIT or Python frame): their addresses are not looked up again, nor counted in symbol_cache_hits",
        stats.stacks_reused,
    )?;
    counter(
        out,
        "symbol_unresolved",
        "Addresses no symbol was found for (kept as placeholders)",
        resolver.unresolved,
    )?;
    counter(
        out,
        "symbol_source_errors",
        "Binaries or kallsyms that could not be read, and runs of the kernel naming program that failed",
        resolver.source_errors + resolver.kernel.errors,
    )?;
    labelled_counters(
        out,
        "kernel_addresses_named",
        "Kernel addresses looked up, by where: the kernel's own lookup (a BPF program run on \
         demand) or /proc/kallsyms (where that program cannot run)",
        "by",
        &[
            ("kernel", resolver.kernel.by_kernel),
            ("kallsyms", resolver.kernel.by_kallsyms),
        ],
    )?;
    let processes = stats.processes;
    gauge(
        out,
        "processes_tracked",
        "Process instances whose mappings are known",
        processes.tracked as i64,
    )?;
    counter(
        out,
        "process_late_snapshots",
        "Mappings read at drain time, no early snapshot",
        processes.late_snapshots,
    )?;
    counter(
        out,
        "process_missing_snapshots",
        "Sampled processes whose mappings could not be read",
        processes.missing_snapshots,
    )?;
    counter(
        out,
        "process_refreshes",
        "Mappings re-read after an address fell outside them",
        processes.refreshes,
    )
}

/// Naming the samples' cgroups.
fn encode_cgroups(out: &mut DescriptorEncoder, stats: CgroupStats) -> fmt::Result {
    gauge(
        out,
        "cgroups_named",
        "Cgroups whose paths are known (removed ones included, within the memory bound)",
        i64::try_from(stats.known).unwrap_or(i64::MAX),
    )?;
    counter(
        out,
        "cgroup_walks",
        "Walks of the cgroup v2 hierarchy for ids no process announced",
        stats.walks,
    )?;
    counter(
        out,
        "cgroup_walks_truncated",
        "Walks stopped by their directory or depth bound",
        stats.walks_truncated,
    )?;
    counter(
        out,
        "cgroup_unresolved",
        "Sampled cgroup ids that could not be named (once per drain each); their samples have no cgroup label",
        stats.unresolved,
    )?;
    counter(
        out,
        "cgroup_names_evicted",
        "Cgroup names forgotten to stay within the memory bound",
        stats.evicted,
    )
}

/// What keeps hostile input at bay: the worker process, the quarantine,
/// the debug links not followed, the files the open-file bound closed.
fn encode_isolation(out: &mut DescriptorEncoder, resolver: &ResolverStats) -> fmt::Result {
    let worker = &resolver.worker;
    counter(
        out,
        "symbolizer_worker_requests",
        "Files sent to the symbolizer worker process",
        worker.requests,
    )?;
    labelled_counters(
        out,
        "symbolizer_worker_restarts",
        "Symbolizer workers killed and replaced, by reason",
        "reason",
        &[
            ("crashed", worker.restarts_crashed),
            ("deadline", worker.restarts_deadline),
            ("protocol", worker.restarts_protocol),
        ],
    )?;
    counter(
        out,
        "symbolizer_worker_spawn_failures",
        "Symbolizer workers that could not be started",
        worker.spawn_failures,
    )?;
    counter(
        out,
        "symbolizer_files_quarantined",
        "Files that brought the symbolizer worker down twice: their frames stay unresolved",
        worker.quarantined,
    )?;
    counter(
        out,
        "symbolizer_quarantine_skips",
        "Requests not sent to the worker because their file is quarantined",
        worker.quarantine_skips,
    )?;
    counter(
        out,
        "symbolizer_deferred_addresses",
        "Addresses left for a later batch because the batch's worker time was spent",
        resolver.deferred,
    )?;
    counter(
        out,
        "debug_links_refused",
        "Binaries whose own debug link was not followed (only system debug files, by build id)",
        resolver.debug_links_refused,
    )?;
    counter(
        out,
        "symbol_cache_files_replaced",
        "Cached files that changed on disk and replaced their entry",
        resolver.files_replaced,
    )?;
    counter(
        out,
        "mapped_files_closed_addresses",
        "Addresses left unresolved because the bound had closed their file and its process was gone",
        resolver.files_closed,
    )
}
