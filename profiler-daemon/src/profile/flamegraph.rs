//! Flame graphs as interactive SVG, drawn by inferno from the folded stacks.

use std::io;

use inferno::flamegraph::{self, Direction, Options, color::MultiPalette};

use super::{Profile, folded};
use crate::{kind::ProfileType, profile::Filter, profile::Window};

/// Writes `profile` as an SVG flame graph (an icicle graph if `icicle`).
/// Kernel frames (`_[k]`) are orange, C++/Rust `::` names yellow, others red.
/// Every name is escaped by inferno: they come from arbitrary processes.
pub fn write(profile: &Profile, title: &str, icicle: bool, out: &mut impl io::Write) -> io::Result<()> {
    let lines = folded::folded_lines(profile);
    if lines.is_empty() {
        return write_empty(title, out);
    }
    let lines: Vec<String> = lines
        .into_iter()
        .map(|(stack, count)| format!("{} {count}", xml_chars(&stack)))
        .collect();
    let mut options = Options::default();
    options.title = title.to_owned();
    // The perl palette keys on the `_[k]` suffix folded lines carry.
    options.colors = flamegraph::color::Palette::Multi(MultiPalette::Perl);
    // Off-CPU and wall frames are as wide as their nanoseconds.
    options.count_name = profile.value_unit().to_owned();
    // Colours follow names, so one function keeps its colour across refreshes.
    options.hash = true;
    if icicle {
        options.direction = Direction::Inverted;
    }
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
}

/// "CPU: pid 42, comm nginx — 10.0 s from 2026-11-22 12:00:00 UTC": which
/// kind of time ("off-CPU: ..."), which processes and which window.
pub fn title(profile_type: ProfileType, filter: &Filter, window: &Window) -> String {
    let list = |ids: &[u32]| ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let mut who = Vec::new();
    if !filter.pids.is_empty() {
        who.push(format!("pid {}", list(&filter.pids)));
    }
    if !filter.tids.is_empty() {
        who.push(format!("tid {}", list(&filter.tids)));
    }
    if !filter.comms.is_empty() {
        who.push(format!("comm {}", filter.comms.join(",")));
    }
    for (name, values) in [
        ("unit", &filter.units),
        ("cgroup", &filter.cgroups),
        ("container", &filter.containers),
    ] {
        if !values.is_empty() {
            who.push(format!("{name} {}", values.join(",")));
        }
    }
    let who = if who.is_empty() {
        "all processes".to_owned()
    } else {
        who.join(", ")
    };
    let seconds = window.duration_ms() as f64 / 1000.0;
    format!(
        "{}: {who} — {seconds:.1} s from {}",
        profile_type.title(),
        utc_time(window.start_ms / 1000)
    )
}

/// `YYYY-MM-DD hh:mm:ss UTC` for seconds since the epoch.
fn utc_time(seconds: u64) -> String {
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (Howard Hinnant's civil_from_days, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let (era, doe) = (z / 146_097, z % 146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + u64::from(month <= 2), month, day)
}

/// inferno refuses empty input; an empty window still gets a readable picture.
fn write_empty(title: &str, out: &mut impl io::Write) -> io::Result<()> {
    write!(
        out,
        r#"<?xml version="1.0" standalone="no"?><svg version="1.1" width="1200" height="60" xmlns="http://www.w3.org/2000/svg"><text x="600" y="24" text-anchor="middle" font-family="Verdana" font-size="17">{}</text><text x="600" y="48" text-anchor="middle" font-family="Verdana" font-size="12">no samples in this window</text></svg>"#,
        escape_xml(title)
    )
}

/// Escapes text for XML and HTML, in element content and quoted attributes.
pub fn escape_xml(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            c if c.is_control() || is_noncharacter(c) => escaped.push(char::REPLACEMENT_CHARACTER),
            c => escaped.push(c),
        }
    }
    escaped
}

/// Control characters (which a process may put in its name or symbols) and
/// U+FFFE/U+FFFF are not allowed in XML: one would make the browser reject
/// the whole flame graph. They become U+FFFD; inferno escapes the rest.
fn xml_chars(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() || is_noncharacter(c)) {
        return text.into();
    }
    text.chars()
        .map(|c| {
            if c.is_control() || is_noncharacter(c) {
                char::REPLACEMENT_CHARACTER
            } else {
                c
            }
        })
        .collect::<String>()
        .into()
}

fn is_noncharacter(c: char) -> bool {
    matches!(c, '\u{FFFE}' | '\u{FFFF}')
}

#[cfg(test)]
mod tests;
