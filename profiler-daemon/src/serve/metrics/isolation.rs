//! Metrics of what keeps hostile input at bay and the pipeline alive: the
//! symbolizer worker, the open-file bound, and the age of the last drain and
//! of the last symbolized batch.

use std::{fmt, time::Instant};

use prometheus_client::encoding::DescriptorEncoder;

use super::{counter, float_gauge, gauge, labelled_counters};
use crate::{
    collect::{OpenFileStats, Refusal},
    pipeline::PipelineStatus,
};

/// The open-file registry's numbers at scrape time.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenFilesSnapshot {
    open: u64,
    max_open: u64,
    opened: u64,
    evicted: u64,
    reopened: u64,
    refused: [(&'static str, u64); Refusal::ALL.len()],
}

impl OpenFilesSnapshot {
    pub fn of(stats: &OpenFileStats) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        Self {
            open: stats.open.load(Relaxed),
            max_open: stats.max_open.load(Relaxed),
            opened: stats.opened.load(Relaxed),
            evicted: stats.evicted.load(Relaxed),
            reopened: stats.reopened.load(Relaxed),
            refused: Refusal::ALL.map(|reason| (reason.name(), stats.refused(reason))),
        }
    }
}

pub fn encode(
    out: &mut DescriptorEncoder,
    status: &PipelineStatus,
    files: &OpenFilesSnapshot,
) -> fmt::Result {
    let now = Instant::now();
    let age = |at: Option<Instant>| at.map_or(-1.0, |at| now.duration_since(at).as_secs_f64());
    float_gauge(
        out,
        "last_drain_age_seconds",
        "Seconds since the BPF maps were last drained (-1: not yet)",
        age(status.last_drain_at),
    )?;
    float_gauge(
        out,
        "last_symbolized_batch_age_seconds",
        "Seconds since a drained batch was last symbolized and stored (-1: not yet)",
        age(status.last_symbolized_at),
    )?;
    let resolver = &status.symbolizer.resolver;
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
    gauge(
        out,
        "mapped_files_open",
        "Descriptors held for mapped files",
        files.open as i64,
    )?;
    gauge(
        out,
        "mapped_files_open_max",
        "Bound on descriptors held for mapped files",
        files.max_open as i64,
    )?;
    counter(out, "mapped_files_opened", "Mapped files opened", files.opened)?;
    counter(
        out,
        "mapped_files_evicted",
        "Mapped files closed to stay within the bound (least recently used first)",
        files.evicted,
    )?;
    counter(
        out,
        "mapped_files_reopened",
        "Closed files opened again through their still-running process's mapping",
        files.reopened,
    )?;
    counter(
        out,
        "mapped_files_closed_addresses",
        "Addresses left unresolved because the bound had closed their file and its process was gone",
        resolver.files_closed,
    )?;
    labelled_counters(
        out,
        "mapped_files_refused",
        "Mappings whose file was not opened, by reason",
        "reason",
        &files.refused,
    )
}
