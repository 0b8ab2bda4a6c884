//! Issue 26, the processes traced while the daemon runs and their memory
//! pushed to the fleet's store: chosen by systemd unit (and by pid), their
//! heaps reach a real Parca server as Parca stores the heaps it scrapes (the
//! allocations a delta profile, the live set a snapshot) and Pyroscope's
//! Push API under `memory` with `__delta__="false"`, read back through
//! Parca's own query API and `go tool pprof`. And on-demand windows chosen
//! by process name rather than pid.
//!
//! The workload is tests/workloads/alloc_sites.c (see tests/allocations.rs):
//! it counts its own bytes per call site and leaks from one of them.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use profilerd_tests::{
    allocations::{
        ALLOC_SPACE, AllocProfile, AllocSites, INUSE_SPACE, LEAK_SITE, MIB, Options, SITES, assert_labels,
        assert_site_shares, wait_until_traced,
    },
    artifacts_dir,
    capture::{CaptureServer, Reply},
    cgroup::TestCgroup,
    daemon::Daemon,
    parca::Parca,
    pyroscope::{decode_push_request, gunzip_profile},
    serial,
};

/// Longer than any test: the workload is killed on drop.
const FOREVER: f64 = 300.0;
/// ~1,000 allocations a second at the four sites, 4 MiB/s leaked in 16-KiB
/// blocks: the leak is nearly all that is in use after a few seconds.
const LEAK_PER_S: u64 = 4 * MIB;
const SITES_PER_S: u64 = 32 * MIB;
/// Every allocation recorded, and the probes' cost not counted against it:
/// the test measures what was traced.
const EVERY_ALLOCATION: [&str; 4] = ["--alloc-sample-bytes", "0", "--alloc-budget-percent", "100"];
/// Parca's names for the two halves of a pushed heap.
const ALLOC_SPACE_DELTA: &str = "memory:alloc_space:bytes:space:bytes:delta";
const INUSE_SPACE_SNAPSHOT: &str = "memory:inuse_space:bytes:space:bytes";

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_millis() as u64
}

/// The sites' values in a function -> value table (a site's own frame).
fn site_values(table: &HashMap<String, i64>) -> [f64; 4] {
    SITES.map(|site| table.get(site).copied().unwrap_or(0) as f64)
}

#[test]
fn a_unit_traced_while_it_runs_has_its_heap_in_parca() {
    let _serial = serial();
    let parca = Parca::start("memory", "");
    let unit = "alloc-push.service";
    let cgroup = TestCgroup::create(unit);
    let target = format!("parca=http://{}", parca.addr());
    let mut args = vec![
        "--push",
        &target,
        "--push-interval-seconds",
        "2",
        "--alloc-trace-unit",
        unit,
    ];
    args.extend(EVERY_ALLOCATION);
    let daemon = Daemon::start(&args);
    // Started in the unit's cgroup from its exec on, as a service is.
    let procs = cgroup.dir.join("cgroup.procs");
    let wrapper = [
        "/bin/sh",
        "-c",
        r#"echo $$ > "$1" && shift && exec "$@""#,
        "sh",
        procs.to_str().expect("a UTF-8 cgroup path"),
    ];
    let mut workload = AllocSites::start_with(&wrapper, Options::all(FOREVER, LEAK_PER_S, SITES_PER_S));
    wait_until_traced(&daemon, workload.pid());
    // From the next drain on, every window of the traced process is whole.
    std::thread::sleep(Duration::from_secs(2));
    let started = now_ms();
    let before = workload.stats();
    std::thread::sleep(Duration::from_secs(10));
    let after = workload.stats();
    let ended = now_ms();
    // The windows up to `ended` pushed, and stored.
    std::thread::sleep(Duration::from_secs(4));

    let types = parca.profile_types();
    for expected in [ALLOC_SPACE_DELTA, INUSE_SPACE_SNAPSHOT] {
        assert!(
            types.iter().any(|name| name == expected),
            "expected {expected} among Parca's profile types, got {types:?}\n{}",
            parca.log()
        );
    }
    assert!(
        !types
            .iter()
            .any(|name| name == "memory:inuse_space:bytes:space:bytes:delta"),
        "the live set is a snapshot, not a delta: {types:?}"
    );

    // The allocations: per site as the program counted them.
    let selector = format!("{{service_name=\"{unit}\"}}");
    let allocated = parca.cumulative(&format!("{ALLOC_SPACE_DELTA}{selector}"), started, ended);
    let delta = after.since(&before);
    let expected = SITES.map(|site| delta.bytes(site) as f64);
    assert_site_shares(
        "alloc_space per site pushed to Parca",
        &site_values(&allocated),
        &expected,
        5.0,
    );
    let pushed: f64 = site_values(&allocated).iter().sum();
    let counted: f64 = expected.iter().sum();
    assert!(
        (0.8..=1.3).contains(&(pushed / counted)),
        "Parca's alloc_space over {} ms at the sites ({pushed}) should be about what the program allocated \
         over about that time ({counted})",
        ended - started
    );

    // The live set: snapshots that grow with the leak, where it leaks.
    let snapshots = parca.profiles(
        &format!("{INUSE_SPACE_SNAPSHOT}{selector}"),
        started,
        ended + 4_000,
    );
    assert!(
        snapshots.len() >= 3 && snapshots.iter().all(|&(_, duration, _)| duration == 0),
        "expected a snapshot (no duration) of the live set every 2 s, got {snapshots:?}"
    );
    let (first, last) = (snapshots[0], snapshots[snapshots.len() - 1]);
    let grew = last.2 - first.2;
    let leaked = (LEAK_PER_S as f64 * (last.0 - first.0) as f64 / 1000.0) as i64;
    assert!(
        (grew as f64) > 0.8 * leaked as f64 && (grew as f64) < 1.2 * leaked as f64,
        "the live set should grow by what leaks between two snapshots (~{leaked} bytes in {} ms), got {grew}: {snapshots:?}",
        last.0 - first.0
    );
    let live = parca.cumulative(
        &format!("{INUSE_SPACE_SNAPSHOT}{selector}"),
        last.0 - 1,
        last.0 + 1,
    );
    let at_leak = live.get(LEAK_SITE).copied().unwrap_or(0);
    eprintln!(
        "Parca: alloc_space at the sites {pushed} (the program counted {counted}), shares {:?} vs {:?};          live set {snapshots:?}, grew {grew} (leaked ~{leaked}), {at_leak} at {LEAK_SITE}",
        site_values(&allocated),
        expected
    );
    assert!(
        at_leak as f64 >= 0.9 * last.2 as f64,
        "{LEAK_SITE} should hold >= 90% of the live set, got {at_leak} of {}: {live:?}",
        last.2
    );
    drop(workload);
}

#[test]
fn a_pid_traced_while_it_runs_has_its_heap_pushed_to_pyroscope_as_non_delta_memory() {
    let _serial = serial();
    let workload = AllocSites::start(Options::all(FOREVER, LEAK_PER_S, SITES_PER_S));
    let capture = CaptureServer::start();
    let pid = workload.pid().to_string();
    let target = format!("pyroscope=http://127.0.0.1:{}", capture.port);
    let mut args = vec![
        "--push",
        &target,
        "--push-interval-seconds",
        "2",
        "--alloc-trace-pid",
        &pid,
    ];
    args.extend(EVERY_ALLOCATION);
    let daemon = Daemon::start(&args);
    // Pushes come every 2 s (CPU ones first); a memory series once traced,
    // and a window of it with the leak well under way after a few.
    let mut memory = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while memory.len() < 4 {
        assert!(
            Instant::now() < deadline,
            "expected memory series in the pushes within 60 s, got {}",
            memory.len()
        );
        let exchange = capture.next(Duration::from_secs(30));
        let request = decode_push_request(&exchange.request.body);
        exchange.reply(Reply {
            status: 200,
            content_type: "application/proto",
            body: Vec::new(),
        });
        for series in request.series {
            if series.label("__name__") == Some("memory") {
                memory.push(series);
            }
        }
    }
    drop(daemon);
    let series = memory.last().expect("memory series");
    assert_eq!(
        series.label("__delta__"),
        Some("false"),
        "a window's allocations are not running totals: Pyroscope must not subtract the last window's"
    );
    assert_eq!(series.label("service_name"), Some("alloc_sites"));
    let raw = series
        .samples
        .first()
        .expect("a profile in the series")
        .raw_profile
        .clone();
    let file = artifacts_dir().join("pushed-memory.pb.gz");
    std::fs::write(&file, &raw).expect("writing the pushed profile");
    // Still gzipped pprof, as Pyroscope takes it.
    assert!(!gunzip_profile(&raw).is_empty());
    let profile = AllocProfile::read(&file);
    profile.assert_heap_sample_types();
    let allocated = profile.sum(ALLOC_SPACE, |_| true);
    let window_bytes = (LEAK_PER_S + SITES_PER_S) * 2;
    // The fourth memory push: a running total would hold about 4 windows.
    assert!(
        (0.45..=1.6).contains(&(allocated as f64 / window_bytes as f64)),
        "alloc_space is one window's (about {window_bytes} bytes in 2 s), not a running total: {allocated}"
    );
    let in_use = profile.sum(INUSE_SPACE, |_| true);
    let at_leak = profile.at_site(INUSE_SPACE, LEAK_SITE);
    eprintln!(
        "Pyroscope: a window's alloc_space {allocated}, inuse_space {in_use}, {at_leak} at {LEAK_SITE}"
    );
    assert!(
        in_use > allocated / 4 && at_leak as f64 >= 0.9 * in_use as f64,
        "inuse_space is the live set since tracing began, {LEAK_SITE} >= 90% of it: {at_leak} of {in_use} \
         (the window allocated {allocated})"
    );
}

#[test]
fn a_window_by_process_name_traces_the_running_processes_of_that_name() {
    let _serial = serial();
    let daemon = Daemon::start(&EVERY_ALLOCATION);
    let mut workload = AllocSites::start(Options::all(FOREVER, LEAK_PER_S, SITES_PER_S));
    workload.wait_until_run(Duration::from_secs(1));
    let file = artifacts_dir().join("allocs-by-comm.pb.gz");
    daemon.fetch_pprof("/debug/pprof/allocs?comm=alloc_sites&seconds=3", &file);
    let profile = AllocProfile::read(&file);
    profile.assert_heap_sample_types();
    assert_labels(&profile, workload.pid());
    assert!(
        profile.at_site(ALLOC_SPACE, LEAK_SITE) > 0,
        "the process of that name should have been traced: {:?}",
        profile.by_site(ALLOC_SPACE)
    );
    let none = daemon.get("/debug/pprof/allocs?comm=no-such-program&seconds=1");
    assert_eq!(none.status, 404, "{}", none.text());
    assert!(none.text().contains("no running process"), "{}", none.text());
    let nothing = daemon.get("/debug/pprof/allocs?seconds=1");
    assert_eq!(nothing.status, 400, "{}", nothing.text());
}
