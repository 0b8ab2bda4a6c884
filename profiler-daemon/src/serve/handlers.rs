//! The endpoint handlers. None may panic on input: every failure is an
//! [`HttpError`] with one line naming what was wrong.

use std::time::Duration;

use axum::{
    extract::{RawQuery, State},
    http::{StatusCode, Uri},
    response::{IntoResponse, Response},
};
use tokio::sync::watch;

use super::{
    HttpError, ServeState,
    access::{Scope, Viewer},
    params::{self, Limits, ParamError, ProfileParams, Span},
    scrape::{Format, key::ShareKey},
};
use crate::{
    kind::ProfileType,
    store::{StoreClosed, Visible, Window},
};

/// Go profiles that this profiler does not have; answered 404 at once.
/// `block` and `mutex` stay here with off-CPU on: Go's mean contention
/// events of its own runtime, not where threads sleep in the kernel.
pub(super) const UNSUPPORTED_GO_PROFILES: [&str; 7] = [
    "allocs",
    "heap",
    "block",
    "goroutine",
    "mutex",
    "threadcreate",
    "symbol",
];

/// Largest pid + 1 on 64-bit Linux (PID_MAX_LIMIT), if pid_max cannot be read.
const PID_MAX_LIMIT: u32 = 1 << 22;

/// `GET /pprof`: the last `seconds`, or the window `start` to `end`, from
/// the store, answered at once.
pub(super) async fn pprof(
    State(state): State<ServeState>,
    Viewer(scope): Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    let params = params::parse_pprof(query.as_deref(), &state.limits())?;
    recent(&state, params, scope, Format::Pprof).await
}

/// The last `seconds` seconds, including what was sampled up to a drain
/// that serves a request arriving now, or the window `start` to `end` as
/// stored (nothing drains for it: see [`params::stored_part`]), of the
/// processes `scope` allows (kernel addresses too), written as `format`:
/// shared with every request of the same scope that asks for the same (see
/// [`super::scrape`]). 404 if a
/// requested pid neither runs nor has samples, as far as the caller may know.
pub(super) async fn recent(
    state: &ServeState,
    mut params: ProfileParams,
    scope: Scope,
    format: Format,
) -> Result<Response, HttpError> {
    let visible = scope.visible;
    // /threads reports every kind, whether off-CPU is on or not.
    if format != Format::Threads {
        state.check_type(params.profile_type)?;
    }
    let window = match params.span {
        Span::Last(seconds) => Window::last(seconds, state.scrapes.drained(&state.pipeline).await?),
        Span::Between(window) => {
            params::stored_part(window, state.pipeline.last_stored().map(|stored| stored.time_ms))
        }
    };
    super::cgroup_filter::resolve(state, &mut params.filter, visible).await?;
    for &pid in &params.filter.pids {
        let Err(reason) = process_runs(pid, visible) else {
            continue;
        };
        // A process that exited within the window still has its samples.
        let store = state.pipeline.store();
        if !store
            .has_pid(pid, window, visible, params.profile_type)
            .await
            .map_err(store_closed)?
        {
            return Err(HttpError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "{reason}, and it has no {} samples in {}",
                    params.profile_type.title(),
                    params.span
                ),
            ));
        }
    }
    let key = ShareKey::new(window, params.filter, scope, params.profile_type, format);
    let answer = state.scrapes.answer(state.pipeline.store(), key).await?;
    Ok(answer.into_response())
}

/// `GET /debug/pprof/profile`: blocks `seconds`, then returns exactly what
/// was sampled between the drains at either end.
pub(super) async fn go_profile(
    State(state): State<ServeState>,
    Viewer(scope): Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    go_typed(state, scope, query, ProfileType::Cpu).await
}

/// `GET /debug/pprof/offcpu`: as `/debug/pprof/profile`, off-CPU.
pub(super) async fn go_offcpu(
    State(state): State<ServeState>,
    Viewer(scope): Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    go_typed(state, scope, query, ProfileType::OffCpu).await
}

/// `GET /debug/pprof/wall`: as `/debug/pprof/profile`, wall-clock.
pub(super) async fn go_wall(
    State(state): State<ServeState>,
    Viewer(scope): Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    go_typed(state, scope, query, ProfileType::Wall).await
}

async fn go_typed(
    state: ServeState,
    scope: Scope,
    query: Option<String>,
    profile_type: ProfileType,
) -> Result<Response, HttpError> {
    let visible = scope.visible;
    let mut params = params::parse_go_profile(query.as_deref(), &state.limits(), profile_type)?;
    // At once, not after blocking `seconds` for nothing.
    state.check_type(profile_type)?;
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
    let after_ms = state.scrapes.drained(&state.pipeline).await?;
    super::cgroup_filter::resolve(&state, &mut params.filter, visible).await?;
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(params.seconds)) => {}
        () = stopping(state.stopping.clone()) => {}
    }
    // Requests that waited together share the drain at the end too, and
    // with it their answer.
    let until_ms = state.scrapes.drained_after(&state.pipeline, after_ms).await?;
    let window = Window::between_drains(after_ms, until_ms);
    let key = ShareKey::new(window, params.filter, scope, profile_type, Format::Pprof);
    let answer = state.scrapes.answer(state.pipeline.store(), key).await?;
    Ok(answer.into_response())
}

/// The other Go profiles: not collected here.
pub(super) async fn unsupported(uri: Uri) -> HttpError {
    HttpError::new(
        StatusCode::NOT_FOUND,
        format!(
            "{}: profilerd serves CPU, off-CPU and wall-clock profiles only: /debug/pprof/profile, /debug/pprof/offcpu or /debug/pprof/wall?seconds=N, or /pprof?pid=P&seconds=N&type=cpu|offcpu|wall",
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

    /// Off-CPU and wall profiles need off-CPU profiling on: without it they
    /// would be empty (or CPU only) and look like threads never wait.
    pub(super) fn check_type(&self, profile_type: ProfileType) -> Result<(), HttpError> {
        if profile_type == ProfileType::Cpu || self.pipeline.off_cpu() {
            return Ok(());
        }
        Err(HttpError::new(
            StatusCode::CONFLICT,
            format!(
                "type {profile_type}: off-CPU profiling is off in this daemon; start profilerd with --off-cpu (config file: off_cpu = true); if it was given, the log says why it is off"
            ),
        ))
    }
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
    // The kernel's rule, as for the samples: a set-uid program the caller
    // started is not the caller's to see.
    if !visible.allows(crate::collect::readable_by_status(pid, &status)) {
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
