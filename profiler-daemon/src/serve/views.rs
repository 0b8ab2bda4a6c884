//! Views for people: a flame graph, a top table and folded stacks (the index
//! page is in `index.rs`). Same filters, window, `type` and errors as
//! `/pprof`; the rendering itself is in `profile/` and runs off the async
//! workers. CPU views count samples; off-CPU and wall views nanoseconds.

use axum::{
    extract::{RawQuery, State},
    response::Response,
};

use super::{
    HttpError, ServeState,
    access::Viewer,
    handlers::recent,
    params::{self, ParamError, Quoted},
    scrape::Format,
    threads::WindowReport,
};
use crate::{
    profile::{Profile, flamegraph, folded, top},
    store::Filter,
};

/// Rows of `/top` unless `limit` says otherwise: a screenful and then some.
const DEFAULT_TOP_LIMIT: usize = 50;
/// More rows than anyone reads; the bound keeps a typo from asking for 10^18.
const MAX_TOP_LIMIT: usize = 100_000;

/// `/top?format=json`.
#[derive(serde::Serialize)]
struct TopReport {
    window: WindowReport,
    /// `cpu`, `offcpu` or `wall`.
    #[serde(rename = "type")]
    profile_type: &'static str,
    /// What `self` and `total` count: `samples` or `ns`.
    unit: &'static str,
    functions: Vec<top::FunctionCost>,
}

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

/// The SVG of `/flamegraph.svg`.
pub(super) fn render_flamegraph(
    profile: &Profile,
    filter: &Filter,
    icicle: bool,
) -> std::io::Result<Vec<u8>> {
    let title = flamegraph::title(profile.profile_type, filter, &profile.window);
    let mut out = Vec::new();
    flamegraph::write(profile, &title, icicle, &mut out)?;
    Ok(out)
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

/// The body and type of `/top`.
pub(super) fn render_top(
    profile: &Profile,
    json: bool,
    limit: usize,
) -> std::io::Result<(Vec<u8>, &'static str)> {
    let functions = top::top(profile, limit);
    if json {
        let report = TopReport {
            window: WindowReport {
                start_ms: profile.window.start_ms,
                end_ms: profile.window.end_ms,
            },
            profile_type: profile.profile_type.name(),
            unit: profile.value_unit(),
            functions,
        };
        return Ok((serde_json::to_vec(&report)?, "application/json"));
    }
    Ok((
        top::table(profile, &functions).into_bytes(),
        "text/plain; charset=utf-8",
    ))
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

/// The text of `/folded`.
pub(super) fn render_folded(profile: &Profile) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    folded::write(profile, &mut out)?;
    Ok(out)
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
