//! profilerd in a fleet, against a real Parca server (v0.21.0, built from
//! its Go module once per machine; see tests/src/parca.rs): Parca scrapes
//! profilerd; profilerd pushes to Parca; Parca goes away for a minute and
//! comes back; a small spool gives up the oldest windows. Parca is read back
//! through its own query API and compared with profilerd's own answers.

use std::{
    net::Ipv4Addr,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use profilerd_tests::{
    Workload,
    daemon::{Daemon, free_port, metric},
    fleet::{exact_start, own_top, share},
    parca::Parca,
    pki::{Pki, Usage},
    serial,
};

const SPLIT: &str = env!("WORKLOAD_SPLIT");
/// The workload's name in these tests (a link to the split workload): the
/// suite's other lane runs `split` processes of its own at the same time,
/// and Parca's series are found by name.
const NAME: &str = "parca_split";
/// The CPU profile type, as Parca names what both paths store.
const CPU: &str = "process_cpu:samples:count:cpu:nanoseconds:delta";
/// Parca reports samples as samples × period: 1e9 / 99 Hz.
const PERIOD_NS: i64 = 1_000_000_000 / 99;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_millis() as u64
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("the hostname")
        .trim()
        .to_owned()
}

/// Waits until `ready` holds, polling; panics with `what` after `limit`.
fn wait_until(limit: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if ready() {
            return;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("waited {limit:?} for {what}");
}

fn push_metric(daemon: &Daemon, name: &str, target: &str, extra: &str) -> u64 {
    let text = daemon.get("/metrics").text();
    metric(&text, &format!("profilerd_{name}{{target=\"{target}\"{extra}}}"))
}

/// hot_a's and hot_b's shares in Parca's top and in profilerd's own for the
/// same window, within 2 points of each other.
fn assert_same_shares(
    parca: &std::collections::HashMap<String, i64>,
    own: &std::collections::HashMap<String, i64>,
    what: &str,
) {
    // The totals tell a real disagreement from two different sets of samples.
    eprintln!(
        "{what}: {} samples in Parca, {} in /top",
        parca.values().sum::<i64>() / PERIOD_NS,
        own.values().sum::<i64>()
    );
    for function in ["hot_a", "hot_b"] {
        let (theirs, ours) = (share(parca, function), share(own, function));
        eprintln!(
            "{what}: {function} {:.2}% in Parca, {:.2}% in /top",
            theirs * 100.0,
            ours * 100.0
        );
        assert!(
            (theirs - ours).abs() <= 0.02,
            "{what}: {function} is {:.2}% of the workload's samples in Parca and {:.2}% in profilerd's /top \
             (expected within 2 points)\nParca: {parca:?}\nprofilerd: {own:?}",
            theirs * 100.0,
            ours * 100.0
        );
    }
    assert!(
        share(own, "hot_a") > 0.5,
        "{what}: expected hot_a to dominate the split workload: {own:?}"
    );
}

#[test]
fn parca_scrapes_the_go_endpoint_and_sees_the_same_shares_as_top() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    let scrape = format!(
        "  - job_name: \"profilerd\"\n    scrape_interval: \"5s\"\n    scrape_timeout: \"10s\"\n    static_configs:\n      - targets: [\"{}\"]\n\
         \x20   profiling_config:\n      pprof_config:\n        process_cpu:\n          enabled: true\n          delta: true\n          path: /debug/pprof/profile\n\
         \x20       memory:\n          enabled: false\n        block:\n          enabled: false\n        mutex:\n          enabled: false\n        goroutine:\n          enabled: false\n",
        daemon.addr
    );
    let parca = Parca::start("scrape", &scrape);
    let started = now_ms();
    let every = format!("{CPU}{{job=\"profilerd\"}}");
    // The workload starts once Parca has stored a scrape and a second is
    // under way (Parca's next tick is due as one ends), so every sample it
    // takes lies in a scraped window. Started with Parca instead, its first
    // seconds fell before the first scrape on a loaded machine, where
    // profilerd's /top still had them: the two compared different samples
    // (143 against 165) and their shares differed by 2.01 points.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let complaint = match parca.holds_profiles(&every, started, now_ms()) {
            Ok(true) => break,
            Ok(false) => "none yet".to_owned(),
            Err(err) => err,
        };
        assert!(
            Instant::now() < deadline,
            "waited 60 s for Parca's first scrape; the last query: {complaint}\n{}",
            parca.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    std::thread::sleep(Duration::from_secs(1));
    let workload = Workload::spawn_as(SPLIT, NAME, &["16"]);
    let pid = workload.pid();
    workload.wait();
    // The scrape in flight when the workload ended, and the one after.
    std::thread::sleep(Duration::from_secs(11));
    let ended = now_ms();
    let query = format!("{CPU}{{job=\"profilerd\",comm=\"{NAME}\"}}");
    let scrapes = parca.profiles(&every, started, ended);
    assert!(
        scrapes.len() >= 3,
        "expected Parca to have scraped at least 3 profiles while the workload ran its 16 s and 11 s after, got \
         {scrapes:?}\n{}",
        parca.log()
    );
    let theirs = parca.top(&query, started, ended);
    // The scraped windows' span (Parca reports their starts to the second).
    let first = scrapes.first().map(|(start, ..)| *start).unwrap_or(started);
    let last = scrapes
        .iter()
        .map(|(start, duration, _)| start + duration + 1000)
        .max()
        .unwrap_or(ended);
    let (ours, _) = own_top(&daemon, &format!("&pid={pid}"), first, last);
    assert_same_shares(&theirs, &ours, "scraped by Parca");
}

#[test]
fn pushed_windows_reach_parca_under_the_expected_labels_with_the_same_shares() {
    let _serial = serial();
    let parca = Parca::start("push", "");
    let target = format!("parca=http://{}", parca.addr());
    let daemon = Daemon::start(&[
        "--push",
        &target,
        "--push-interval-seconds",
        "2",
        "--push-label",
        "env=fleet-test",
        // Off-CPU waits are pushed too, under their own type.
        "--off-cpu",
    ]);
    let started = now_ms();
    let workload = Workload::spawn_as(SPLIT, NAME, &["10"]);
    workload.wait();
    let workload_ended = now_ms();
    let host = hostname();
    // Every process of the host is in this series (the daemon itself runs
    // in every window), so it shows when the windows after the workload's
    // end have arrived. Under load they arrive late: waiting a fixed time
    // compared Parca without its last window against /top with it.
    let host_series = format!("{CPU}{{hostname=\"{host}\",env=\"fleet-test\"}}");
    wait_until(
        Duration::from_secs(60),
        "a pushed window that starts after the workload ended",
        || {
            parca
                .profiles(&host_series, started, now_ms() + 1000)
                .iter()
                .any(|(start, ..)| *start >= workload_ended + 1000)
        },
    );
    let ended = now_ms();
    let series = format!("{CPU}{{service_name=\"{NAME}\",hostname=\"{host}\",env=\"fleet-test\"}}");
    let windows = parca.profiles(&series, started, ended);
    assert!(
        windows.len() >= 4,
        "expected a pushed window every 2 s for the workload's 10 s, got {windows:?}\n{}",
        parca.log()
    );
    let theirs = parca.top(&series, started, ended);
    // /top over exactly the windows Parca holds, each from its exact start.
    let mut ours = std::collections::HashMap::new();
    for &(floor_ms, duration_ms, _) in &windows {
        let start = exact_start(&daemon, floor_ms, duration_ms).unwrap_or_else(|| {
            panic!("no drain of profilerd's starts a {duration_ms} ms window in the second at {floor_ms}")
        });
        let (own, _) = own_top(&daemon, &format!("&comm={NAME}"), start, start + duration_ms);
        for (function, samples) in own {
            *ours.entry(function).or_insert(0) += samples;
        }
    }
    assert_same_shares(&theirs, &ours, "pushed to Parca");
    let names = parca.label_names(started, ended);
    // `__name__` is the profile type Parca was queried by.
    for expected in ["service_name", "hostname", "env"] {
        assert!(
            names.iter().any(|name| name == expected),
            "expected a {expected} label in Parca, got {names:?}"
        );
    }
    for churning in ["thread_id", "thread_name", "tid"] {
        assert!(
            !names.iter().any(|name| name == churning),
            "{churning} must not reach Parca: {names:?}"
        );
    }
    assert_off_cpu_pushed(&parca, &host, started, ended);
    let parca_target = format!("parca http://{}", parca.addr());
    assert!(
        push_metric(
            &daemon,
            "push_attempts_total",
            &parca_target,
            ",outcome=\"accepted\""
        ) >= 4
    );
    assert!(push_metric(&daemon, "push_bytes_total", &parca_target, "") > 0);
}

/// Off-CPU windows reach Parca as a profile type of their own (the
/// OpenTelemetry profiler's sample types, `events/count` and
/// `off_cpu/nanoseconds`), beside CPU's, with time in them.
fn assert_off_cpu_pushed(parca: &Parca, host: &str, started: u64, ended: u64) {
    let types = parca.profile_types();
    assert!(
        types
            .iter()
            .any(|name| name.starts_with(CPU.trim_end_matches(":delta"))),
        "expected the CPU type among Parca's types, got {types:?}"
    );
    let off_cpu = types
        .iter()
        .find(|name| name.starts_with("off_cpu:events:count:off_cpu:nanoseconds"))
        .unwrap_or_else(|| {
            panic!("expected an off_cpu type (events/count, off_cpu/nanoseconds) in Parca, got {types:?}")
        });
    let series = format!("{off_cpu}{{hostname=\"{host}\",env=\"fleet-test\"}}");
    let windows = parca.profiles(&series, started, ended);
    let waited: i64 = windows.iter().map(|(.., value)| value).sum();
    assert!(
        windows.len() >= 2 && waited > 0,
        "expected pushed off-CPU windows with waits in them, got {windows:?}\n{}",
        parca.log()
    );
}

#[test]
fn windows_sampled_while_parca_is_down_arrive_once_when_it_is_back() {
    let _serial = serial();
    let mut parca = Parca::start("outage", "");
    let target = format!("parca=http://{}", parca.addr());
    let parca_target = format!("parca http://{}", parca.addr());
    let daemon = Daemon::start(&[
        "--push",
        &target,
        "--push-interval-seconds",
        "2",
        "--push-label",
        "env=outage-test",
    ]);
    let started = now_ms();
    let workload = Workload::spawn(SPLIT, &["100"]);
    wait_until(Duration::from_secs(30), "a first accepted push", || {
        push_metric(
            &daemon,
            "push_attempts_total",
            &parca_target,
            ",outcome=\"accepted\"",
        ) >= 2
    });
    parca.stop();
    let stopped = now_ms();
    // 20 s down: ten 2 s windows to queue (a minute proved nothing more
    // and cost the suite 40 s).
    std::thread::sleep(Duration::from_secs(20));
    let queued = push_metric(&daemon, "push_queue_windows", &parca_target, "");
    assert!(
        queued >= 7,
        "expected the windows of 20 s queued while Parca is down, got {queued}"
    );
    assert!(
        push_metric(
            &daemon,
            "push_attempts_total",
            &parca_target,
            ",outcome=\"failed\""
        ) > 0
    );
    parca.restart();
    let restarted = now_ms();
    wait_until(
        Duration::from_secs(90),
        "the queue to drain once Parca is back",
        || push_metric(&daemon, "push_queue_windows", &parca_target, "") == 0,
    );
    drop(workload);
    std::thread::sleep(Duration::from_secs(3));
    let ended = now_ms();
    assert_eq!(
        push_metric(
            &daemon,
            "push_dropped_windows_total",
            &parca_target,
            ",reason=\"spool_full\""
        ),
        0
    );
    let windows = parca.profiles(&format!("{CPU}{{env=\"outage-test\"}}"), started, ended);
    let during: Vec<_> = windows
        .iter()
        .filter(|(start, ..)| (stopped.saturating_sub(1000)..restarted).contains(start))
        .collect();
    assert!(
        during.len() >= 8,
        "expected the ~10 windows of the 20 s Parca was down to arrive, got {} of {windows:?}",
        during.len()
    );
    // Every window, exactly: contiguous (none skipped), and with the sample
    // total profilerd has for it (none counted twice).
    let mut previous_end: Option<u64> = None;
    for &(floor_ms, duration_ms, value) in &windows {
        let start = exact_start(&daemon, floor_ms, duration_ms).unwrap_or_else(|| {
            panic!("no drain of profilerd's starts a {duration_ms} ms window in the second at {floor_ms}")
        });
        if let Some(end) = previous_end {
            assert_eq!(
                start, end,
                "windows must follow each other: a gap or an overlap at {start} in {windows:?}"
            );
        }
        previous_end = Some(start + duration_ms);
        assert_eq!(value % PERIOD_NS, 0, "Parca's value {value} is samples × period");
        let (own, _) = own_top(&daemon, "", start, start + duration_ms);
        let own_total: i64 = own.values().sum();
        assert_eq!(
            value / PERIOD_NS,
            own_total,
            "window {start}..{}: Parca holds {} samples, profilerd has {own_total}",
            start + duration_ms,
            value / PERIOD_NS
        );
    }
}

#[test]
fn a_small_spool_gives_up_the_oldest_windows_and_counts_them() {
    let _serial = serial();
    // Nothing listens there yet: the backend is down from the start.
    let port = free_port();
    let target = format!("parca=http://127.0.0.1:{port}");
    let parca_target = format!("parca http://127.0.0.1:{port}");
    let bound = 32 * 1024;
    let daemon = Daemon::start(&[
        "--push",
        &target,
        "--push-interval-seconds",
        "1",
        "--push-spool-kb",
        "32",
        "--push-label",
        "env=spool-test",
    ]);
    let started = now_ms();
    let workload = Workload::spawn(SPLIT, &["40"]);
    let mut largest = 0;
    wait_until(
        Duration::from_secs(40),
        "windows dropped from the full spool",
        || {
            largest = largest.max(push_metric(&daemon, "push_queue_bytes", &parca_target, ""));
            push_metric(
                &daemon,
                "push_dropped_windows_total",
                &parca_target,
                ",reason=\"spool_full\"",
            ) >= 3
        },
    );
    for _ in 0..8 {
        largest = largest.max(push_metric(&daemon, "push_queue_bytes", &parca_target, ""));
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        largest <= bound,
        "the spool held {largest} bytes, over its bound of {bound}"
    );
    assert!(push_metric(&daemon, "push_dropped_samples_total", &parca_target, "") > 0);
    // The daemon keeps serving meanwhile.
    let profile = daemon.get("/pprof?seconds=5");
    assert_eq!(
        profile.status,
        200,
        "/pprof while the backend is down: {}",
        profile.text()
    );
    // The spool holds a window or two; the one being tried is out of it
    // for the attempt, so the gauge is read until it shows one waiting.
    wait_until(Duration::from_secs(10), "windows still queued", || {
        push_metric(&daemon, "push_queue_windows", &parca_target, "") >= 1
    });
    // What is left in the spool is the newest: once a server is there, the
    // windows it gets begin well after the first ones were cut.
    let parca = Parca::start_on("spool", port, "");
    wait_until(Duration::from_secs(60), "the queue to drain", || {
        push_metric(&daemon, "push_queue_windows", &parca_target, "") == 0
    });
    drop(workload);
    let windows = parca.profiles(&format!("{CPU}{{env=\"spool-test\"}}"), started, now_ms());
    let &(floor_ms, duration_ms, _) = windows.first().expect("some windows in Parca");
    // Parca floors starts to the second: the window's own start, from the
    // daemon's drains. Three windows of 1 s or more were given up before
    // Parca came (the spool holds several; the one being sent when Parca
    // came back is not given up mid-send, so how many newer ones are kept
    // depends on the machine's pace): the first kept starts well after
    // the first cut, which began as the daemon started.
    let oldest = exact_start(&daemon, floor_ms, duration_ms).unwrap_or(floor_ms);
    assert!(
        oldest >= started + 2500,
        "expected the oldest windows given up, but Parca has one from {} ms after the start: {windows:?}",
        oldest as i64 - started as i64
    );
}

/// Kills the TLS terminator on drop.
struct Terminator(std::process::Child);

impl Drop for Terminator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn pushes_go_over_tls_to_a_server_the_given_ca_vouches_for() {
    let _serial = serial();
    let parca = Parca::start("tls", "");
    let pki = Pki::new("push");
    pki.ca("push-ca");
    pki.issue("push-ca", "parca", 1, Usage::Server(Ipv4Addr::LOCALHOST));
    // Parca serves cleartext only: socat terminates TLS in front of it (as
    // a hosted endpoint's load balancer would), passing the HTTP/2 through.
    let tls_port = free_port();
    let listen = format!(
        "OPENSSL-LISTEN:{tls_port},bind=127.0.0.1,reuseaddr,fork,verify=0,cert={},key={}",
        pki.path("parca.pem").display(),
        pki.path("parca.key").display()
    );
    let _terminator = Terminator(
        Command::new("socat")
            .args([listen.as_str(), &format!("TCP:127.0.0.1:{}", parca.port)])
            .stderr(Stdio::null())
            .spawn()
            .expect("starting socat (Debian's socat; scripts/setup.sh installs it)"),
    );
    wait_until(Duration::from_secs(10), "socat listening", || {
        std::net::TcpStream::connect(("127.0.0.1", tls_port)).is_ok()
    });
    // Two targets at that address: one trusting the test's CA, one with
    // only the system's roots, which must refuse the server.
    let config = pki.path("profilerd.toml");
    std::fs::write(
        &config,
        format!(
            "[push]\ninterval_seconds = 1\nlabels = {{ env = \"tls-test\" }}\n\n\
             [[push.targets]]\nbackend = \"parca\"\nurl = \"https://127.0.0.1:{tls_port}\"\nca_file = \"{}\"\n\n\
             [[push.targets]]\nbackend = \"parca\"\nurl = \"https://127.0.0.1:{tls_port}/untrusted\"\n",
            pki.path("push-ca.pem").display()
        ),
    )
    .expect("writing the config");
    let daemon = Daemon::start(&["--config", config.to_str().expect("a UTF-8 path")]);
    let trusted = format!("parca https://127.0.0.1:{tls_port}");
    let untrusted = format!("parca https://127.0.0.1:{tls_port}/untrusted");
    let started = now_ms();
    wait_until(Duration::from_secs(30), "two pushes accepted over TLS", || {
        push_metric(&daemon, "push_attempts_total", &trusted, ",outcome=\"accepted\"") >= 2
    });
    let outcome = |target: &str, outcome: &str| {
        push_metric(
            &daemon,
            "push_attempts_total",
            target,
            &format!(",outcome=\"{outcome}\""),
        )
    };
    assert!(
        outcome(&untrusted, "failed") >= 1,
        "expected the untrusted server's certificate refused"
    );
    assert_eq!(
        (outcome(&untrusted, "accepted"), outcome(&untrusted, "refused")),
        (0, 0),
        "without the CA, no push may get as far as the server's answer"
    );
    let windows = parca.profiles(
        &format!("{CPU}{{env=\"tls-test\"}}"),
        started.saturating_sub(5000),
        now_ms(),
    );
    assert!(
        !windows.is_empty(),
        "expected the pushes over TLS in Parca\n{}",
        parca.log()
    );
}
