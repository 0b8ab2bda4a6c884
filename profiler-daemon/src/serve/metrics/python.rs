//! Metrics of Python frames: how the sampler's walks of CPython threads
//! ended, the CPython processes found (by version and outcome: an unknown
//! version keeps native stacks), and the code objects read to name frames.

use std::fmt;

use profiler_common::Counter as BpfCounter;
use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter},
};

use super::{counter, gauge, labelled_counters};
use crate::{
    collect::BpfCounters,
    python::{names::PythonNameStats, reader::ReaderStats},
};

pub fn encode(
    out: &mut DescriptorEncoder,
    bpf: &BpfCounters,
    processes: &[(String, &'static str, u64)],
    names: PythonNameStats,
) -> fmt::Result {
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
    )?;
    let mut family = out.encode_descriptor(
        "python_processes",
        "CPython processes found, by version and outcome (walked, unknown_version, unreadable, bad_debug_offsets, unsupported)",
        None,
        MetricType::Counter,
    )?;
    for (version, outcome, count) in processes {
        let labels = [("version", version.as_str()), ("outcome", outcome)];
        ConstCounter::new(*count).encode(family.encode_family(&labels)?)?;
    }
    counter(
        out,
        "python_code_reads",
        "Code objects read from processes' memory to name Python frames",
        names.reads,
    )?;
    super::float_counter(
        out,
        "python_code_read_seconds",
        "Time the symbolizer spent reading code objects (and their names and line tables)",
        names.read_ns as f64 / 1e9,
    )?;
    counter(
        out,
        "python_code_read_errors",
        "Code objects that could not be read or were not code objects",
        names.read_errors,
    )?;
    counter(
        out,
        "python_code_key_mismatches",
        "Python frames whose code object changed at its address (not named)",
        names.key_mismatches,
    )?;
    counter(
        out,
        "python_code_evictions",
        "Code objects dropped from the names cache for its bounds",
        names.evictions,
    )?;
    gauge(
        out,
        "python_code_objects",
        "Code objects (and unreadable addresses) in the names cache",
        names.cached as i64,
    )?;
    encode_reader(out, &names.reader)
}

/// The reader of processes' memory, which bounds each read's time.
fn encode_reader(out: &mut DescriptorEncoder, reader: &ReaderStats) -> fmt::Result {
    counter(
        out,
        "python_memory_read_timeouts",
        "Reads of a process's memory that did not end within the deadline (each stalls its process)",
        reader.timeouts,
    )?;
    gauge(
        out,
        "python_stalled_processes",
        "Processes a read of whose memory blocked: their Python frames are not named until they exit",
        i64::try_from(reader.stalled_processes).unwrap_or(i64::MAX),
    )?;
    labelled_counters(
        out,
        "python_memory_reads_refused",
        "Reads of processes' memory refused without a system call: of a stalled process, or while too many reader threads are blocked",
        "reason",
        &[
            ("stalled", reader.refused_stalled),
            ("saturated", reader.refused_saturated),
        ],
    )?;
    counter(
        out,
        "python_memory_reads_not_started",
        "Reads of processes' memory the reader thread did not start within the deadline",
        reader.not_started,
    )?;
    gauge(
        out,
        "python_memory_readers_blocked",
        "Reader threads abandoned in a read of a process's memory that has not returned",
        i64::try_from(reader.abandoned_threads).unwrap_or(i64::MAX),
    )?;
    counter(
        out,
        "python_memory_reader_threads",
        "Reader threads started (the first and each taking over from a blocked one)",
        reader.threads_started,
    )
}
