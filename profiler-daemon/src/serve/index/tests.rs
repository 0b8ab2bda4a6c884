use std::sync::Arc;

use super::*;
use crate::{
    profile::Window,
    symbolize::{SymbolizedSample, SymbolizedStack},
};

fn profile(comm: &str, thread_name: &str) -> Profile {
    Profile {
        window: Window {
            start_ms: 1_795_348_800_000,
            end_ms: 1_795_348_810_000,
        },
        frequency: 99,
        alloc_interval: 0,
        profile_type: ProfileType::Cpu,
        samples: vec![SymbolizedSample {
            kind: crate::kind::SampleKind::Cpu,
            pid: 7,
            tid: 8,
            comm: comm.into(),
            readable_by: crate::collect::ReadableBy::Privileged,
            thread_name: thread_name.into(),
            stack: Arc::new(SymbolizedStack {
                locations: Box::new([]),
            }),
            count: 10,
            amount: 5_000_000_000,
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
        Span::Last(10),
        recorded(false),
    );
    assert!(!page.contains("<script>alert"), "{page}");
    assert!(!page.contains("<img"), "{page}");
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{page}");
    assert!(page.contains("title=\"&quot;&gt;&lt;img"), "{page}");
}

#[test]
fn rows_show_cpu_share_threads_and_links() {
    let page = page(
        &profile("worker", "worker"),
        &Filter::default(),
        Span::Last(10),
        recorded(false),
    );
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
    let page = page(
        &profile("worker", "worker"),
        &Filter::default(),
        Span::Last(10),
        recorded(false),
    );
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
    assert!(
        page(&empty, &Filter::default(), Span::Last(10), recorded(false))
            .contains("no samples in this window")
    );
}

#[test]
fn the_type_is_shown_and_switchable_when_off_cpu_is_on() {
    let cpu = page(
        &profile("worker", "worker"),
        &Filter::default(),
        Span::Last(10),
        recorded(true),
    );
    assert!(
        cpu.contains("type: <b>CPU</b> · <a href=\"/?seconds=10&amp;type=offcpu\">off-CPU</a> · <a href=\"/?seconds=10&amp;type=wall\">wall-clock</a>"),
        "{cpu}"
    );
    let off = page(
        &profile("worker", "worker"),
        &Filter::default(),
        Span::Last(10),
        recorded(false),
    );
    assert!(off.contains("start profilerd with --off-cpu"), "{off}");
    assert!(
        !off.contains("type=offcpu"),
        "no links to profiles that are off: {off}"
    );

    let mut waits = profile("worker", "worker");
    waits.profile_type = ProfileType::OffCpu;
    waits.samples[0].kind = crate::kind::SampleKind::OffCpuBlocked;
    waits.samples[0].amount = 2_500_000_000;
    let page = page(&waits, &Filter::default(), Span::Last(10), recorded(true));
    assert!(
        page.contains("<a href=\"/?seconds=10&amp;type=cpu\">CPU</a> · <b>off-CPU</b>"),
        "{page}"
    );
    assert!(page.contains("off-CPU: all processes — 10.0 s"), "{page}");
    assert!(
        page.contains("<th class=n>off-CPU</th>") && page.contains("<th class=n>events</th>"),
        "{page}"
    );
    assert!(
        page.contains("<td class=n>25.0%</td>"),
        "2.5 s waited in a 10 s window: {page}"
    );
    for link in [
        "/flamegraph.svg?pid=7&amp;seconds=10&amp;type=offcpu",
        "/pprof?pid=7&amp;seconds=10&amp;type=offcpu",
        "/top?seconds=10&amp;type=offcpu",
    ] {
        assert!(page.contains(link), "{link} in {page}");
    }
}

#[test]
fn links_ask_for_the_same_explicit_window() {
    let window = Span::Between(Window {
        start_ms: 1_000,
        end_ms: 6_000,
    });
    let page = page(&profile("w", "w"), &Filter::default(), window, recorded(true));
    for link in [
        "/pprof?pid=7&amp;start=1000&amp;end=6000\"",
        "/?start=1000&amp;end=6000&amp;type=wall",
        "/folded?start=1000&amp;end=6000\"",
    ] {
        assert!(page.contains(link), "{link} in {page}");
    }
}

/// The kinds a daemon records with off-CPU profiling on or off.
fn recorded(off_cpu: bool) -> crate::kind::KindSet {
    crate::kind::KindSet::produced_by(|source| off_cpu || source == crate::kind::Source::CpuClock)
}
