//! Issue 16, the Pyroscope push: a real Pyroscope server cannot be built
//! here, so what the daemon sends is checked against Pyroscope's published
//! Push API (push.v1.PusherService/Push, v2.2.1) field by field, with a
//! schema-less protobuf reader and `go tool pprof` as independent readers,
//! and the daemon's retry rules against the answers a Pyroscope server
//! gives: 503 (unavailable) is sent again, 400 (invalid_argument) is not.

use std::{
    collections::HashSet,
    path::Path,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use profilerd_tests::{
    Workload,
    capture::{CaptureServer, Reply, Request},
    daemon::{Daemon, go_pprof, metric, parse_raw},
    pyroscope::{
        MAX_UNCOMPRESSED_PROFILE, ProfileTimes, check_pprof, check_sample_id, check_series_labels,
        decode_push_request, gunzip_profile,
    },
    serial,
};

const SPLIT: &str = env!("WORKLOAD_SPLIT");
const TOKEN: &str = "pyroscope-test-token";
const TENANT: &str = "tenant-1";
/// Pushes answered at least: the first refused for a while (503), then
/// accepted, one refused for good (400), accepted again; then more until
/// they span `WINDOWS` windows (the last one begun: three whole ones and
/// more, enough of the workload's samples). A window is one request per service, so
/// how many a window takes depends on what else the machine runs (the
/// suite's other lane starts systemd units by the dozen).
const PUSHES: usize = 40;
const WINDOWS: usize = 4;
/// Gives up waiting for `WINDOWS` windows after this many pushes.
const MAX_PUSHES: usize = 1000;
/// The workload's name (a link to the split workload): the suite's other
/// lane runs `split` processes of its own at the same time.
const NAME: &str = "pyroscope_split";
const UNAVAILABLE_AT: usize = 0;
const INVALID_AT: usize = 4;
/// Pyroscope's ingestion window (reject_older_than, reject_newer_than).
const OLDEST: Duration = Duration::from_secs(3600);
const NEWEST: Duration = Duration::from_secs(600);

/// One push as it came, and what it was answered.
struct Push {
    request: Request,
    status: u16,
    /// When it came (Unix ns), for the ingestion window.
    at_nanos: i64,
}

#[test]
fn pushes_follow_the_pyroscope_push_api() {
    let _serial = serial();
    let workload = Workload::spawn_as(SPLIT, NAME, &["120"]);
    let capture = CaptureServer::start();
    let scratch = std::env::temp_dir().join(format!("profilerd-pyroscope-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("creating the test's directory");
    let token_file = scratch.join("token");
    // A trailing newline, as an editor leaves it: not part of the token.
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("writing the token file");
    let target = format!("http://127.0.0.1:{}", capture.port);
    let daemon = Daemon::start(&[
        "--push",
        &format!("pyroscope={target}"),
        "--push-interval-seconds",
        "2",
        "--push-label",
        "env=test",
        "--push-tenant",
        TENANT,
        "--push-bearer-token-file",
        token_file.to_str().expect("a UTF-8 temp path"),
    ]);

    let mut pushes: Vec<Push> = Vec::new();
    let mut metrics = String::new();
    let mut starts: Vec<i64> = Vec::new();
    for index in 0.. {
        let exchange = capture.next(Duration::from_secs(30));
        let at_nanos = unix_nanos();
        let start = window_start(&exchange.request.body);
        if !starts.contains(&start) {
            starts.push(start);
        }
        let last = (index + 1 >= PUSHES && starts.len() >= WINDOWS) || index + 1 == MAX_PUSHES;
        if last {
            // The sender sends one window at a time: every push before this
            // one has been counted.
            metrics = daemon.get("/metrics").text();
        }
        let reply = match index {
            UNAVAILABLE_AT => error(503, "unavailable", "test: the ingesters are down"),
            INVALID_AT => error(400, "invalid_argument", "test: this profile is refused"),
            _ => Reply {
                status: 200,
                content_type: "application/proto",
                body: Vec::new(),
            },
        };
        pushes.push(Push {
            request: exchange.request.clone(),
            status: reply.status,
            at_nanos,
        });
        exchange.reply(reply);
        if last {
            break;
        }
    }
    // The daemon's last window at its stop finds no server.
    drop(capture);
    drop(daemon);
    drop(workload);

    eprintln!("the first push's headers: {:?}", pushes[0].request.headers);
    for push in &pushes {
        check_transport(&push.request, &target);
    }
    check_retries(&pushes);
    let windows = check_windows(&pushes, &scratch);
    check_split_share(&windows);
    check_metrics(&metrics, &target, pushes.len() - 1);
    let _ = std::fs::remove_dir_all(&scratch);
}

/// The start (Unix ns) of the window a push carries.
fn window_start(body: &[u8]) -> i64 {
    let request = decode_push_request(body);
    let sample = request
        .series
        .first()
        .and_then(|series| series.samples.first())
        .expect("a push with a profile");
    check_pprof(&gunzip_profile(&sample.raw_profile)).time_nanos
}

fn error(status: u16, code: &str, message: &str) -> Reply {
    Reply {
        status,
        content_type: "application/json",
        body: serde_json::json!({ "code": code, "message": message })
            .to_string()
            .into_bytes(),
    }
}

fn unix_nanos() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970");
    i64::try_from(since.as_nanos()).expect("nanoseconds within i64")
}

/// A Connect unary call over HTTP/1.1, as connect-go's client sends it.
fn check_transport(request: &Request, target: &str) {
    let shown = format!("{} {} {}", request.method, request.path, request.version);
    assert_eq!(
        (
            request.method.as_str(),
            request.path.as_str(),
            request.version.as_str()
        ),
        ("POST", "/push.v1.PusherService/Push", "HTTP/1.1"),
        "expected POST /push.v1.PusherService/Push HTTP/1.1, got {shown}"
    );
    let expect = |name: &str, value: &str| {
        assert_eq!(
            request.header(name),
            Some(value),
            "expected `{name}: {value}`; headers {:?}",
            request.headers
        );
    };
    expect("content-type", "application/proto");
    expect("connect-protocol-version", "1");
    expect("authorization", &format!("Bearer {TOKEN}"));
    expect("x-scope-orgid", TENANT);
    expect("host", target.trim_start_matches("http://"));
    expect("content-length", &request.body.len().to_string());
    let agent = request.header("user-agent").unwrap_or_default();
    assert!(
        agent.contains("profilerd"),
        "expected a User-Agent naming profilerd, got {agent:?}"
    );
    // The body is the bare message: Connect compresses only when told so.
    assert_eq!(
        request.header("content-encoding"),
        None,
        "expected an uncompressed body"
    );
    // Optional; when sent, Connect allows at most 10 digits.
    if let Some(timeout) = request.header("connect-timeout-ms") {
        assert!(
            (1..=10).contains(&timeout.len())
                && timeout.bytes().all(|b| b.is_ascii_digit())
                && timeout != "0",
            "expected Connect-Timeout-Ms of 1 to 10 digits, not 0, got {timeout:?}"
        );
    }
}

/// The unavailable push is sent again unchanged after a backoff; the
/// refused one never again; nothing accepted is sent twice.
fn check_retries(pushes: &[Push]) {
    let first = &pushes[UNAVAILABLE_AT].request;
    let again = &pushes[UNAVAILABLE_AT + 1].request;
    assert!(
        first.body == again.body,
        "expected the push answered 503 to be sent again with the same body ({} bytes), got {} other bytes",
        first.body.len(),
        again.body.len()
    );
    // The daemon's first backoff: drawn in [0.5 s, 1 s] (Alloy's: 0.5 s to 1 s).
    let waited = again.received.duration_since(first.received);
    assert!(
        waited >= Duration::from_millis(450),
        "expected the retry after a backoff of 0.5 s or more, it came after {waited:?}"
    );
    let mut bodies = HashSet::new();
    for (index, push) in pushes.iter().enumerate() {
        if index == UNAVAILABLE_AT {
            continue;
        }
        assert!(
            bodies.insert(push.request.body.as_slice()),
            "expected push {index} (answered {}) to be new, got a body sent before",
            push.status
        );
    }
}

/// One window as pushed: its times, and its samples of the workload.
struct Window {
    times: ProfileTimes,
    /// The services of its requests, each once.
    services: Vec<String>,
    /// `go tool pprof -raw` of the workload's series, if it came.
    split: Vec<profilerd_tests::daemon::RawSample>,
}

/// Every push's message and profile against the Push API, and the windows
/// they carry: one series per request (Pyroscope may keep some series of a
/// request it answers with an error, so a retry of several would count
/// those twice); a window's requests one after another, each service once;
/// windows contiguous.
fn check_windows(pushes: &[Push], scratch: &Path) -> Vec<Window> {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("reading the hostname")
        .trim()
        .to_owned();
    let mut windows: Vec<Window> = Vec::new();
    for (index, push) in pushes.iter().enumerate() {
        if index == UNAVAILABLE_AT + 1 {
            // The same bytes as the push before (checked above).
            continue;
        }
        let request = decode_push_request(&push.request.body);
        check_series_labels(&request, &hostname, &[("env", "test")]);
        assert_eq!(
            request.series.len(),
            1,
            "expected one series per request in push {index}, got {}",
            request.series.len()
        );
        let series = &request.series[0];
        assert_eq!(
            series.samples.len(),
            1,
            "expected one profile in push {index}'s series"
        );
        let sample = &series.samples[0];
        check_sample_id(&sample.id);
        let profile = gunzip_profile(&sample.raw_profile);
        assert!(
            profile.len() < MAX_UNCOMPRESSED_PROFILE,
            "expected each profile under 2 MiB uncompressed (Pyroscope's burst limit), got {} bytes for {:?}",
            profile.len(),
            series.labels
        );
        let times = check_pprof(&profile);
        let lower = push.at_nanos - OLDEST.as_nanos() as i64;
        let upper = push.at_nanos + NEWEST.as_nanos() as i64;
        assert!(
            lower < times.time_nanos && times.time_nanos < upper,
            "expected time_nanos within Pyroscope's ingestion window ({lower}, {upper}), got {}",
            times.time_nanos
        );
        assert!(
            times.duration_nanos > 0,
            "expected duration_nanos set, got {times:?}"
        );
        let service = series
            .label("service_name")
            .unwrap_or_else(|| panic!("expected a service_name in push {index}"))
            .to_owned();
        let raw = read_with_go_pprof(&profile, scratch, index);
        // What was pushed, for whoever reads the test's output.
        eprintln!(
            "push {index} (answered {}): {} bytes, service {service}, window {} ms + {} ms",
            push.status,
            push.request.body.len(),
            times.time_nanos / 1_000_000,
            times.duration_nanos / 1_000_000
        );
        match windows.last_mut() {
            Some(window) if window.times == times => {
                assert!(
                    !window.services.contains(&service),
                    "push {index}: service {service} of window {times:?} came twice"
                );
                window.services.push(service.clone());
                if service == NAME {
                    window.split = raw;
                }
            }
            previous => {
                if let Some(previous) = previous {
                    let end_ms = (previous.times.time_nanos + previous.times.duration_nanos) / 1_000_000;
                    assert_eq!(
                        times.time_nanos / 1_000_000,
                        end_ms,
                        "expected push {index}'s window to start (ms) where the previous one ended, got {times:?} after {:?}",
                        previous.times
                    );
                }
                let split = if service == NAME { raw } else { Vec::new() };
                windows.push(Window {
                    times,
                    services: vec![service],
                    split,
                });
            }
        }
    }
    assert!(
        windows.len() >= 3,
        "expected the pushes to span at least 3 windows, got {}",
        windows.len()
    );
    windows
}

/// `go tool pprof -raw` of an uncompressed profile: its period type, sample
/// types and no sample labels at all; returns its samples.
fn read_with_go_pprof(
    profile: &[u8],
    scratch: &Path,
    index: usize,
) -> Vec<profilerd_tests::daemon::RawSample> {
    let file = scratch.join(format!("push-{index}.pb"));
    std::fs::write(&file, profile).expect("writing a pushed profile");
    let raw = go_pprof(&["-raw", file.to_str().expect("a UTF-8 temp path")]);
    assert!(
        raw.lines().any(|line| line == "PeriodType: cpu nanoseconds"),
        "expected period type cpu/nanoseconds, go tool pprof -raw says:\n{raw}"
    );
    let sample_types = raw
        .lines()
        .skip_while(|line| *line != "Samples:")
        .nth(1)
        .unwrap_or_default();
    assert_eq!(
        sample_types.split_whitespace().collect::<Vec<_>>(),
        ["samples/count", "cpu/nanoseconds"],
        "expected sample types samples/count and cpu/nanoseconds"
    );
    let samples = parse_raw(&raw);
    assert!(
        !samples.is_empty(),
        "expected samples, go tool pprof -raw says:\n{raw}"
    );
    if let Some(labelled) = samples.iter().find(|sample| !sample.labels.is_empty()) {
        panic!(
            "expected no sample labels (Pyroscope makes series of string labels), got {:?}",
            labelled.labels
        );
    }
    samples
}

/// hot_a's share of hot_a + hot_b in the workload's series, over the windows.
fn check_split_share(windows: &[Window]) {
    let flat = |function: &str| -> i64 {
        windows
            .iter()
            .flat_map(|window| &window.split)
            .filter(|sample| sample.functions.first().map(String::as_str) == Some(function))
            .map(|sample| sample.values[0])
            .sum()
    };
    let (a, b) = (flat("hot_a"), flat("hot_b"));
    assert!(
        a + b >= 200,
        "expected at least 200 samples of hot_a and hot_b, got {a} + {b}"
    );
    let share = a as f64 / (a + b) as f64;
    assert!(
        (share - 0.75).abs() <= 0.10,
        "expected hot_a's share of hot_a + hot_b within 0.10 of 0.75, got {share:.3} ({a} / {})",
        a + b
    );
}

/// /metrics when the last push came: every answer counted by its outcome.
fn check_metrics(text: &str, target: &str, answered: usize) {
    let name = format!("pyroscope {target}");
    let value = |family: &str, label: &str, value: &str| {
        metric(
            text,
            &format!("profilerd_{family}_total{{target=\"{name}\",{label}=\"{value}\"}}"),
        )
    };
    let failed = 1;
    let refused = 1;
    let accepted = answered as u64 - failed - refused;
    for (family, label, outcome, expected) in [
        ("push_attempts", "outcome", "accepted", accepted),
        ("push_attempts", "outcome", "failed", failed),
        ("push_attempts", "outcome", "refused", refused),
        ("push_dropped_windows", "reason", "refused", refused),
        ("push_dropped_windows", "reason", "spool_full", 0),
    ] {
        assert_eq!(
            value(family, label, outcome),
            expected,
            "expected profilerd_{family}_total{{target=\"{name}\",{label}=\"{outcome}\"}} {expected}"
        );
    }
}
