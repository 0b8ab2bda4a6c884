//! The endpoint handlers. None may panic on input: every failure is an
//! [`HttpError`] with one line naming what was wrong.

use std::time::{Duration, Instant};

use axum::{
    extract::{RawQuery, State},
    http::{StatusCode, Uri},
    response::Response,
};
use tokio::sync::watch;

use super::{
    HttpError, ServeState,
    access::Viewer,
    params::{self, Limits, ParamError, ProfileParams},
    pprof_response,
};
use crate::{
    pipeline::PipelineError,
    profile::{Profile, pprof},
    store::{Query, StoreClosed, Visible, Window},
};

/// Go profiles that a CPU profiler does not have; answered 404 at once.
pub(super) const UNSUPPORTED_GO_PROFILES: [&str; 7] = [
    "allocs",
    "heap",
    "block",
    "goroutine",
    "mutex",
    "threadcreate",
    "symbol",
];

/// How long a request waits for the samples taken up to its arrival. Past
/// it (the symbolizer busy with, say, a huge binary's debug info) it answers
/// with what the store already holds rather than stall.
const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// Largest pid + 1 on 64-bit Linux (PID_MAX_LIMIT), if pid_max cannot be read.
const PID_MAX_LIMIT: u32 = 1 << 22;

/// `GET /pprof`: the last `seconds` from the store, answered at once.
pub(super) async fn pprof(
    State(state): State<ServeState>,
    Viewer(visible): Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    let params = params::parse_pprof(query.as_deref(), &state.limits())?;
    let started = Instant::now();
    let profile = recent_profile(&state, params, visible).await?;
    let queried = started.elapsed();
    let samples = profile.total_samples();
    let body = encode(profile).await?;
    tracing::debug!(
        samples,
        bytes = body.len(),
        query_ms = queried.as_millis(),
        total_ms = started.elapsed().as_millis(),
        "GET /pprof"
    );
    Ok(pprof_response(body))
}

/// The profile of the last `params.seconds` seconds, including what was
/// sampled up to now, of the processes `visible` allows; 404 if a requested
/// pid neither runs nor has samples, as far as the caller may know.
pub(super) async fn recent_profile(
    state: &ServeState,
    mut params: ProfileParams,
    visible: Visible,
) -> Result<Profile, HttpError> {
    let now_ms = drain(state).await?;
    super::cgroup_filter::resolve(state, &mut params.filter, visible).await?;
    let window = Window::last(params.seconds, now_ms);
    for &pid in &params.filter.pids {
        let Err(reason) = process_runs(pid, visible) else {
            continue;
        };
        // A process that exited within the window still has its samples.
        let store = state.pipeline.store();
        if !store.has_pid(pid, window, visible).await.map_err(store_closed)? {
            return Err(HttpError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "{reason}, and it has no samples in the last {} seconds",
                    params.seconds
                ),
            ));
        }
    }
    let query = Query {
        window,
        filter: params.filter,
        visible,
    };
    state.pipeline.store().query(query).await.map_err(store_closed)
}

/// `GET /debug/pprof/profile`: blocks `seconds`, then returns exactly what
/// was sampled between the drains at either end.
pub(super) async fn go_profile(
    State(state): State<ServeState>,
    Viewer(visible): Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    let mut params = params::parse_go_profile(query.as_deref(), &state.limits())?;
    // Only a running process can be sampled in a window that starts now.
    if let Some(Err(reason)) = params
        .filter
        .pids
        .iter()
        .map(|&pid| process_runs(pid, visible))
        .find(Result::is_err)
    {
        return Err(HttpError::new(StatusCode::NOT_FOUND, reason));
    }
    let after_ms = drain(&state).await?;
    super::cgroup_filter::resolve(&state, &mut params.filter, visible).await?;
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(params.seconds)) => {}
        () = stopping(state.stopping.clone()) => {}
    }
    let until_ms = drain(&state).await?;
    let query = Query {
        window: Window::between_drains(after_ms, until_ms),
        filter: params.filter,
        visible,
    };
    let profile = state.pipeline.store().query(query).await.map_err(store_closed)?;
    Ok(pprof_response(encode(profile).await?))
}

/// Drains the sampler and returns the drain's time, or now if that takes
/// longer than [`DRAIN_WAIT`].
async fn drain(state: &ServeState) -> Result<u64, HttpError> {
    match tokio::time::timeout(DRAIN_WAIT, state.pipeline.drain_now()).await {
        Ok(drained) => drained.map_err(pipeline_stopped),
        Err(_) => {
            tracing::warn!("drain took over {DRAIN_WAIT:?}; answering with the samples already stored");
            Ok(crate::unix_now_ms())
        }
    }
}

/// The other Go profiles: not collected here.
pub(super) async fn unsupported(uri: Uri) -> HttpError {
    HttpError::new(
        StatusCode::NOT_FOUND,
        format!(
            "{}: profilerd serves CPU profiles only: /debug/pprof/profile?seconds=N or /pprof?pid=P&seconds=N",
            uri.path()
        ),
    )
}

pub(super) async fn not_found(uri: Uri) -> HttpError {
    HttpError::new(
        StatusCode::NOT_FOUND,
        format!(
            "no such endpoint {}; try / (an index), /pprof?pid=P&seconds=N or /debug/pprof/profile?seconds=N",
            params::Quoted::new(uri.path())
        ),
    )
}

impl ServeState {
    pub(super) fn limits(&self) -> Limits {
        Limits {
            pid_max: read_pid_max(),
            max_seconds: self.max_seconds,
        }
    }
}

/// Encoding and compressing take milliseconds to tens of milliseconds: off
/// the async workers, so other requests and the store keep moving.
async fn encode(profile: Profile) -> Result<Vec<u8>, HttpError> {
    let body = tokio::task::spawn_blocking(move || pprof::encode_gzip(&profile))
        .await
        .map_err(|err| {
            HttpError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("encoding the profile: {err}"),
            )
        })?
        .map_err(|err| {
            HttpError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("compressing the profile: {err}"),
            )
        })?;
    Ok(body)
}

/// Resolves once the server is shutting down.
async fn stopping(mut stopping: watch::Receiver<bool>) {
    if stopping.wait_for(|&stop| stop).await.is_err() && !*stopping.borrow() {
        // No server owns the sender (a router used on its own): never stops.
        std::future::pending::<()>().await;
    }
}

/// Ok if `pid` is a running process the caller may see; otherwise why not,
/// for the message. /proc also resolves thread ids, which are not processes.
/// A process the caller may not see is answered as one that does not run.
fn process_runs(pid: u32, visible: Visible) -> Result<(), String> {
    let not_running = || format!("pid: no process {pid} is running");
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Err(not_running());
    };
    let uid = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|uids| uids.split_whitespace().next())
        .and_then(|uid| uid.parse::<u32>().ok());
    if !visible.allows(uid) {
        return Err(not_running());
    }
    let tgid = status
        .lines()
        .find_map(|line| line.strip_prefix("Tgid:"))
        .and_then(|tgid| tgid.trim().parse::<u32>().ok());
    match tgid {
        Some(tgid) if tgid != pid => Err(format!(
            "pid: {pid} is a thread of process {tgid}, not a process (use tid={pid} or pid={tgid})"
        )),
        _ => Ok(()),
    }
}

fn read_pid_max() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(PID_MAX_LIMIT)
}

fn pipeline_stopped(_: PipelineError) -> HttpError {
    HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "profilerd is shutting down")
}

pub(super) fn store_closed(_: StoreClosed) -> HttpError {
    HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "profilerd is shutting down")
}

impl From<ParamError> for HttpError {
    fn from(error: ParamError) -> Self {
        let status = match error {
            ParamError::TooLong { .. } => StatusCode::URI_TOO_LONG,
            _ => StatusCode::BAD_REQUEST,
        };
        HttpError::new(status, error.to_string())
    }
}
