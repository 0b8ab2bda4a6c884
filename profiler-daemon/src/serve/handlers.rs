//! The endpoint handlers. None may panic on input: every failure is an
//! [`HttpError`] with one line naming what was wrong.

use std::time::Duration;

use axum::{
    extract::{RawQuery, State},
    http::{StatusCode, Uri},
    response::{IntoResponse, Response},
    routing::{MethodRouter, get},
};

use super::{
    HttpError, ServeState,
    access::{Scope, Viewer},
    params::{self, ParamError},
    recent::{process_runs, recent, stopping},
    scrape::{Format, key::ShareKey},
};
use crate::{
    kind::{ProfileType, Source, listed},
    profile::Window,
};

/// Go profiles that this profiler does not have; answered 404 at once.
/// `block` and `mutex` stay here with off-CPU on: Go's mean contention
/// events of its own runtime, not where threads sleep in the kernel.
pub(super) const UNSUPPORTED_GO_PROFILES: [&str; 6] =
    ["allocs", "block", "goroutine", "mutex", "threadcreate", "symbol"];

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

/// The Go-compatible endpoint of `profile_type` (its description's
/// `go_path`: `/debug/pprof/profile` for CPU): blocks `seconds`, then
/// returns exactly what was sampled between the drains at either end.
pub(super) fn go_endpoint(profile_type: ProfileType) -> MethodRouter<ServeState> {
    get(
        move |State(state): State<ServeState>, Viewer(scope): Viewer, RawQuery(query): RawQuery| {
            go_typed(state, scope, query, profile_type)
        },
    )
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
        .map(|&pid| process_runs(state.pipeline.proc_root(), pid, visible))
        .find(Result::is_err)
    {
        return Err(HttpError::new(StatusCode::NOT_FOUND, reason));
    }
    // Probes attached for the window: only processes asked for, by pid.
    if profile_type
        .kinds()
        .any(|kind| kind.source() == Source::AllocatorProbes)
    {
        return super::allocations::traced_window(state, scope, params, profile_type).await;
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
            "{}: profilerd serves {} profiles only: {}?seconds=N, or /pprof?pid=P&seconds=N&type={}",
            uri.path(),
            listed(&ProfileType::ALL.map(ProfileType::title), "and"),
            listed(
                &ProfileType::ALL.map(|profile_type| profile_type.describe().go_path),
                "or"
            ),
            ProfileType::ALL.map(ProfileType::name).join("|"),
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

impl From<ParamError> for HttpError {
    fn from(error: ParamError) -> Self {
        let status = match error {
            ParamError::TooLong { .. } => StatusCode::URI_TOO_LONG,
            _ => StatusCode::BAD_REQUEST,
        };
        HttpError::new(status, error.to_string())
    }
}
