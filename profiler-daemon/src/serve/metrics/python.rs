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
use crate::{collect::BpfCounters, python::names::PythonNameStats};

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
    )
}
