//! The HTTP front door: pprof over axum.
//!
//! - `GET /pprof?pid=&tid=&comm=&seconds=&type=`: the last N seconds from the
//!   store, at once; `type` = cpu (default), offcpu or wall.
//! - `GET /debug/pprof/profile?seconds=N`: Go-compatible; blocks N seconds and
//!   returns that window only. `/debug/pprof/offcpu` and `/debug/pprof/wall`
//!   do the same for the off-CPU and wall-clock profiles (with `--off-cpu`).
//! - `GET /threads?pid=&seconds=`: CPU and off-CPU time per thread and process, JSON.
//! - `GET /metrics`: Prometheus metrics of the daemon itself.
//! - `GET /`, `/flamegraph.svg`, `/top`, `/folded`: views for people.
//! - The other Go profile endpoints answer 404 at once, so scrapers that ask
//!   for them by default (Parca) move on.
//!
//! Errors are one line of text/plain with `X-Go-Pprof: 1`, which is what
//! makes `go tool pprof` show the message.
//!
//! Connections are bounded in number and time ([`connections`]), served by
//! our own accept loop ([`accept`]), over TLS when configured ([`tls`]).

mod accept;
pub mod access;
mod allocations;
mod cgroup_filter;
pub mod connections;
mod handlers;
mod index;
pub mod listener;
pub mod metrics;
pub mod params;
mod recent;
pub mod scrape;
mod stream;
pub mod threads;
pub mod tls;
pub mod views;

use std::{future::Future, sync::Arc, time::Duration};

use axum::{
    Router,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{any, get},
};
use tokio::sync::watch;

pub use self::listener::{ListenAddress, Listener, bind};
use self::{
    access::AccessPolicy,
    connections::{ConnectionLimits, ConnectionTable},
    scrape::{ScrapeLimits, Scrapes},
    tls::Tls,
};
use crate::{kind::ProfileType, pipeline::Pipeline, telemetry::Telemetry};

/// What every handler shares. Cloned per request: it holds handles only.
#[derive(Clone)]
pub struct ServeState {
    pipeline: Arc<Pipeline>,
    max_seconds: u64,
    http_metrics: metrics::HttpMetrics,
    connections: Arc<ConnectionTable>,
    access: AccessPolicy,
    tls: Option<Arc<Tls>>,
    scrapes: Arc<Scrapes>,
    /// Every stage's metrics and serve's own, for `/metrics`.
    telemetry: Arc<Telemetry>,
    /// Becomes true when the server starts shutting down, so that blocking
    /// profile requests return early instead of holding up the exit.
    stopping: watch::Receiver<bool>,
}

impl ServeState {
    /// `retention` bounds the `seconds` a request may ask for; `tls` (a
    /// TCP listener only) serves over TLS. Serve's own metrics join the
    /// stages' in `telemetry`, which `/metrics` encodes.
    pub fn new(
        pipeline: Arc<Pipeline>,
        retention: Duration,
        limits: ConnectionLimits,
        access: AccessPolicy,
        scrape_limits: ScrapeLimits,
        tls: Option<Arc<Tls>>,
        mut telemetry: Telemetry,
    ) -> Self {
        let (_, stopping) = watch::channel(false);
        let http_metrics = metrics::HttpMetrics::default();
        let connections = Arc::new(ConnectionTable::new(limits));
        let scrapes = Arc::new(Scrapes::new(scrape_limits));
        metrics::register(
            &mut telemetry,
            &http_metrics,
            metrics::ServeFigures {
                connections: connections.clone(),
                tls: tls.clone(),
                scrapes: scrapes.clone(),
            },
        );
        Self {
            pipeline,
            max_seconds: retention.as_secs().max(1),
            http_metrics,
            connections,
            access,
            tls,
            scrapes,
            telemetry: Arc::new(telemetry),
            stopping,
        }
    }
}

/// The routes, for [`serve`] (and for tests driving the router directly).
pub fn router(state: ServeState) -> Router {
    let mut router = Router::new().route("/pprof", get(handlers::pprof));
    for profile_type in ProfileType::ALL {
        router = router.route(
            profile_type.describe().go_path,
            handlers::go_endpoint(profile_type),
        );
    }
    router = router
        .route("/debug/pprof/heap", get(allocations::heap))
        .route("/threads", get(views::threads))
        .route("/metrics", get(metrics::metrics))
        .route("/", get(views::index))
        .route("/flamegraph.svg", get(views::flamegraph_svg))
        .route("/top", get(views::top_table))
        .route("/folded", get(views::folded_stacks));
    for name in handlers::UNSUPPORTED_GO_PROFILES {
        let path = format!("/debug/pprof/{name}");
        // A profile type that serves one of Go's paths takes it.
        if !ProfileType::ALL
            .iter()
            .any(|served| served.describe().go_path == path)
        {
            router = router.route(&path, any(handlers::unsupported));
        }
    }
    router
        .fallback(handlers::not_found)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            metrics::count_requests,
        ))
        .with_state(state)
}

/// Serves until `shutdown` resolves, then closes the connections waiting
/// for a request and lets in-flight requests finish (blocking profiles end
/// early with what they have). Dropping the future cuts every connection.
pub async fn serve(
    listener: Listener,
    mut state: ServeState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop, stopping) = watch::channel(false);
    state.stopping = stopping.clone();
    let connections = state.connections.clone();
    let access = state.access.clone();
    let tls = state.tls.clone();
    let signal = async move {
        shutdown.await;
        let _ = stop.send(true);
    };
    // The accept loop ends only once `stop` is sent.
    tokio::join!(
        signal,
        accept::run(listener, router(state), connections, access, tls, stopping)
    );
    Ok(())
}

/// A failed request: the status and the one line that explains it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    pub status: StatusCode,
    pub message: String,
    /// Seconds, for `Retry-After` (a busy server's 503).
    pub retry_after: Option<u64>,
}

impl HttpError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }
}

impl From<crate::store::StoreClosed> for HttpError {
    fn from(_: crate::store::StoreClosed) -> Self {
        HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "profilerd is shutting down")
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        // One line, whatever the message carried.
        let mut body = self.message.replace(['\r', '\n'], " ");
        body.push('\n');
        let mut response = (self.status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        headers.insert("x-go-pprof", HeaderValue::from_static("1"));
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        headers.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        response
    }
}
