//! The page of `GET /` (its handler is in `views.rs`): the processes
//! sampled in the last N seconds (or in `start` to `end`), each linking to
//! its views.

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
};

use super::{
    params::Span,
    threads::{self, ProcessReport},
};
use crate::{
    kind::{KindSet, ProfileType, Source},
    profile::Filter,
    profile::{
        Profile,
        flamegraph::{escape_xml, title},
    },
};

/// Thread names listed in a row's tooltip; a pool of hundreds would make it useless.
const MAX_THREAD_NAMES: usize = 20;

/// The processes sampled in the window, busiest first (in the profile
/// type's amount), with links to the other types `kinds` makes available.
/// Every process and thread name comes from an arbitrary process and is
/// escaped; nothing is loaded from elsewhere (the page works offline and
/// leaks nothing).
pub fn page(profile: &Profile, filter: &Filter, span: Span, kinds: KindSet) -> String {
    let profile_type = profile.profile_type;
    let report = threads::report(profile);
    let mut counts: HashMap<u32, u64> = HashMap::new();
    for sample in &profile.samples {
        *counts.entry(sample.pid).or_default() += sample.count;
    }
    let mut processes: Vec<&ProcessReport> = report.processes.iter().collect();
    processes.sort_by(|a, b| {
        b.times
            .amount(profile_type)
            .cmp(&a.times.amount(profile_type))
            .then(a.pid.cmp(&b.pid))
    });
    // The window the page was asked for, as its links ask again.
    let window = match span {
        Span::Last(seconds) => format!("seconds={seconds}"),
        Span::Between(window) => format!("start={}&amp;end={}", window.start_ms, window.end_ms),
    };
    let page = Page {
        profile,
        window,
        // The default type needs no parameter.
        type_query: if profile_type == ProfileType::default() {
            String::new()
        } else {
            format!("&amp;type={profile_type}")
        },
    };
    let units = page.units_table(&processes);
    let mut rows = String::new();
    for process in &processes {
        page.row(&mut rows, process, counts.get(&process.pid).copied().unwrap_or(0));
    }
    if processes.is_empty() {
        rows.push_str("<tr><td colspan=7>no samples in this window</td></tr>\n");
    }
    let (window, type_query) = (&page.window, &page.type_query);
    let what = profile_type.title();
    format!(
        "<!doctype html>\n<html><head><meta charset=utf-8><title>profilerd</title><style>\
         body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}\
         td,th{{padding:.3em .8em;border-bottom:1px solid #ddd;text-align:left}}.n{{text-align:right}}</style></head>\
         <body><h1>profilerd</h1><p>{} ({} {}). {}</p>\n<p>{}</p>\
         <p><a href=\"/flamegraph.svg?{window}{type_query}\">whole-system flame graph</a> · \
         <a href=\"/top?{window}{type_query}\">top</a> · <a href=\"/folded?{window}{type_query}\">folded</a> · \
         <a href=\"/metrics\">metrics</a></p>\n{units}\
         <table><tr><th>pid</th><th>comm</th><th>unit</th><th class=n>{what}</th><th class=n>threads</th>\
         <th class=n>{}</th><th></th></tr>\n{rows}</table></body></html>\n",
        escape_xml(&title(profile_type, filter, &profile.window)),
        profile.total_samples(),
        profile_type.sample_types()[0].0,
        profile_type.describe().explanation,
        type_links(profile_type, window, kinds),
        profile_type.sample_types()[0].0,
    )
}

/// The type shown, links to the others available, and what turns on
/// those that are not.
fn type_links(shown: ProfileType, window: &str, kinds: KindSet) -> String {
    let mut links = Vec::new();
    let mut off: Vec<(&str, Source)> = Vec::new();
    for profile_type in ProfileType::ALL {
        let title = profile_type.title();
        match profile_type.available(kinds) {
            _ if profile_type == shown => links.push(format!("<b>{title}</b>")),
            Ok(()) => links.push(format!(
                "<a href=\"/?{window}&amp;type={profile_type}\">{title}</a>"
            )),
            Err(source) => off.push((title, source)),
        }
    }
    let mut text = format!("type: {}", links.join(" · "));
    // One sentence per source that is off: the types it would bring.
    let mut sources: Vec<Source> = off.iter().map(|(_, source)| *source).collect();
    sources.dedup();
    for source in sources {
        let titles: Vec<&str> = off
            .iter()
            .filter(|(_, of)| *of == source)
            .map(|(title, _)| *title)
            .collect();
        let _ = write!(
            text,
            " · {} profiles are off ({})",
            titles.join(" and "),
            escape_xml(source.how_to_enable())
        );
    }
    text
}

/// What every row and link shares.
struct Page<'a> {
    profile: &'a Profile,
    /// `seconds=N`, or `start=S&amp;end=E`.
    window: String,
    /// `&amp;type=...`, empty for CPU (the default).
    type_query: String,
}

impl Page<'_> {
    /// `ns` as a share of the window.
    fn share(&self, ns: u64) -> f64 {
        let window_ns = self.profile.window.duration_ms().max(1) as f64 * 1e6;
        ns as f64 * 100.0 / window_ns
    }

    /// Links to the views of `query` (`pid=7`).
    fn links(&self, query: &str) -> String {
        let (window, type_query) = (&self.window, &self.type_query);
        ["flamegraph.svg", "top", "pprof"]
            .iter()
            .zip(["flame graph", "top", "pprof"])
            .map(|(path, text)| format!("<a href=\"/{path}?{query}&amp;{window}{type_query}\">{text}</a>"))
            .collect::<Vec<_>>()
            .join(" · ")
    }

    fn row(&self, out: &mut String, process: &ProcessReport, count: u64) {
        let share = self.share(process.times.amount(self.profile.profile_type));
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
        let links = self.links(&format!("pid={pid}"));
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "<tr><td>{pid}</td><td>{}</td><td>{}</td><td class=n>{share:.1}%</td>\
             <td class=n title=\"{}\">{}</td><td class=n>{count}</td><td>{links}</td></tr>",
            escape_xml(&process.comm),
            escape_xml(process.unit.as_deref().unwrap_or_default()),
            escape_xml(&names.join(", ")),
            process.threads.len(),
        );
    }

    /// The processes grouped by unit, busiest unit first, each linking to
    /// its views; empty when no process has a unit.
    fn units_table(&self, processes: &[&ProcessReport]) -> String {
        let profile_type = self.profile.profile_type;
        // unit -> (ns, processes)
        let mut units: BTreeMap<&str, (u64, usize)> = BTreeMap::new();
        for process in processes {
            if let Some(unit) = &process.unit {
                let entry = units.entry(unit).or_default();
                entry.0 += process.times.amount(profile_type);
                entry.1 += 1;
            }
        }
        if units.is_empty() {
            return String::new();
        }
        let mut units: Vec<_> = units.into_iter().collect();
        units.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(b.0)));
        let mut out = format!(
            "<table><tr><th>unit</th><th class=n>{}</th><th class=n>processes</th><th></th></tr>\n",
            profile_type.title()
        );
        for (unit, (ns, count)) in units {
            let share = self.share(ns);
            // `@` (templated and user units) is percent-encoded.
            let query: String = form_urlencoded::byte_serialize(unit.as_bytes()).collect();
            let links = self.links(&format!("unit={query}"));
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td class=n>{share:.1}%</td><td class=n>{count}</td><td>{links}</td></tr>",
                escape_xml(unit)
            );
        }
        out.push_str("</table><p></p>\n");
        out
    }
}

#[cfg(test)]
mod tests;
