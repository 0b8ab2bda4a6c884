//! Metrics of Python frames: the CPython processes found (by version and
//! outcome: an unknown version keeps native stacks), the code objects read
//! ahead, and those read to name frames ([`encode_names`], which the
//! symbolizer's collector calls with its own copy of the counts). How the
//! sampler's walks ended are BPF counters: the collect stage's.

use std::{
    fmt,
    sync::{Arc, atomic::Ordering::Relaxed},
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter},
};

use crate::python::{
    detect::DetectionStats, names::PythonNameStats, prefetch::PrefetchStats, reader::ReaderStats,
};
use crate::telemetry::{Telemetry, counter, float_counter, gauge, labelled_counters};

/// Registers the processes found (`detection`: None without Python frames
/// or tables, the family is then empty) and the code objects read ahead
/// (`prefetch`: None without Python frames, no family then).
pub fn register(
    telemetry: &mut Telemetry,
    detection: Option<Arc<DetectionStats>>,
    prefetch: Option<Arc<PrefetchStats>>,
) {
    telemetry.register_collector(PythonMetrics { detection, prefetch });
}

#[derive(Debug)]
struct PythonMetrics {
    detection: Option<Arc<DetectionStats>>,
    prefetch: Option<Arc<PrefetchStats>>,
}

impl Collector for PythonMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let out = &mut encoder;
        let processes = self
            .detection
            .as_ref()
            .map(|stats| stats.series())
            .unwrap_or_default();
        let mut family = out.encode_descriptor(
            "python_processes",
            "CPython processes found, by version and outcome (walked, unknown_version, unreadable, bad_debug_offsets, unsupported)",
            None,
            MetricType::Counter,
        )?;
        for (version, outcome, count) in &processes {
            let labels = [("version", version.as_str()), ("outcome", outcome)];
            ConstCounter::new(*count).encode(family.encode_family(&labels)?)?;
        }
        let Some(stats) = &self.prefetch else {
            return Ok(());
        };
        labelled_counters(
            out,
            "python_code_announcements",
            "Code objects the sampler announced for reading while their process lives, by outcome (read, failed, dropped: over the rate bounds or of a process not found yet; announced: all)",
            "outcome",
            &[
                ("announced", stats.announced.load(Relaxed)),
                ("read", stats.read.load(Relaxed)),
                ("failed", stats.failed.load(Relaxed)),
                ("dropped", stats.dropped.load(Relaxed)),
            ],
        )
    }
}

/// The code objects read to name frames, and the reader of processes'
/// memory those reads go through.
pub fn encode_names(out: &mut DescriptorEncoder, names: &PythonNameStats) -> fmt::Result {
    counter(
        out,
        "python_code_reads",
        "Code objects read from processes' memory to name Python frames",
        names.reads,
    )?;
    float_counter(
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
