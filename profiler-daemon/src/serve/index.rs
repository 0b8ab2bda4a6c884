//! `GET /`: an HTML page of the processes sampled in the last N seconds,
//! each linking to its views. Same filters, window and errors as `/pprof`.

use std::fmt::Write as _;

use axum::{
    extract::{RawQuery, State},
    response::Response,
};

use super::{
    HttpError, ServeState,
    access::Viewer,
    handlers::recent,
    params,
    scrape::Format,
    threads::{self, ProcessReport},
};
use crate::{
    profile::{
        Profile,
        flamegraph::{escape_xml, title},
    },
    store::Filter,
};

/// Thread names listed in a row's tooltip; a pool of hundreds would make it useless.
const MAX_THREAD_NAMES: usize = 20;

pub(super) async fn index(
    State(state): State<ServeState>,
    Viewer(visible): Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    let params = params::parse_pprof(query.as_deref(), &state.limits())?;
    let seconds = params.seconds;
    recent(&state, params, visible, Format::Index { seconds }).await
}

/// The processes sampled in the window, busiest first. Every process and
/// thread name comes from an arbitrary process and is escaped; nothing is
/// loaded from elsewhere (the page works offline and leaks nothing).
pub fn page(profile: &Profile, filter: &Filter, seconds: u64) -> String {
    let report = threads::report(profile);
    let units = units_table(&report.processes, profile, seconds);
    let mut rows = String::new();
    for process in &report.processes {
        row(&mut rows, process, profile, seconds);
    }
    if report.processes.is_empty() {
        rows.push_str("<tr><td colspan=7>no samples in this window</td></tr>\n");
    }
    format!(
        "<!doctype html>\n<html><head><meta charset=utf-8><title>profilerd</title><style>\
         body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}\
         td,th{{padding:.3em .8em;border-bottom:1px solid #ddd;text-align:left}}.n{{text-align:right}}</style></head>\
         <body><h1>profilerd</h1><p>{} ({} samples). \
         CPU is measured in the kernel, as a share of one CPU: 100% is one CPU busy for the whole window.</p>\
         <p><a href=\"/flamegraph.svg?seconds={seconds}\">whole-system flame graph</a> · \
         <a href=\"/top?seconds={seconds}\">top</a> · <a href=\"/folded?seconds={seconds}\">folded</a> · \
         <a href=\"/metrics\">metrics</a></p>\n{units}\
         <table><tr><th>pid</th><th>comm</th><th>unit</th><th class=n>CPU</th><th class=n>threads</th>\
         <th class=n>samples</th><th></th></tr>\n{rows}</table></body></html>\n",
        escape_xml(&title(filter, &profile.window)),
        profile.total_samples()
    )
}

fn row(out: &mut String, process: &ProcessReport, profile: &Profile, seconds: u64) {
    let window_ns = profile.window.duration_ms().max(1) as f64 * 1e6;
    let share = process.cpu_ns as f64 * 100.0 / window_ns;
    let mut names: Vec<&str> = process
        .threads
        .iter()
        .take(MAX_THREAD_NAMES)
        .map(|thread| &*thread.thread_name)
        .collect();
    if process.threads.len() > MAX_THREAD_NAMES {
        names.push("...");
    }
    let pid = process.pid;
    let links = ["flamegraph.svg", "top", "pprof"]
        .iter()
        .zip(["flame graph", "top", "pprof"])
        .map(|(path, text)| format!("<a href=\"/{path}?pid={pid}&amp;seconds={seconds}\">{text}</a>"))
        .collect::<Vec<_>>()
        .join(" · ");
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "<tr><td>{pid}</td><td>{}</td><td>{}</td><td class=n>{share:.1}%</td>\
         <td class=n title=\"{}\">{}</td><td class=n>{}</td><td>{links}</td></tr>",
        escape_xml(&process.comm),
        escape_xml(process.unit.as_deref().unwrap_or_default()),
        escape_xml(&names.join(", ")),
        process.threads.len(),
        process.samples,
    );
}

/// The processes grouped by unit, busiest unit first, each linking to its
/// views; empty when no process has a unit.
fn units_table(processes: &[ProcessReport], profile: &Profile, seconds: u64) -> String {
    // unit -> (CPU ns, processes)
    let mut units: std::collections::BTreeMap<&str, (u64, usize)> = std::collections::BTreeMap::new();
    for process in processes {
        if let Some(unit) = &process.unit {
            let entry = units.entry(unit).or_default();
            entry.0 += process.cpu_ns;
            entry.1 += 1;
        }
    }
    if units.is_empty() {
        return String::new();
    }
    let mut units: Vec<_> = units.into_iter().collect();
    units.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(b.0)));
    let window_ns = profile.window.duration_ms().max(1) as f64 * 1e6;
    let mut out = String::from(
        "<table><tr><th>unit</th><th class=n>CPU</th><th class=n>processes</th><th></th></tr>\n",
    );
    for (unit, (cpu_ns, count)) in units {
        let share = cpu_ns as f64 * 100.0 / window_ns;
        // `@` (templated and user units) is percent-encoded.
        let query: String = form_urlencoded::byte_serialize(unit.as_bytes()).collect();
        let links = ["flamegraph.svg", "top", "pprof"]
            .iter()
            .zip(["flame graph", "top", "pprof"])
            .map(|(path, text)| format!("<a href=\"/{path}?unit={query}&amp;seconds={seconds}\">{text}</a>"))
            .collect::<Vec<_>>()
            .join(" · ");
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td class=n>{share:.1}%</td><td class=n>{count}</td><td>{links}</td></tr>",
            escape_xml(unit)
        );
    }
    out.push_str("</table><p></p>\n");
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        store::Window,
        symbolize::{SymbolizedSample, SymbolizedStack},
    };

    fn profile(comm: &str, thread_name: &str) -> Profile {
        Profile {
            window: Window {
                start_ms: 1_795_348_800_000,
                end_ms: 1_795_348_810_000,
            },
            frequency: 99,
            samples: vec![SymbolizedSample {
                pid: 7,
                tid: 8,
                comm: comm.into(),
                uid: None,
                thread_name: thread_name.into(),
                stack: Arc::new(SymbolizedStack {
                    locations: Box::new([]),
                }),
                count: 10,
                cpu_ns: 5_000_000_000,
                cgroup: Some(Arc::new(crate::cgroup::Cgroup::from_path(
                    "/system.slice/system-pg.slice/postgresql@16-main.service",
                ))),
                ns_pid: None,
            }],
        }
    }

    #[test]
    fn process_and_thread_names_are_escaped() {
        let page = page(
            &profile("<script>alert(1)</script>", "\"><img src=x onerror=alert(2)>"),
            &Filter::default(),
            10,
        );
        assert!(!page.contains("<script>alert"), "{page}");
        assert!(!page.contains("<img"), "{page}");
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{page}");
        assert!(page.contains("title=\"&quot;&gt;&lt;img"), "{page}");
    }

    #[test]
    fn rows_show_cpu_share_threads_and_links() {
        let page = page(&profile("worker", "worker"), &Filter::default(), 10);
        assert!(
            page.contains("<td>7</td><td>worker</td><td>postgresql@16-main.service</td>"),
            "{page}"
        );
        assert!(
            page.contains("<tr><td>postgresql@16-main.service</td><td class=n>50.0%</td><td class=n>1</td>"),
            "the unit's row: {page}"
        );
        assert!(
            page.contains("/flamegraph.svg?unit=postgresql%4016-main.service&amp;seconds=10"),
            "{page}"
        );
        assert!(page.contains("50.0%"), "5 s of CPU in a 10 s window: {page}");
        for link in [
            "/flamegraph.svg?pid=7&amp;seconds=10",
            "/top?pid=7&amp;seconds=10",
            "/pprof?pid=7&amp;seconds=10",
        ] {
            assert!(page.contains(link), "{link} in {page}");
        }
        assert!(
            page.contains("CPU: all processes — 10.0 s from 2026-11-22 12:00:00 UTC"),
            "{page}"
        );
    }

    #[test]
    fn nothing_external_is_loaded() {
        let page = page(&profile("worker", "worker"), &Filter::default(), 10);
        for external in ["http:", "https:", "<script", "<link", "<img", "@import", "//"] {
            assert!(!page.contains(external), "{external} in {page}");
        }
    }

    #[test]
    fn an_empty_window_says_so() {
        let empty = Profile {
            samples: Vec::new(),
            ..profile("x", "x")
        };
        assert!(page(&empty, &Filter::default(), 10).contains("no samples in this window"));
    }
}
