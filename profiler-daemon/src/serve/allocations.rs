//! `GET /debug/pprof/allocs?pid=P&seconds=N`: the allocation probes are
//! attached to each process asked for, for the window only, and the answer
//! is what they recorded between the drains at either end, as Go's heap
//! profile. Who may ask is who may see the process (its CPU profile's rule):
//! a local user can never make the daemon probe another user's process.

use std::time::Duration;

use axum::{
    http::StatusCode,
    response::{IntoResponse as _, Response},
};

use super::{
    HttpError, ServeState,
    access::Scope,
    params::GoParams,
    scrape::{Format, key::ShareKey},
};
use crate::{
    collect::allocations::{AllocError, TraceSummary},
    kind::ProfileType,
    pipeline::TraceError,
    profile::{Window, pprof},
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
    let pids = params.filter.pids.clone();
    if pids.is_empty() {
        return Err(HttpError::new(
            StatusCode::BAD_REQUEST,
            "pid: allocations are traced per process: ask for pid=P (a process you may see)",
        ));
    }
    if pids.len() > MAX_PIDS {
        return Err(HttpError::new(
            StatusCode::BAD_REQUEST,
            format!("pid: at most {MAX_PIDS} processes per request"),
        ));
    }
    let after_ms = state.scrapes.drained(&state.pipeline).await?;
    super::cgroup_filter::resolve(&state, &mut params.filter, scope.visible).await?;
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
        if let Ok(Some(commented)) = tokio::task::spawn_blocking(move || with_comment(&body, &note)).await {
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

/// The status and message of a refused tracing.
fn refusal(err: TraceError) -> HttpError {
    let status = match &err {
        TraceError::Refused(AllocError::NoProcess(_)) => StatusCode::NOT_FOUND,
        TraceError::Refused(AllocError::Go(_) | AllocError::NoAllocator(_) | AllocError::Unavailable) => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        TraceError::Refused(AllocError::TooMany(_)) => StatusCode::TOO_MANY_REQUESTS,
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

/// The gzipped pprof `body` with `comment` added; None if it is not one.
fn with_comment(body: &[u8], comment: &str) -> Option<Vec<u8>> {
    use std::io::Read as _;

    use prost::Message as _;

    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(body).read_to_end(&mut raw).ok()?;
    let mut profile = pprof::proto::Profile::decode(raw.as_slice()).ok()?;
    let index = i64::try_from(profile.string_table.len()).ok()?;
    profile.string_table.push(comment.to_owned());
    profile.comment.push(index);
    pprof::gzip_bytes(&profile.encode_to_vec()).ok()
}
