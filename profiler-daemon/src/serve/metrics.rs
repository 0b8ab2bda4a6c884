//! `GET /metrics`: what the daemon is doing, in the Prometheus text format
//! 0.0.4 or OpenMetrics, as the request's `Accept` asks ([`exposition`]).
//!
//! Most values are snapshots of counters kept elsewhere (the BPF maps, the
//! pipeline's status, the store), so they are encoded at scrape time by a
//! collector; only HTTP requests are counted here.

mod cgroups;
mod exposition;
mod isolation;
mod push;
mod python;
mod scrapes;
mod shares;
mod tls;
mod unwinding;

use std::fmt;

use axum::{
    extract::{MatchedPath, Request, State},
    http::HeaderMap,
    middleware::Next,
    response::Response,
};
use profiler_common::Counter as BpfCounter;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{
        MetricType,
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::ConstGauge,
    },
    registry::Registry,
};

use super::{
    HttpError, ServeState,
    connections::{CloseReason, ConnectionStats},
};
use crate::{collect::MapSizes, pipeline::PipelineStatus, store::StoreStats};

type RequestLabels = Vec<(&'static str, String)>;

/// Requests served, by endpoint and status. Shared by every request.
#[derive(Clone, Debug, Default)]
pub struct HttpMetrics {
    requests: Family<RequestLabels, Counter>,
}

/// Counts every request by its route (not its raw path: unbounded label
/// values would be a memory leak an attacker controls) and status.
pub(super) async fn count_requests(
    State(state): State<ServeState>,
    request: Request,
    next: Next,
) -> Response {
    let endpoint = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "other".to_owned(), |path| path.as_str().to_owned());
    let response = next.run(request).await;
    let labels = vec![
        ("endpoint", endpoint),
        ("status", response.status().as_u16().to_string()),
    ];
    state.http_metrics.requests.get_or_create(&labels).inc();
    response
}

pub(super) async fn metrics(
    State(state): State<ServeState>,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let store = state.pipeline.store().stats().await?;
    let watcher = state.pipeline.watcher_stats();
    let snapshot = Snapshot {
        status: state.pipeline.status(),
        store,
        map_sizes: state.pipeline.map_sizes(),
        snapshots: watcher.snapshots.load(std::sync::atomic::Ordering::Relaxed),
        snapshot_failures: watcher
            .snapshot_failures
            .load(std::sync::atomic::Ordering::Relaxed),
        open_files: isolation::OpenFilesSnapshot::of(state.pipeline.open_files()),
        unwind_tables: state.pipeline.unwind_stats().map(unwinding::TablesSnapshot::of),
        python_read_ahead: state.pipeline.prefetch_stats().map(|stats| {
            use std::sync::atomic::Ordering::Relaxed;
            [
                ("announced", stats.announced.load(Relaxed)),
                ("read", stats.read.load(Relaxed)),
                ("failed", stats.failed.load(Relaxed)),
                ("dropped", stats.dropped.load(Relaxed)),
            ]
        }),
        python_processes: state
            .pipeline
            .python_stats()
            .map(|stats| stats.series())
            .unwrap_or_default(),
        connections: state.connections.stats(),
        tls: state.tls.as_ref().map(|tls| tls.snapshot()),
        scrapes: state.scrapes.stats(),
        push: state.push.iter().map(|target| target.snapshot()).collect(),
    };
    let mut registry = Registry::with_prefix("profilerd");
    registry.register(
        "http_requests",
        "HTTP requests served, by endpoint and status",
        state.http_metrics.requests.clone(),
    );
    registry.register_collector(Box::new(snapshot));
    let mut body = String::new();
    prometheus_client::encoding::text::encode(&mut body, &registry).map_err(|err| {
        HttpError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {err}"),
        )
    })?;
    exposition::respond(&headers, body)
}

#[derive(Debug)]
struct Snapshot {
    status: PipelineStatus,
    store: StoreStats,
    map_sizes: MapSizes,
    snapshots: u64,
    snapshot_failures: u64,
    open_files: isolation::OpenFilesSnapshot,
    unwind_tables: Option<unwinding::TablesSnapshot>,
    /// (version, outcome, processes).
    python_processes: Vec<(String, &'static str, u64)>,
    /// Code objects announced by the sampler for reading ahead, by outcome.
    python_read_ahead: Option<[(&'static str, u64); 4]>,
    connections: ConnectionStats,
    /// With TLS only.
    tls: Option<super::tls::TlsSnapshot>,
    scrapes: crate::serve::scrape::ScrapeStats,
    push: Vec<crate::push::TargetSnapshot>,
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let status = &self.status;
        let bpf = &status.bpf;
        let out = &mut encoder;
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
            "Normal sampler events (no data lost): unwinding outcomes, and with --off-cpu the context switches seen (off_cpu_switches), waits not sampled (off_cpu_unsampled), dropped as shorter than the minimum (off_cpu_short) and recorded (off_cpu_waits)",
            "event",
            &events,
        )?;
        let entries = status.map_entries;
        let sizes = self.map_sizes;
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
        float_counter(
            out,
            "symbolize_seconds",
            "Time spent symbolizing drained samples",
            status.symbolize_seconds_total,
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
        let resolver = status.symbolizer.resolver;
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
            "symbol_unresolved",
            "Addresses no symbol was found for (kept as placeholders)",
            resolver.unresolved,
        )?;
        counter(
            out,
            "symbol_source_errors",
            "Binaries or kallsyms that could not be read",
            resolver.source_errors,
        )?;
        let processes = status.symbolizer.processes;
        gauge(
            out,
            "processes_tracked",
            "Process instances whose mappings are known",
            processes.tracked as i64,
        )?;
        counter(
            out,
            "process_snapshots",
            "Mappings snapshots taken when processes were first sampled",
            self.snapshots,
        )?;
        counter(
            out,
            "process_snapshot_failures",
            "Processes gone or unreadable before their mappings could be read",
            self.snapshot_failures,
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
        )?;
        cgroups::encode(out, status.symbolizer.cgroups)?;
        isolation::encode(out, status, &self.open_files)?;
        unwinding::encode(out, bpf, self.unwind_tables.as_ref())?;
        python::encode(out, bpf, &self.python_processes, status.symbolizer.python)?;
        if let Some(read_ahead) = &self.python_read_ahead {
            labelled_counters(
                out,
                "python_code_announcements",
                "Code objects the sampler announced for reading while their process lives, by outcome (read, failed, dropped: over the rate bounds or of a process not found yet; announced: all)",
                "outcome",
                read_ahead,
            )?;
        }
        let store = &self.store;
        gauge(
            out,
            "store_bytes",
            "Approximate memory held by the sample store",
            store.bytes as i64,
        )?;
        gauge(
            out,
            "store_buckets",
            "Buckets (drains) held by the sample store",
            store.buckets as i64,
        )?;
        gauge(
            out,
            "store_stacks",
            "Distinct stacks held by the sample store",
            store.stacks as i64,
        )?;
        labelled_counters(
            out,
            "store_samples",
            "Samples through the store, by fate",
            "fate",
            &[
                ("ingested", store.samples_ingested),
                ("expired", store.samples_expired),
                ("evicted", store.samples_evicted),
            ],
        )?;
        shares::encode_losses(
            out,
            "store_losses",
            "Samples an owner lost to the store's bound, by uid (\"privileged\": root and unknown owners) and reason: \
             over_share (its oldest, while over its share of a full store), store_full (the oldest drain, nobody over \
             their share), refused (no room left for it)",
            &crate::store::LOSS_REASONS,
            &store.losses.series(),
        )?;
        if let Some(snapshot) = &self.tls {
            tls::encode(out, snapshot)?;
        }
        scrapes::encode(out, &self.scrapes)?;
        push::encode(out, &self.push)?;
        encode_connections(out, &self.connections)
    }
}

fn encode_connections(out: &mut DescriptorEncoder, connections: &ConnectionStats) -> fmt::Result {
    gauge(
        out,
        "http_connections",
        "HTTP connections open",
        connections.open as i64,
    )?;
    gauge(
        out,
        "http_connections_max",
        "HTTP connections the daemon holds at most (http_max_connections)",
        connections.max as i64,
    )?;
    let closed: Vec<_> = CloseReason::ALL
        .iter()
        .zip(connections.closed)
        .map(|(reason, count)| (reason.label(), count))
        .collect();
    labelled_counters(
        out,
        "http_connections_closed",
        "HTTP connections closed by the daemon's bounds, by reason",
        "reason",
        &closed,
    )?;
    counter(
        out,
        "http_accept_errors",
        "Failed accepts of HTTP connections (e.g. out of descriptors)",
        connections.accept_errors,
    )
}

pub(super) fn counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> fmt::Result {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

pub(super) fn float_counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: f64,
) -> fmt::Result {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

pub(super) fn float_gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: f64,
) -> fmt::Result {
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

pub(super) fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: i64) -> fmt::Result {
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn labelled_gauges(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: &[(&str, i64)],
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (value_label, value) in values {
        let labels = [(label, *value_label)];
        ConstGauge::new(*value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

pub(super) fn labelled_counters(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: &[(&str, u64)],
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (value_label, value) in values {
        let labels = [(label, *value_label)];
        ConstCounter::new(*value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}
