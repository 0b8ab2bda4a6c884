//! `GET /debug/pprof/allocs?pid=P&seconds=N` (or `comm=`, `unit=`,
//! `cgroup=`, `container=` naming running processes): the allocation probes
//! are attached to each process asked for, for the window only, and the answer
//! is what they recorded between the drains at either end, as Go's heap
//! profile. Who may ask is who may see the process (its CPU profile's rule):
//! a local user can never make the daemon probe another user's process.

use std::time::Duration;

use axum::{
    extract::{RawQuery, State},
    http::StatusCode,
    response::{IntoResponse as _, Response},
};

use super::{
    HttpError, ServeState,
    access::{Scope, Viewer},
    params::{self, GoParams},
    recent::process_runs,
    scrape::{Format, key::ShareKey},
};
use crate::{
    collect::allocations::{AllocError, TraceSummary, running},
    kind::ProfileType,
    pipeline::TraceError,
    profile::{Filter, Window, pprof},
};

/// Processes one request may trace.
const MAX_PIDS: usize = 4;

/// Traces the processes of `params` for its window and answers their profile.
pub(super) async fn traced_window(
    state: ServeState,
    scope: Scope,
    mut params: GoParams,
    profile_type: ProfileType,
) -> Result<Response, HttpError> {
    if params.filter.pids.len() > MAX_PIDS {
        return Err(HttpError::new(
            StatusCode::BAD_REQUEST,
            format!("pid: at most {MAX_PIDS} processes per request"),
        ));
    }
    let after_ms = state.scrapes.drained(&state.pipeline).await?;
    // Container prefixes become whole ids; units and cgroups are matched
    // against the running processes, which may not have been sampled yet.
    if !params.filter.containers.is_empty() {
        super::cgroup_filter::resolve(&state, &mut params.filter, scope.visible).await?;
    }
    if params.filter.pids.is_empty() {
        params.filter.pids = selected(&state, &params.filter, scope).await?;
    }
    let pids = params.filter.pids.clone();
    let seconds = Duration::from_secs(params.seconds);
    let mut traced = Vec::new();
    for &pid in &pids {
        if let Err(err) = state.pipeline.trace_allocations(pid, seconds).await {
            for &pid in &traced {
                let _ = state.pipeline.end_allocations(pid).await;
            }
            return Err(refusal(err));
        }
        traced.push(pid);
    }
    tokio::select! {
        () = tokio::time::sleep(seconds) => {}
        () = super::recent::stopping(state.stopping.clone()) => {}
    }
    let mut summaries = Vec::new();
    for &pid in &traced {
        let summary = state
            .pipeline
            .end_allocations(pid)
            .await
            .map_err(|err| HttpError::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string()))?;
        summaries.push((pid, summary));
    }
    let until_ms = state.scrapes.drained_after(&state.pipeline, after_ms).await?;
    let window = Window::between_drains(after_ms, until_ms);
    let key = ShareKey::new(window, params.filter, scope, profile_type, Format::Pprof);
    let mut answer = state.scrapes.answer(state.pipeline.store(), key).await?;
    let cut_short = cut_short(&summaries);
    if let Some(reason) = &cut_short {
        // Said in the profile too (its comments, which `go tool pprof`
        // prints), not only to this request: the file outlives the headers.
        let body = answer.body.clone();
        let note = format!("profilerd: the tracing was cut short: {reason}");
        if let Ok(Some(commented)) = tokio::task::spawn_blocking(move || annotated(&body, &note, false)).await
        {
            answer.body = commented.into();
        }
    }
    let mut response = answer.into_response();
    if let Some(value) = cut_short.and_then(|text| text.parse().ok()) {
        response
            .headers_mut()
            .insert("profilerd-tracing-cut-short", value);
    }
    Ok(response)
}

/// `GET /debug/pprof/heap?pid=P`, at once: what a process traced while the
/// daemon runs (`alloc_trace_comms`) allocated since its tracing began and
/// has not freed, as Go's heap profile (no default sample type: readers
/// show the last, `inuse_space`). Without such a pid it is the 404 it was
/// (scrapers ask for Go's heap by default).
pub(super) async fn heap(
    State(state): State<ServeState>,
    Viewer(scope): Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    let profile_type = ProfileType::Alloc;
    let params = params::parse_go_profile(query.as_deref(), &state.limits(), profile_type)?;
    let not_traced = |what: String| {
        HttpError::new(
            StatusCode::NOT_FOUND,
            format!(
                "/debug/pprof/heap: {what}: the heap is kept for processes traced while the daemon runs (alloc_trace_comms); for any process you may see, ask /debug/pprof/allocs?pid=P&seconds=N"
            ),
        )
    };
    let &[pid] = params.filter.pids.as_slice() else {
        return Err(not_traced("ask for one pid=P".into()));
    };
    state.check_type(profile_type)?;
    if let Err(reason) = process_runs(state.pipeline.proc_root(), pid, scope.visible) {
        return Err(HttpError::new(StatusCode::NOT_FOUND, reason));
    }
    let since_ms = state
        .pipeline
        .traced_continuously()
        .await
        .map_err(|err| HttpError::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string()))?
        .into_iter()
        .find_map(|trace| (trace.pid == pid).then_some(trace.since_ms))
        .ok_or_else(|| not_traced(format!("process {pid} is not traced while the daemon runs")))?;
    let until_ms = state.scrapes.drained(&state.pipeline).await?;
    let window = Window {
        start_ms: since_ms,
        end_ms: until_ms.saturating_add(1),
    };
    let key = ShareKey::new(window, params.filter, scope, profile_type, Format::Pprof);
    let mut answer = state.scrapes.answer(state.pipeline.store(), key).await?;
    let note = format!(
        "profilerd: in use = allocated since Unix ms {since_ms} (when tracing of process {pid} began; the store keeps its retention at most) and not freed by Unix ms {until_ms}"
    );
    let body = answer.body.clone();
    if let Ok(Some(annotated)) = tokio::task::spawn_blocking(move || annotated(&body, &note, true)).await {
        answer.body = annotated.into();
    }
    Ok(answer.into_response())
}

/// The running processes the caller may see that a request without pids
/// names by process name, unit, cgroup or container: those are traced.
async fn selected(state: &ServeState, filter: &Filter, scope: Scope) -> Result<Vec<u32>, HttpError> {
    if filter.comms.is_empty() && !filter.by_cgroup() {
        return Err(HttpError::new(
            StatusCode::BAD_REQUEST,
            "pid: allocations are traced per process: ask for pid=P, or name running processes with comm=, unit=, cgroup= or container=",
        ));
    }
    let proc_root = state.pipeline.proc_root().clone();
    let wanted = filter.clone();
    let visible = scope.visible;
    let pids = tokio::task::spawn_blocking(move || {
        let hidden = |pid| process_runs(&proc_root, pid, visible).is_err();
        running(&proc_root, std::slice::from_ref(&wanted), hidden)
    })
    .await
    .map_err(|err| HttpError::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))?;
    match pids.len() {
        0 => Err(HttpError::new(
            StatusCode::NOT_FOUND,
            "no running process you may see matches the filters: allocations are traced in running processes",
        )),
        count if count > MAX_PIDS => {
            let listed: Vec<String> = pids.iter().take(8).map(u32::to_string).collect();
            Err(HttpError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "the filters match {count} running processes ({}{}); at most {MAX_PIDS} are traced per request: name them with pid=",
                    listed.join(", "),
                    if count > listed.len() { ", ..." } else { "" }
                ),
            ))
        }
        _ => Ok(pids),
    }
}

/// The status and message of a refused tracing.
fn refusal(err: TraceError) -> HttpError {
    let status = match &err {
        TraceError::Refused(AllocError::NoProcess(_)) => StatusCode::NOT_FOUND,
        TraceError::Refused(AllocError::Go(_) | AllocError::NoAllocator(_) | AllocError::Unavailable) => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        TraceError::Refused(AllocError::TooMany(_) | AllocError::UserShare { .. }) => {
            StatusCode::TOO_MANY_REQUESTS
        }
        TraceError::Refused(AllocError::Attach { .. }) => StatusCode::INTERNAL_SERVER_ERROR,
        TraceError::Stopped => StatusCode::SERVICE_UNAVAILABLE,
    };
    HttpError::new(status, err.to_string())
}

/// Why some process's tracing ended before the window, for the reader.
fn cut_short(summaries: &[(u32, TraceSummary)]) -> Option<String> {
    let reasons: Vec<String> = summaries
        .iter()
        .filter_map(|(pid, summary)| Some(format!("{pid}: {}", summary.cut_short.as_deref()?)))
        .collect();
    (!reasons.is_empty()).then(|| reasons.join("; ").replace(['\r', '\n'], " "))
}

/// The gzipped pprof `body` with `comment` added (and without a default
/// sample type, with `no_default`); None if it is not one.
fn annotated(body: &[u8], comment: &str, no_default: bool) -> Option<Vec<u8>> {
    use std::io::Read as _;

    use prost::Message as _;

    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(body).read_to_end(&mut raw).ok()?;
    let mut profile = pprof::proto::Profile::decode(raw.as_slice()).ok()?;
    let index = i64::try_from(profile.string_table.len()).ok()?;
    profile.string_table.push(comment.to_owned());
    profile.comment.push(index);
    if no_default {
        profile.default_sample_type = 0;
    }
    pprof::gzip_bytes(&profile.encode_to_vec()).ok()
}
