//! Metrics of the sampler's own user-stack walk (`--unwind auto`): how each
//! walk ended, and the tables it reads (kernel memory, loads, evictions,
//! compile time).

use std::{fmt, sync::atomic::Ordering::Relaxed};

use profiler_common::Counter as BpfCounter;
use prometheus_client::encoding::DescriptorEncoder;

use super::{LOSS_REASONS, UnwindStats};
use crate::{
    collect::BpfCounters,
    telemetry::{counter, float_counter, gauge, labelled_counters, losses},
};

/// The table manager's numbers at scrape time.
#[derive(Clone, Debug, Default)]
struct TablesSnapshot {
    loaded: u64,
    failures: u64,
    evictions: u64,
    too_large: u64,
    compiles: u64,
    compile_seconds: f64,
    rows: u64,
    bytes: u64,
    bytes_allocated: u64,
    bytes_max: u64,
    processes: u64,
    inputs_dropped: u64,
    map_errors: u64,
    /// (uid label, reason, count): see [`LOSS_REASONS`].
    losses: Vec<(String, usize, u64)>,
}

impl TablesSnapshot {
    fn of(stats: &UnwindStats) -> Self {
        Self {
            loaded: stats.tables_loaded.load(Relaxed),
            failures: stats.table_failures.load(Relaxed),
            evictions: stats.evictions.load(Relaxed),
            too_large: stats.too_large.load(Relaxed),
            compiles: stats.compiles.load(Relaxed),
            compile_seconds: stats.compile_ns.load(Relaxed) as f64 / 1e9,
            rows: stats.rows_loaded.load(Relaxed),
            bytes: stats.bytes_used(),
            bytes_allocated: stats.bytes_allocated(),
            bytes_max: stats.bytes_max(),
            processes: stats.processes.load(Relaxed),
            inputs_dropped: stats.inputs_dropped.load(Relaxed),
            map_errors: stats.map_errors.load(Relaxed),
            losses: stats.losses().series(),
        }
    }
}

/// Walk ends always (zero in frame-pointer mode); tables only in auto mode.
pub fn encode(out: &mut DescriptorEncoder, bpf: &BpfCounters, tables: Option<&UnwindStats>) -> fmt::Result {
    let ends = [
        ("complete", BpfCounter::UnwindComplete),
        ("no_mapping", BpfCounter::UnwindNoMapping),
        ("no_frame_pointer", BpfCounter::UnwindNoFramePointer),
        ("unsupported_rule", BpfCounter::UnwindUnsupportedRule),
        ("read_fault", BpfCounter::UnwindReadFault),
        ("depth_limit", BpfCounter::UnwindDepthLimit),
        ("table_not_loaded", BpfCounter::UnwindTableNotLoaded),
    ]
    .map(|(label, counter)| (label, bpf.get(counter)));
    labelled_counters(
        out,
        "unwind_walks",
        "User-stack walks of the sampler's own unwinder, by how they ended",
        "end",
        &ends,
    )?;
    labelled_counters(
        out,
        "unwind_frames",
        "User frames the sampler's unwinder took, by method",
        "method",
        &[
            ("table", bpf.get(BpfCounter::UnwindTableFrames)),
            ("frame_pointer", bpf.get(BpfCounter::UnwindFramePointerFrames)),
        ],
    )?;
    match tables {
        Some(stats) => encode_tables(out, &TablesSnapshot::of(stats)),
        None => Ok(()),
    }
}

/// The table manager's own figures (auto mode only).
fn encode_tables(out: &mut DescriptorEncoder, tables: &TablesSnapshot) -> fmt::Result {
    counter(
        out,
        "unwind_tables_loaded",
        "Unwind tables loaded into the kernel",
        tables.loaded,
    )?;
    counter(
        out,
        "unwind_table_failures",
        "Files that got no unwind table (no CFI, unreadable, worker failure)",
        tables.failures,
    )?;
    counter(
        out,
        "unwind_table_evictions",
        "Unwind tables evicted to make room (least recently sampled first)",
        tables.evictions,
    )?;
    counter(
        out,
        "unwind_tables_too_large",
        "Unwind tables larger than the whole limit (unwind_table_memory_mb)",
        tables.too_large,
    )?;
    counter(
        out,
        "unwind_table_compiles",
        "Unwind tables compiled by the worker",
        tables.compiles,
    )?;
    float_counter(
        out,
        "unwind_table_compile_seconds",
        "Worker time spent compiling unwind tables",
        tables.compile_seconds,
    )?;
    gauge(
        out,
        "unwind_table_rows",
        "Unwind table rows loaded",
        tables.rows as i64,
    )?;
    gauge(
        out,
        "unwind_table_bytes",
        "Kernel memory holding loaded unwind tables",
        tables.bytes as i64,
    )?;
    gauge(
        out,
        "unwind_table_bytes_allocated",
        "Kernel memory of the unwind-table groups created so far (follows the largest load; kept once created)",
        tables.bytes_allocated as i64,
    )?;
    gauge(
        out,
        "unwind_table_bytes_max",
        "Kernel memory unwind tables may take at most (unwind_table_memory_mb)",
        tables.bytes_max as i64,
    )?;
    gauge(
        out,
        "unwind_processes",
        "Processes the table manager tracks",
        tables.processes as i64,
    )?;
    counter(
        out,
        "unwind_inputs_dropped",
        "Process notices the table manager could not take in time (those walk with frame pointers)",
        tables.inputs_dropped,
    )?;
    counter(
        out,
        "unwind_map_errors",
        "Failed writes to the unwind maps",
        tables.map_errors,
    )?;
    losses(
        out,
        "unwind_table_losses",
        "Unwind tables an owner lost, by uid (\"privileged\": root and unknown owners) and reason: evicted_own (by a \
         more useful table of the same owner), reclaimed (its owner was over its share: someone within theirs took \
         the room), refused (no room it may take: its own tables are more useful, everyone else's within their share)",
        &LOSS_REASONS,
        &tables.losses,
    )
}
