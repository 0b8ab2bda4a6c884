//! `GET /metrics`: what the daemon is doing, in the Prometheus text format
//! 0.0.4 or OpenMetrics, as the request's `Accept` asks ([`exposition`]).
//!
//! Every stage registers its own metrics into the daemon's
//! [`Telemetry`] as it is built; this handler only encodes it. Serve's own
//! are registered here: the requests served (counted as they are), and the
//! connections, TLS handshakes and shared scrapes (read at scrape time).

mod exposition;
mod scrapes;
mod tls;

use std::{fmt, sync::Arc};

use axum::{
    extract::{MatchedPath, Request, State},
    http::HeaderMap,
    middleware::Next,
    response::Response,
};
use prometheus_client::{
    collector::Collector,
    encoding::DescriptorEncoder,
    metrics::{counter::Counter, family::Family},
};

use super::{
    HttpError, ServeState,
    connections::{CloseReason, ConnectionStats, ConnectionTable},
    scrape::Scrapes,
    tls::Tls,
};
use crate::telemetry::{Telemetry, counter, gauge, labelled_counters};

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
    let body = state.telemetry.encode().map_err(|err| {
        HttpError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {err}"),
        )
    })?;
    exposition::respond(&headers, body)
}

/// What serve's metrics read at scrape time: its connection table, TLS
/// (when configured) and shared scrapes.
pub(super) struct ServeFigures {
    pub connections: Arc<ConnectionTable>,
    pub tls: Option<Arc<Tls>>,
    pub scrapes: Arc<Scrapes>,
}

/// Registers serve's own metrics, after every stage's.
pub(super) fn register(telemetry: &mut Telemetry, http: &HttpMetrics, figures: ServeFigures) {
    // A registered metric: encoded before every collector, first on /metrics.
    telemetry.register(
        "http_requests",
        "HTTP requests served, by endpoint and status",
        http.requests.clone(),
    );
    telemetry.register_collector(ServeMetrics(figures));
}

struct ServeMetrics(ServeFigures);

impl fmt::Debug for ServeMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ServeMetrics")
    }
}

impl Collector for ServeMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let figures = &self.0;
        let out = &mut encoder;
        if let Some(tls) = &figures.tls {
            tls::encode(out, &tls.snapshot())?;
        }
        scrapes::encode(out, &figures.scrapes.stats())?;
        encode_connections(out, &figures.connections.stats())
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
