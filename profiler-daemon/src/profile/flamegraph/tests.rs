use std::sync::Arc;

use super::*;
use crate::{
    kind::SampleKind,
    symbolize::{FrameKind, Function, Line, Location, SymbolizedSample, SymbolizedStack},
};

/// One sample per (comm, stack leaf first).
fn profile(samples: &[(&str, &[(&str, FrameKind)])]) -> Profile {
    let samples = samples
        .iter()
        .map(|(comm, frames)| SymbolizedSample {
            kind: SampleKind::Cpu,
            pid: 7,
            tid: 7,
            comm: (*comm).into(),
            readable_by: crate::collect::ReadableBy::Privileged,
            thread_name: (*comm).into(),
            stack: Arc::new(SymbolizedStack {
                locations: frames
                    .iter()
                    .map(|(name, kind)| Location {
                        kind: *kind,
                        address: 0,
                        mapping: None,
                        lines: Arc::new([Line {
                            function: Arc::new(Function {
                                name: (*name).into(),
                                system_name: (*name).into(),
                                filename: None,
                            }),
                            line: 0,
                        }]),
                        resolved: true,
                    })
                    .collect(),
            }),
            count: 10,
            amount: 1_000_000,
            cgroup: None,
            ns_pid: None,
        })
        .collect();
    Profile {
        window: Window {
            start_ms: 1_795_348_800_000,
            end_ms: 1_795_348_810_000,
        },
        frequency: 99,
        alloc_interval: 0,
        profile_type: ProfileType::Cpu,
        samples,
    }
}

fn svg(profile: &Profile, icicle: bool) -> String {
    let mut out = Vec::new();
    write(profile, "a title", icicle, &mut out).expect("writing to a Vec");
    String::from_utf8(out).expect("utf-8")
}

/// The `fill="rgb(r,g,b)"` of the frame whose tooltip starts with `name`.
fn fill_of(svg: &str, name: &str) -> (u8, u8, u8) {
    let at = svg
        .find(&format!("<title>{name} ("))
        .unwrap_or_else(|| panic!("no frame {name} in {svg}"));
    let rgb = &svg[at..];
    let rgb = &rgb[rgb.find("fill=\"rgb(").expect("a fill") + 10..];
    let parts: Vec<u8> = rgb[..rgb.find(')').expect("rgb(...)")]
        .split(',')
        .map(|part| part.trim().parse().expect("a colour component"))
        .collect();
    (parts[0], parts[1], parts[2])
}

#[test]
fn an_empty_profile_is_still_an_svg_with_an_escaped_title() {
    let profile = Profile {
        window: Window::ALL,
        frequency: 99,
        alloc_interval: 0,
        profile_type: ProfileType::Cpu,
        samples: Vec::new(),
    };
    let mut out = Vec::new();
    write(&profile, "pid <1> & co", false, &mut out).expect("writing to a Vec");
    let svg = String::from_utf8(out).expect("utf-8");
    assert!(
        svg.starts_with("<?xml") && svg.contains("pid &lt;1&gt; &amp; co"),
        "{svg}"
    );
}

#[test]
fn names_from_processes_are_escaped() {
    let svg = svg(
        &profile(&[(
            "<script>alert(1)</script>",
            &[("f\"<img src=x onerror=alert(2)>", FrameKind::User)],
        )]),
        false,
    );
    assert!(!svg.contains("<script>alert"), "{svg}");
    assert!(!svg.contains("<img"), "{svg}");
    assert!(svg.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{svg}");
}

#[test]
fn control_characters_cannot_break_the_xml() {
    let svg = svg(
        &profile(&[("bad\u{1}comm", &[("f\u{0}\u{7f}\u{ffff}x", FrameKind::User)])]),
        false,
    );
    let bad: Vec<char> = svg
        .chars()
        .filter(|c| (c.is_control() && !matches!(c, '\n' | '\r' | '\t')) || *c == '\u{ffff}')
        .collect();
    assert!(bad.is_empty(), "{bad:?}");
    assert!(svg.contains("bad\u{fffd}comm"), "replaced, not dropped");
    assert_eq!(escape_xml("a\u{0}b\tc"), "a\u{fffd}b\u{fffd}c");
}

#[test]
fn kernel_frames_are_orange_and_user_frames_are_not() {
    let svg = svg(
        &profile(&[(
            "app",
            &[("clear_page_erms", FrameKind::Kernel), ("work", FrameKind::User)],
        )]),
        false,
    );
    // inferno shows kernel names without their `_[k]`, in orange: no blue,
    // where the red of user frames always has some.
    let (red, _, blue) = fill_of(&svg, "clear_page_erms");
    assert!(red >= 190 && blue == 0, "kernel: rgb({red},_,{blue})");
    let (_, _, blue) = fill_of(&svg, "work");
    assert!(blue > 0, "user frames are not orange");
}

#[test]
fn icicle_graphs_are_inverted() {
    let profile = profile(&[("app", &[("work", FrameKind::User)])]);
    assert!(svg(&profile, true).contains("var inverted = true"));
    assert!(svg(&profile, false).contains("var inverted = false"));
}

#[test]
fn titles_name_the_processes_and_the_window() {
    let window = profile(&[]).window;
    let pids = Filter {
        pids: vec![7, 8],
        ..Filter::default()
    };
    assert_eq!(
        title(ProfileType::Cpu, &pids, &window),
        "CPU: pid 7,8 — 10.0 s from 2026-11-22 12:00:00 UTC"
    );
    let mixed = Filter {
        pids: vec![7],
        tids: vec![9],
        comms: vec!["nginx".into(), "redis".into()],
        ..Filter::default()
    };
    assert!(title(ProfileType::Cpu, &mixed, &window).starts_with("CPU: pid 7, tid 9, comm nginx,redis — "));
    assert!(title(ProfileType::Cpu, &Filter::default(), &window).starts_with("CPU: all processes — "));
    assert!(title(ProfileType::OffCpu, &Filter::default(), &window).starts_with("off-CPU: all processes — "));
    assert!(title(ProfileType::Wall, &pids, &window).starts_with("wall-clock: pid 7,8 — "));
}

#[test]
fn off_cpu_frames_are_as_wide_as_their_nanoseconds() {
    let mut profile = profile(&[("app", &[("wait", FrameKind::User)])]);
    profile.profile_type = ProfileType::OffCpu;
    let svg = svg(&profile, false);
    assert!(svg.contains("<title>wait (1,000,000 ns, 100.00%)"), "{svg}");
}

#[test]
fn dates_are_gregorian() {
    assert_eq!(utc_time(0), "1970-01-01 00:00:00 UTC");
    // A leap day, and the day after a century that is not a leap year.
    assert_eq!(utc_time(951_782_400), "2000-02-29 00:00:00 UTC");
    assert_eq!(utc_time(4_107_542_400), "2100-03-01 00:00:00 UTC");
    assert_eq!(utc_time(1_795_348_799), "2026-11-22 11:59:59 UTC");
}
