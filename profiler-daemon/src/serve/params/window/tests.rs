//! `start` and `end`, through the parsers of the endpoints that take them.

use super::super::{
    GoParams, Limits, ParamError, ProfileParams, parse_go_profile, parse_pprof, parse_with_options,
};
use super::{Span, stored_part};
use crate::{kind::ProfileType, profile::Window};

const LIMITS: Limits = Limits {
    pid_max: 4_194_304,
    max_seconds: 300,
};

fn pprof(query: &str) -> Result<ProfileParams, ParamError> {
    parse_pprof(Some(query), &LIMITS)
}

fn go(query: &str) -> Result<GoParams, ParamError> {
    parse_go_profile(Some(query), &LIMITS, ProfileType::Cpu)
}

fn message<T: std::fmt::Debug>(result: Result<T, ParamError>) -> String {
    result.expect_err("should be rejected").to_string()
}

fn between(start_ms: u64, end_ms: u64) -> Result<Span, ParamError> {
    Ok(Span::Between(Window { start_ms, end_ms }))
}

#[test]
fn start_and_end_are_the_window_exactly() {
    let params = pprof("pid=3&start=1700000000001&end=1700000005001&type=wall").expect("accepted");
    assert_eq!(Ok(params.span), between(1_700_000_000_001, 1_700_000_005_001));
    assert_eq!(
        (params.filter.pids, params.profile_type),
        (vec![3], ProfileType::Wall)
    );
    // Either order; as long as the retention (300 s), and no longer.
    assert_eq!(pprof("end=300000&start=0").map(|p| p.span), between(0, 300_000));
    assert_eq!(pprof("start=5&end=6").map(|p| p.span), between(5, 6));
    assert_eq!(
        message(pprof("start=0&end=300001")),
        "start to end is 300001 ms; at most 300000 ms (the retention) is accepted"
    );
    // The views take them as /pprof does.
    let (params, options) =
        parse_with_options(Some("start=10&end=20&format=json"), &LIMITS, &["format"]).expect("accepted");
    assert_eq!((Ok(params.span), options.len()), (between(10, 20), 1));
}

#[test]
fn start_and_end_come_together_once_as_integers_without_seconds() {
    for (query, expected) in [
        (
            "start=1000",
            "start without end: a window needs both start and end, in Unix milliseconds (start inclusive, end exclusive)",
        ),
        (
            "pid=1&end=1000",
            "end without start: a window needs both start and end, in Unix milliseconds (start inclusive, end exclusive)",
        ),
        (
            "start=1&start=1&end=2",
            "start: given more than once; expected a single value",
        ),
        (
            "start=1&end=2&end=3",
            "end: given more than once; expected a single value",
        ),
        (
            "start=5&end=5",
            "start 5 is not before end 5; expected start < end (Unix milliseconds, end exclusive)",
        ),
        (
            "start=6&end=5",
            "start 6 is not before end 5; expected start < end (Unix milliseconds, end exclusive)",
        ),
    ] {
        assert_eq!(message(pprof(query)), expected, "{query}");
    }
    let both = "seconds cannot be given with start or end: seconds=N asks for the last N seconds, start and end for a window in Unix milliseconds; give one or the other";
    for query in [
        "seconds=5&start=1&end=2",
        "start=1&end=2&seconds=5",
        "seconds=5&end=2",
    ] {
        assert_eq!(message(pprof(query)), both, "{query}");
    }
    for value in [
        "",
        "-1",
        "+5",
        "1.5",
        "1e12",
        "abc",
        "18446744073709551616",
        "%201",
    ] {
        for name in ["start", "end"] {
            let query = if name == "start" {
                format!("start={value}&end=9")
            } else {
                format!("start=1&end={value}")
            };
            let decoded = form_urlencoded::parse(value.as_bytes())
                .next()
                .map_or_else(String::new, |(decoded, _)| decoded.into_owned());
            assert_eq!(
                message(pprof(&query)),
                format!(
                    "{name}: {decoded:?} is not accepted; expected a Unix time in milliseconds (digits only)"
                ),
                "{query}"
            );
        }
    }
}

#[test]
fn go_paths_know_no_start_or_end() {
    let params = go("start=1&end=2&seconds=5").expect("ignored, as Go ignores what it does not know");
    assert_eq!(params.seconds, 5);
    assert_eq!(go("start=abc").map(|p| p.seconds), Ok(30));
}

#[test]
fn a_window_is_cut_at_the_newest_stored_drain() {
    let window = Window {
        start_ms: 1_000,
        end_ms: 5_000,
    };
    // In the past: as asked.
    assert_eq!(stored_part(window, Some(4_999)), window);
    assert_eq!(stored_part(window, Some(9_000)), window);
    // Ending after the newest drain: up to it, included.
    assert_eq!(stored_part(window, Some(3_000)).end_ms, 3_001);
    // Wholly after it, or nothing stored: empty, where it was asked.
    for newest in [Some(500), None] {
        assert_eq!(
            stored_part(window, newest),
            Window {
                start_ms: 1_000,
                end_ms: 1_000
            }
        );
    }
}
