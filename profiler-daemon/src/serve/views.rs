//! The endpoints of the views: a flame graph, a top table, folded stacks,
//! the index page and the threads report. Same filters, window, `type` and
//! errors as `/pprof`; each parses its options and asks [`recent`] for its
//! [`Format`]; the bytes are written by `scrape::render` (with `index.rs`,
//! `threads.rs` and `profile/`), off the async workers. CPU views count
//! samples; off-CPU and wall views nanoseconds.

use axum::{
    extract::{RawQuery, State},
    response::Response,
};

use super::{
    HttpError, ServeState,
    access::Viewer,
    params::{self, ParamError, Quoted},
    recent::recent,
    scrape::Format,
};
use crate::kind::ProfileType;

/// Rows of `/top` unless `limit` says otherwise: a screenful and then some.
pub(super) const DEFAULT_TOP_LIMIT: usize = 50;
/// More rows than anyone reads; the bound keeps a typo from asking for 10^18.
pub(super) const MAX_TOP_LIMIT: usize = 100_000;

fn invalid(name: &'static str, value: &str, expected: &str) -> HttpError {
    ParamError::Invalid {
        name,
        value: Quoted::new(value),
        expected: expected.to_owned(),
    }
    .into()
}

/// `GET /flamegraph.svg`: `icicle=true` draws it upside down.
pub(super) async fn flamegraph_svg(
    State(state): State<ServeState>,
    Viewer(scope): Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    let (params, options) = params::parse_with_options(query.as_deref(), &state.limits(), &["icicle"])?;
    let icicle = match options.first().map(|(_, value)| value.as_str()) {
        None | Some("false" | "0") => false,
        Some("true" | "1") => true,
        Some(other) => return Err(invalid("icicle", other, "true or false")),
    };
    recent(&state, params, scope, Format::Flamegraph { icicle }).await
}

/// `GET /top`: `format=text|json`, `limit=N`.
pub(super) async fn top_table(
    State(state): State<ServeState>,
    Viewer(scope): Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    let (params, options) =
        params::parse_with_options(query.as_deref(), &state.limits(), &["format", "limit"])?;
    let mut json = false;
    let mut limit = DEFAULT_TOP_LIMIT;
    for (name, value) in &options {
        match (*name, value.as_str()) {
            ("format", "json") => json = true,
            ("format", "text") => json = false,
            ("format", other) => return Err(invalid("format", other, "text or json")),
            (_, value) => {
                limit = parse_limit(value).ok_or_else(|| {
                    invalid("limit", value, &format!("an integer from 1 to {MAX_TOP_LIMIT}"))
                })?;
            }
        }
    }
    recent(&state, params, scope, Format::Top { json, limit }).await
}

/// Digits only, as the other numeric parameters.
fn parse_limit(value: &str) -> Option<usize> {
    if value.is_empty() || !value.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    value
        .parse()
        .ok()
        .filter(|limit| (1..=MAX_TOP_LIMIT).contains(limit))
}

/// `GET /folded`: what `record --format folded` writes.
pub(super) async fn folded_stacks(
    State(state): State<ServeState>,
    Viewer(scope): Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    let params = params::parse_pprof(query.as_deref(), &state.limits())?;
    recent(&state, params, scope, Format::Folded).await
}

/// `GET /`: the index page (see `index.rs`).
pub(super) async fn index(
    State(state): State<ServeState>,
    Viewer(scope): Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    let params = params::parse_pprof(query.as_deref(), &state.limits())?;
    let span = params.span;
    let kinds = state.pipeline.kinds();
    recent(&state, params, scope, Format::Index { span, kinds }).await
}

/// `GET /threads`: the report of `threads.rs`, as JSON.
pub(super) async fn threads(
    State(state): State<ServeState>,
    Viewer(scope): Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    let mut params = params::parse_pprof(query.as_deref(), &state.limits())?;
    // Every kind: the report splits them.
    params.profile_type = ProfileType::Wall;
    recent(&state, params, scope, Format::Threads).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_bounded_decimal_integers() {
        assert_eq!(parse_limit("1"), Some(1));
        assert_eq!(parse_limit("50"), Some(50));
        assert_eq!(parse_limit(&MAX_TOP_LIMIT.to_string()), Some(MAX_TOP_LIMIT));
        for bad in [
            "",
            "0",
            "-1",
            "+5",
            " 5",
            "1e3",
            "abc",
            "100001",
            "99999999999999999999999",
        ] {
            assert_eq!(parse_limit(bad), None, "{bad:?}");
        }
    }
}
