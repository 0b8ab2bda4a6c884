//! Views for people: a flame graph, a top table, folded stacks and an index
//! page. Same filters, window and errors as `/pprof`.

use axum::{
    extract::{RawQuery, State},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};

use super::{
    HttpError, ServeState,
    handlers::recent_profile,
    params::{self, ParamError, ProfileParams, Quoted},
    threads,
};
use crate::profile::{Profile, flamegraph, folded, top};

const DEFAULT_TOP_LIMIT: usize = 50;

#[derive(serde::Serialize)]
struct TopReport {
    window: threads::WindowReport,
    functions: Vec<top::FunctionCost>,
}
const MAX_TOP_LIMIT: usize = 10_000;

fn with_type(body: impl IntoResponse, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn invalid(name: &'static str, value: &str, expected: &str) -> HttpError {
    ParamError::Invalid {
        name,
        value: Quoted::new(value),
        expected: expected.to_owned(),
    }
    .into()
}

/// CPU-bound rendering goes off the async workers.
async fn render<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, HttpError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| HttpError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("rendering: {err}")))?
        .map_err(|err| HttpError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("rendering: {err}")))
}

/// "pid 42, comm nginx — 10 s from 2026-11-22 12:00:00 UTC".
pub fn title(params: &ProfileParams, profile: &Profile) -> String {
    let filter = &params.filter;
    let mut who = Vec::new();
    let list = |ids: &[u32]| ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    if !filter.pids.is_empty() {
        who.push(format!("pid {}", list(&filter.pids)));
    }
    if !filter.tids.is_empty() {
        who.push(format!("tid {}", list(&filter.tids)));
    }
    if !filter.comms.is_empty() {
        who.push(format!("comm {}", filter.comms.join(",")));
    }
    let who = if who.is_empty() {
        "all processes".to_owned()
    } else {
        who.join(", ")
    };
    let seconds = profile.window.duration_ms() as f64 / 1000.0;
    let start = profile.window.start_ms / 1000;
    let (days, rest) = (start / 86_400, start % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "CPU: {who} — {seconds:.1} s from {year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

pub(super) async fn flamegraph_svg(
    State(state): State<ServeState>,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    let (params, options) = params::parse_with_options(query.as_deref(), &state.limits(), &["icicle"])?;
    let icicle = match options.first().map(|(_, value)| value.as_str()) {
        None | Some("false" | "0") => false,
        Some("true" | "1") => true,
        Some(other) => return Err(invalid("icicle", other, "true or false")),
    };
    let profile = recent_profile(&state, params.clone()).await?;
    let title = title(&params, &profile);
    let svg = render(move || {
        let mut out = Vec::new();
        flamegraph::write(&profile, &title, icicle, &mut out)?;
        Ok(out)
    })
    .await?;
    Ok(with_type(svg, "image/svg+xml"))
}

pub(super) async fn top_table(
    State(state): State<ServeState>,
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
                limit = value
                    .parse()
                    .ok()
                    .filter(|limit| (1..=MAX_TOP_LIMIT).contains(limit))
                    .ok_or_else(|| {
                        invalid("limit", value, &format!("an integer from 1 to {MAX_TOP_LIMIT}"))
                    })?;
            }
        }
    }
    let profile = recent_profile(&state, params).await?;
    let functions = top::top(&profile, limit);
    if json {
        let report = TopReport {
            window: threads::WindowReport {
                start_ms: profile.window.start_ms,
                end_ms: profile.window.end_ms,
            },
            functions,
        };
        return Ok(axum::Json(report).into_response());
    }
    Ok(with_type(
        top::table(&profile, &functions),
        "text/plain; charset=utf-8",
    ))
}

pub(super) async fn folded_stacks(
    State(state): State<ServeState>,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    let params = params::parse_pprof(query.as_deref(), &state.limits())?;
    let profile = recent_profile(&state, params).await?;
    let text = render(move || {
        let mut out = Vec::new();
        folded::write(&profile, &mut out)?;
        Ok(out)
    })
    .await?;
    Ok(with_type(text, "text/plain; charset=utf-8"))
}

pub(super) async fn index(
    State(state): State<ServeState>,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    let params = params::parse_pprof(query.as_deref(), &state.limits())?;
    let seconds = params.seconds;
    let profile = recent_profile(&state, params).await?;
    Ok(with_type(
        index_page(&profile, seconds),
        "text/html; charset=utf-8",
    ))
}

/// The processes sampled in the window, busiest first. Names come from
/// arbitrary processes: every one is escaped.
pub fn index_page(profile: &Profile, seconds: u64) -> String {
    let report = threads::report(profile);
    let window_ns = (profile.window.duration_ms().max(1) as f64) * 1e6;
    let mut rows = String::new();
    for process in &report.processes {
        let share = process.cpu_ns as f64 * 100.0 / window_ns;
        let pid = process.pid;
        rows.push_str(&format!(
            "<tr><td>{pid}</td><td>{}</td><td class=n>{share:.1}%</td><td class=n>{}</td><td class=n>{}</td>\
             <td><a href=\"/flamegraph.svg?pid={pid}&amp;seconds={seconds}\">flame graph</a> · \
             <a href=\"/top?pid={pid}&amp;seconds={seconds}\">top</a> · \
             <a href=\"/pprof?pid={pid}&amp;seconds={seconds}\">pprof</a></td></tr>\n",
            flamegraph::escape_xml(&process.comm),
            process.threads.len(),
            process.samples,
        ));
    }
    format!(
        "<!doctype html>\n<html><head><meta charset=utf-8><title>profilerd</title><style>\
         body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}\
         td,th{{padding:.3em .8em;border-bottom:1px solid #ddd;text-align:left}}.n{{text-align:right}}</style></head>\
         <body><h1>profilerd</h1><p>Processes sampled in the last {seconds} s ({} samples). \
         CPU is the share of one CPU, measured in the kernel. \
         <a href=\"/flamegraph.svg?seconds={seconds}\">Whole system flame graph</a> · \
         <a href=\"/top?seconds={seconds}\">top</a> · <a href=\"/metrics\">metrics</a></p>\n\
         <table><tr><th>pid</th><th>comm</th><th class=n>CPU</th><th class=n>threads</th><th class=n>samples</th><th></th></tr>\n\
         {rows}</table></body></html>\n",
        profile.total_samples()
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        store::{Filter, Window},
        symbolize::{SymbolizedSample, SymbolizedStack},
    };

    fn profile(comm: &str) -> Profile {
        Profile {
            window: Window {
                start_ms: 1_795_348_800_000,
                end_ms: 1_795_348_810_000,
            },
            frequency: 99,
            samples: vec![SymbolizedSample {
                pid: 7,
                tid: 7,
                comm: comm.into(),
                thread_name: comm.into(),
                stack: Arc::new(SymbolizedStack {
                    locations: Box::new([]),
                }),
                count: 10,
                cpu_ns: 5_000_000_000,
            }],
        }
    }

    #[test]
    fn the_index_escapes_process_names_and_shows_cpu_share() {
        let page = index_page(&profile("<script>alert(1)</script>"), 10);
        assert!(!page.contains("<script>"), "{page}");
        assert!(page.contains("&lt;script&gt;"), "{page}");
        assert!(page.contains("50.0%"), "5 s of CPU in a 10 s window: {page}");
        assert!(page.contains("/flamegraph.svg?pid=7"), "{page}");
    }

    #[test]
    fn titles_name_the_processes_and_the_window() {
        let params = ProfileParams {
            seconds: 10,
            filter: Filter {
                pids: vec![7, 8],
                ..Filter::default()
            },
        };
        assert_eq!(
            title(&params, &profile("x")),
            "CPU: pid 7,8 — 10.0 s from 2026-11-22 12:00:00 UTC"
        );
        let all = ProfileParams {
            seconds: 10,
            filter: Filter::default(),
        };
        assert!(title(&all, &profile("x")).starts_with("CPU: all processes"));
    }
}
