//! The accept loop and one task per connection, on hyper directly (axum's
//! own `serve` has no connection limit and no timeouts).
//!
//! hyper's `header_read_timeout` is not used: it restarts whenever a
//! keep-alive connection waits for its next request, so it would also be
//! the idle timeout. Each connection's task keeps its own deadlines instead,
//! from its [`Slot`](super::connections::Slot).

use std::{
    convert::Infallible,
    io,
    pin::{Pin, pin},
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::{Body, Bytes, HttpBody},
    extract::Request,
};
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::{sync::watch, task::JoinSet};
use tower_service::Service;

use super::{
    access::{AccessPolicy, Bearer, Caller, Peer, Unauthorized},
    connections::{Admission, CloseReason, ConnectionTable, RequestGuard},
    listener::{Accepted, Listener},
    stream::{Stream, Watched},
    tls::{self, Secured, Tls},
};

/// The most a request's head may take (request line and headers). hyper's
/// default is ~400 KiB: times the connection limit, a slow sender could pin
/// 200 MB. Go's default limit is 1 MiB, nginx's 32 KiB; our URLs are short.
const MAX_HEAD_BYTES: usize = 32 << 10;

/// Serves `router` on `listener` until `stopping` turns true, then closes
/// the connections that wait for a request and lets the others finish.
/// Dropping the returned future aborts every connection.
pub(super) async fn run(
    listener: Listener,
    router: Router,
    table: Arc<ConnectionTable>,
    policy: AccessPolicy,
    tls: Option<Arc<Tls>>,
    mut stopping: watch::Receiver<bool>,
) {
    let mut builder = http1::Builder::new();
    builder
        .header_read_timeout(None)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    let mut tasks = JoinSet::new();
    let mut errors = AcceptErrors::default();
    loop {
        let accepted = tokio::select! {
            _ = stopping.wait_for(|stop| *stop) => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let accepted = match accepted {
            Ok(accepted) => {
                errors.consecutive = 0;
                accepted
            }
            Err(err) => {
                table.count_accept_error();
                let pause = errors.on_error(&err);
                tokio::select! {
                    _ = stopping.wait_for(|stop| *stop) => break,
                    () = tokio::time::sleep(pause) => continue,
                }
            }
        };
        let admission = tokio::select! {
            _ = stopping.wait_for(|stop| *stop) => break,
            admission = table.admit() => admission,
        };
        // Refused: every connection has a request in flight. Dropping the
        // stream closes it at once.
        let Some(admission) = admission else { continue };
        let (stream, peer) = match accepted {
            Accepted::Tcp(stream, client) => {
                // The address the client reached: on a wildcard listener, not the listener's.
                let Ok(server) = stream.local_addr() else {
                    continue;
                };
                (Stream::Tcp(stream), Peer::Tcp { client, server })
            }
            Accepted::Unix(stream) => {
                let uid = stream.peer_cred().ok().map(|credentials| credentials.uid());
                (Stream::Unix(stream), Peer::Unix { uid })
            }
        };
        let conn = Connection {
            admission,
            stopping: stopping.clone(),
            peer,
            policy: policy.clone(),
            tls: tls.clone(),
        };
        tasks.spawn(conn.serve(stream, router.clone(), builder.clone()));
    }
    drop(listener);
    while tasks.join_next().await.is_some() {}
}

struct Connection {
    admission: Admission,
    stopping: watch::Receiver<bool>,
    peer: Peer,
    policy: AccessPolicy,
    /// On a TLS listener: the handshake comes first, under the same bounds.
    tls: Option<Arc<Tls>>,
}

impl Connection {
    async fn serve(mut self, stream: Stream, router: Router, builder: http1::Builder) {
        let limits = self.admission.table().limits();
        let slot = self.admission.slot().clone();
        // A verified client certificate: the connection sees every process.
        let (stream, certified) = match (self.tls.clone(), stream, self.peer) {
            (Some(tls), Stream::Tcp(tcp), Peer::Tcp { client, .. }) => {
                match tls::handshake(&tls, tcp, client, &slot, &limits, &mut self.stopping).await {
                    Ok(Secured { stream, certified }) => (Stream::Tls(Box::new(stream)), certified),
                    Err(closed_by) => {
                        if let Some(reason) = closed_by {
                            self.admission.table().count_closed(reason);
                        }
                        return;
                    }
                }
            }
            (_, stream, _) => (stream, false),
        };
        // Once per connection, at its first request (not at accept: an idle
        // connection costs no lookup and no blocking thread); the client's
        // socket cannot change hands while the connection lasts.
        let identity: Arc<tokio::sync::OnceCell<Caller>> = Arc::default();
        let (policy, peer) = (self.policy.clone(), self.peer);
        let io = TokioIo::new(Watched {
            stream,
            slot: slot.clone(),
        });
        let for_requests = slot.clone();
        let service = service_fn(move |request: Request<Incoming>| {
            let guard = for_requests.begin_request();
            let mut request = request.map(Body::new);
            let mut router = router.clone();
            let (identity, policy) = (identity.clone(), policy.clone());
            async move {
                mark_caller(&mut request, policy, &identity, peer, certified).await;
                let response = router.call(request).await?;
                Ok::<_, Infallible>(response.map(|body| Body::new(GuardedBody { body, _guard: guard })))
            }
        });
        // The connection (and its socket) is dropped at the end of this
        // block, before `self` gives the permit back.
        let closed_by = {
            let mut conn = pin!(builder.serve_connection(io, service));
            let mut draining = false;
            loop {
                let deadline = slot.deadline(&limits);
                tokio::select! {
                    result = conn.as_mut() => {
                        if let Err(err) = result {
                            tracing::debug!("HTTP connection ended: {err}");
                        }
                        break None;
                    }
                    () = sleep_until(deadline.map(|(at, _)| at)) => {
                        // Re-read: a request may have begun since.
                        match slot.deadline(&limits) {
                            Some((at, reason)) if at <= Instant::now() => break Some(reason),
                            _ => {}
                        }
                    }
                    () = slot.changed() => {
                        if slot.take_eviction() {
                            break Some(CloseReason::Evicted);
                        }
                    }
                    _ = self.stopping.wait_for(|stop| *stop), if !draining => {
                        if !slot.is_busy() {
                            break None;
                        }
                        // hyper finishes the response, then closes.
                        conn.as_mut().graceful_shutdown();
                        draining = true;
                    }
                }
            }
        };
        if let Some(reason) = closed_by {
            self.admission.table().count_closed(reason);
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// A response body that keeps its request in flight until hyper is done
/// with it (written out, or the connection gone).
struct GuardedBody {
    body: Body,
    _guard: RequestGuard,
}

impl HttpBody for GuardedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// Accept failures (EMFILE, ENFILE, ENOBUFS...): never fatal, never a
/// busy loop. Each one pauses the loop (doubling while they repeat), and
/// they are logged at most once per [`LOG_EVERY`].
#[derive(Default)]
struct AcceptErrors {
    consecutive: u32,
    last_logged: Option<Instant>,
    unlogged: u64,
}

const LOG_EVERY: Duration = Duration::from_secs(10);
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_secs(1);

impl AcceptErrors {
    /// Logs (if due) and returns how long to pause.
    fn on_error(&mut self, err: &io::Error) -> Duration {
        self.consecutive = self.consecutive.saturating_add(1);
        if self.last_logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
            match self.unlogged {
                0 => tracing::warn!("accepting an HTTP connection failed: {err}"),
                more => tracing::warn!(
                    "accepting an HTTP connection failed: {err} ({more} more since the last report)"
                ),
            }
            self.last_logged = Some(Instant::now());
            self.unlogged = 0;
        } else {
            self.unlogged += 1;
        }
        let doublings = self.consecutive.saturating_sub(1).min(10);
        (FIRST_PAUSE * 2u32.pow(doublings)).min(MAX_PAUSE)
    }
}

/// Marks `request` with who makes it: a token holder (a valid bearer
/// token, or a verified client certificate), else the user the kernel names
/// for the connection (looked up once, at its first request), or why it is
/// refused.
async fn mark_caller(
    request: &mut Request,
    policy: AccessPolicy,
    identity: &tokio::sync::OnceCell<Caller>,
    peer: Peer,
    certified: bool,
) {
    match policy.bearer(request.headers()) {
        Bearer::Valid => {
            request.extensions_mut().insert(Caller::token_holder());
        }
        Bearer::Invalid => {
            request
                .extensions_mut()
                .insert(Unauthorized("the bearer token is not this daemon's"));
        }
        Bearer::Absent if certified => {
            request.extensions_mut().insert(Caller::token_holder());
        }
        Bearer::Absent => {
            let needs_token = policy.has_token();
            let caller = identity
                .get_or_init(|| async move {
                    tokio::task::spawn_blocking(move || policy.identify(peer))
                        .await
                        .unwrap_or_else(|_| Caller::unknown("identifying the user failed"))
                })
                .await
                .clone();
            // With a token configured, a caller the kernel cannot name
            // (another machine) is asked for it.
            if needs_token && !caller.is_known() {
                request.extensions_mut().insert(Unauthorized(
                    "a bearer token is needed (Authorization: Bearer TOKEN)",
                ));
            }
            request.extensions_mut().insert(caller);
        }
    }
}
