//! Off-CPU with switches sampled: one in N (`--off-cpu-sample-every`) or
//! under a budget (`--off-cpu-budget`). The recorded waits end (a switch
//! skips the waits map only for a task with no recorded wait:
//! `OFF_CPU_PENDING` in profiler-ebpf/src/off_cpu.rs); the weighted count of
//! a thread's waits is the number of times it ran (schedstat's third field,
//! never scaled by the daemon: the oracle of the weights); and on + off adds
//! up to the window (the daemon scales the time of threads with many waits
//! to the kernel's own figure, collect/off_cpu/exact.rs).

use std::{collections::HashMap, thread::sleep, time::Duration};

use profilerd_tests::{
    Workload,
    daemon::{Daemon, metric},
    offcpu::{field_ns, percent_off, profile, threads_by_tid, threads_json, through, total_ns, window_of},
    pprof, serial,
};

const STORM: &str = env!("WORKLOAD_STORM");
const PINGPONG: &str = env!("WORKLOAD_PINGPONG");
const WAIT_SITES: &str = env!("WORKLOAD_WAIT_SITES");
/// Threads of the storm: each waits ~1 ms at a time, ~900 waits a second.
const THREADS: u32 = 8;
const SAMPLE_EVERY: &str = "4";
const WINDOW_SECONDS: u64 = 5;
/// Percent by which the storm threads' on + off time, summed, may differ
/// from theirs in the window. Over ~9,000 recorded waits of nearly equal
/// length, the weighted sum's standard deviation is under 1%.
const SUM_PERCENT: f64 = 5.0;
/// The same for each thread (~1,100 recorded waits: about 2.6%).
const THREAD_PERCENT: f64 = 15.0;
/// Recorded switches the storm alone makes in its 7 s (about 12,600),
/// with room for a slow machine.
const MIN_RECORDED: u64 = 4_000;

#[test]
fn with_one_switch_in_four_recorded_the_recorded_waits_end_and_the_time_away_adds_up() {
    let _serial = serial();
    let daemon = start_sampled_daemon();
    let storm = Workload::spawn(STORM, &[&THREADS.to_string(), "60"]);
    let pid = storm.pid();
    let (window_ns, json) = last_window(&daemon, pid);
    // The storm's own threads, not its main thread: that one waits in one
    // join all along, and one wait recorded one time in four shows as 0 or
    // four times the window (unbiased, but no test of a sum).
    let threads: Vec<_> = threads_by_tid(&json)
        .into_iter()
        .filter(|(tid, _)| *tid != pid)
        .collect();
    assert_eq!(
        threads.len(),
        THREADS as usize,
        "the storm's {THREADS} threads should be in /threads: {json}"
    );
    let mut sum = 0;
    for (tid, thread) in &threads {
        let (on, off, error) = on_and_off("storm thread", *tid, thread, window_ns);
        assert!(
            error <= THREAD_PERCENT,
            "storm thread {tid}: on-CPU + off-CPU should be the window, {window_ns} ns \
             ±{THREAD_PERCENT}% with one wait in {SAMPLE_EVERY} recorded, got {on} + {off} ns"
        );
        sum += on + off;
    }
    let expected = window_ns * u64::from(THREADS);
    let error = percent_off(sum, expected);
    eprintln!("storm threads together: {sum} ns against {expected} ns ({error:.2}% off)");
    assert!(
        error <= SUM_PERCENT,
        "the storm threads' on-CPU + off-CPU time together should be {THREADS} windows, \
         {expected} ns ±{SUM_PERCENT}%, got {sum} ns ({error:.2}% off)"
    );

    // A recorded wait ends when its thread runs again, so recorded waits
    // not yet ended are at most one per thread on the machine. A wait a
    // switch wrongly took for none would never end: skipped at a rate of a
    // few percent, the difference grows past the count of threads (the
    // sums above catch that too; a rarer skip escapes both). /proc shows
    // the threads of this PID namespace: the suite runs in the host's.
    let text = daemon.get("/metrics").text();
    let event = |name: &str| {
        metric(
            &text,
            &format!("profilerd_sampler_events_total{{event=\"{name}\"}}"),
        )
    };
    let lost = |reason: &str| {
        metric(
            &text,
            &format!("profilerd_samples_lost_total{{reason=\"{reason}\"}}"),
        )
    };
    let recorded = event("off_cpu_recorded_switches");
    let ended = event("off_cpu_waits") + event("off_cpu_short");
    let refused = lost("off_cpu_waits_map_full") + lost("off_cpu_read_error");
    let threads_now = threads_on_the_machine();
    eprintln!(
        "switches recorded {recorded}, waits ended {ended}, refused {refused}; \
         {threads_now} threads on the machine"
    );
    assert!(
        recorded >= MIN_RECORDED,
        "the storm should have made at least {MIN_RECORDED} recorded switches, got {recorded}"
    );
    assert!(
        recorded <= ended + refused + threads_now,
        "{recorded} waits recorded, {ended} ended and {refused} refused: more than the \
         {threads_now} threads on the machine are still waiting, so some recorded waits \
         never ended"
    );
    drop(storm);
}

/// Percent by which each ping-pong thread's on + off time may differ from
/// the window. Weighted waits alone came to 102-103% at N = 4 (what
/// recording a wait costs the thread that runs next, caches it cools, is
/// weighted N with the wait); the daemon now scales such threads' time to
/// schedstat's (within 0.01% here), so this mostly checks that it did.
const PINGPONG_PERCENT: f64 = 8.0;

/// Two threads bouncing a byte over pipes on one CPU: each is off CPU
/// exactly while the other runs, ~150,000 waits a second each, and one in
/// four recorded must still count each one's waits and give each the
/// window.
#[test]
fn with_one_switch_in_four_recorded_a_switch_storm_on_one_cpu_adds_up_to_the_window() {
    let _serial = serial();
    let daemon = start_sampled_daemon();
    let pingpong = Workload::spawn("taskset", &["-c", "0", PINGPONG, "-t", "60"]);
    // taskset executes the ping-pong: the same pid.
    let pid = pingpong.pid();
    sleep(Duration::from_secs(2));
    let runs_before = runs_of(pid);
    let (window_ns, json) = last_window_after(&daemon, pid);
    assert_weighted_waits_are_the_runs(&daemon, pid, &runs_before);
    let threads = threads_by_tid(&json);
    assert_eq!(
        threads.len(),
        2,
        "the ping-pong's two threads should be in /threads: {json}"
    );
    for (tid, thread) in &threads {
        let (on, off, error) = on_and_off("ping-pong thread", *tid, thread, window_ns);
        assert!(
            error <= PINGPONG_PERCENT,
            "ping-pong thread {tid}: on-CPU + off-CPU should be the window, {window_ns} ns \
             ±{PINGPONG_PERCENT}% with one wait in {SAMPLE_EVERY} recorded, got {on} + {off} ns \
             ({error:.2}% off)"
        );
    }
    drop(pingpong);
}

/// The budget for the test below: recorded switches per CPU per second.
const BUDGET: u64 = 4000;
/// Percent the quiet thread's on + off may be off the window: every one of
/// its switches is recorded (its CPU stays within the budget), so exact but
/// for the window's edges.
const QUIET_PERCENT: f64 = 3.0;
/// The same for the ping-pong's threads, each wait weighing ~2^7 under the
/// budget: weighted alone, 5-8% too much (what recording a wait costs the
/// thread that runs meanwhile, cooled caches, counted 2^7 times over;
/// README, "Off-CPU"); scaled by the daemon to schedstat's figure, as their
/// waits are many.
const BUDGET_PINGPONG_PERCENT: f64 = 3.0;

/// A switch storm on CPU 0 and a thread waiting ~900 times a second on CPU
/// 1, with a budget of 4000 recorded switches per CPU per second: the
/// storm's CPU records about that many (one in ~2^7 of its switches), the
/// quiet CPU every switch, and both add up to the window.
#[test]
fn with_a_budget_a_storm_records_what_the_budget_allows_and_a_quiet_cpu_every_switch() {
    let _serial = serial();
    let daemon = Daemon::start(&[
        "--off-cpu",
        "--off-cpu-budget",
        &BUDGET.to_string(),
        "--drain-interval-ms",
        "100",
    ]);
    let pingpong = Workload::spawn("taskset", &["-c", "0", PINGPONG, "-t", "60"]);
    let quiet = Workload::spawn("taskset", &["-c", "1", STORM, "1", "60"]);
    sleep(Duration::from_secs(2));
    let switches_before = context_switches();
    let recorded_before = recorded_switches(&daemon);
    let runs_before = runs_of(pingpong.pid());
    let quiet_runs_before: HashMap<u32, u64> = runs_of(quiet.pid())
        .into_iter()
        .filter(|(tid, _)| *tid != quiet.pid())
        .collect();
    let started = std::time::Instant::now();
    let (window_ns, json) = last_window_after(&daemon, pingpong.pid());
    assert_weighted_waits_are_the_runs(&daemon, pingpong.pid(), &runs_before);
    assert_weighted_waits_are_the_runs(&daemon, quiet.pid(), &quiet_runs_before);
    // Counters are read at drains (every 100 ms): one more, and the
    // interval is the drains' own.
    sleep(Duration::from_millis(300));
    let seconds = started.elapsed().as_secs_f64();
    let recorded = recorded_switches(&daemon) - recorded_before;
    let switches = context_switches() - switches_before;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let ceiling = BUDGET as f64 * cpus * seconds;
    eprintln!(
        "{recorded} switches recorded of {switches} in {seconds:.2} s; the budget allows {ceiling:.0} on {cpus} CPUs"
    );
    assert!(
        (recorded as f64) <= ceiling * 1.1,
        "{recorded} switches recorded in {seconds:.2} s: over the budget of {BUDGET} per CPU per second \
         ({ceiling:.0} on {cpus} CPUs)"
    );
    assert!(
        recorded * 20 < switches,
        "the storm's {switches} switches should be sampled (one in ~128), got {recorded} recorded"
    );
    for (tid, thread) in threads_by_tid(&json) {
        let (on, off, error) = on_and_off("ping-pong thread", tid, &thread, window_ns);
        assert!(
            error <= BUDGET_PINGPONG_PERCENT,
            "ping-pong thread {tid}: on-CPU + off-CPU should be the window, {window_ns} ns \
             ±{BUDGET_PINGPONG_PERCENT}% under a budget, got {on} + {off} ns ({error:.2}% off)"
        );
    }
    let quiet_json = threads_json(&daemon, &format!("pid={}&seconds={WINDOW_SECONDS}", quiet.pid()));
    let quiet_window = {
        let (start_ms, end_ms) = window_of(&quiet_json);
        (end_ms - start_ms) * 1_000_000
    };
    let waiter = threads_by_tid(&quiet_json)
        .into_iter()
        .find(|(tid, _)| *tid != quiet.pid())
        .unwrap_or_else(|| panic!("the quiet storm's thread should be in /threads: {quiet_json}"));
    let (on, off, error) = on_and_off("quiet thread", waiter.0, &waiter.1, quiet_window);
    assert!(
        error <= QUIET_PERCENT,
        "the thread waiting ~900 times a second on CPU 1, within the budget, should have every \
         switch recorded and add up to the window, {quiet_window} ns ±{QUIET_PERCENT}%, got {on} + {off} ns \
         ({error:.2}% off)"
    );
    drop(pingpong);
    drop(quiet);
}

/// Points by which a call site's share of the sampled waits may differ
/// from the workload's own, unsampled figure. Under the default budget
/// the waiter has ~5,000 recorded waits in the window: the standard
/// deviation of either share is about 0.6 points.
const SPLIT_POINTS: f64 = 3.0;
const SPLIT_WINDOW_SECONDS: u64 = 10;

/// Two call sites waiting in a switch storm (~19,000 switches a second on
/// one CPU), with off-CPU's default settings: a quarter of the waits, in
/// long_wait_site, take ~73% of the time waited. The sampled profile's
/// split of the time between the two sites, and of the waits counted
/// (weighted), is what the workload measured around every one of its
/// reads, within SPLIT_POINTS; and the storm was sampled, not recorded
/// switch by switch.
#[test]
fn under_the_default_budget_a_storm_splits_its_waits_between_call_sites_as_measured() {
    let _serial = serial();
    let daemon = Daemon::start(&["--off-cpu"]);
    let stats_path = std::env::temp_dir().join(format!("profilerd-wait-sites-{}.stats", std::process::id()));
    let _ = std::fs::remove_file(&stats_path);
    let path = stats_path.display().to_string();
    let workload = Workload::spawn("taskset", &["-c", "0", WAIT_SITES, &path, "40"]);
    sleep(Duration::from_secs(2));
    let before = SiteStats::read(&stats_path);
    let (switches_before, recorded_before) = (context_switches(), recorded_switches(&daemon));
    // The window is the last SPLIT_WINDOW_SECONDS up to the request, sent
    // right after `after` is read.
    sleep(Duration::from_secs(SPLIT_WINDOW_SECONDS));
    let after = SiteStats::read(&stats_path);
    let (switches, recorded) = (
        context_switches() - switches_before,
        recorded_switches(&daemon) - recorded_before,
    );
    let query = format!(
        "pid={}&tid={}&seconds={SPLIT_WINDOW_SECONDS}",
        after.pid, after.waiter_tid
    );
    let off = profile(&daemon, "offcpu", &query, "wait_sites");
    drop(workload);
    let _ = std::fs::remove_file(&stats_path);

    eprintln!("{recorded} switches recorded of {switches} in the window");
    assert!(
        recorded * 4 < switches,
        "the storm's {switches} switches should be sampled under the default budget, got {recorded} recorded"
    );
    let share = |long: f64, short: f64| 100.0 * long / (long + short);
    let measured_time = share(
        (after.long_ns - before.long_ns) as f64,
        (after.short_ns - before.short_ns) as f64,
    );
    let measured_waits = share(
        (after.long_waits - before.long_waits) as f64,
        (after.short_waits - before.short_waits) as f64,
    );
    let counted = |function| -> u64 {
        through(&off.samples, function)
            .map(|sample| u64::try_from(sample.values[0]).expect("a count"))
            .sum()
    };
    let profiled_time = share(
        total_ns(through(&off.samples, "long_wait_site")) as f64,
        total_ns(through(&off.samples, "short_wait_site")) as f64,
    );
    let profiled_waits = share(
        counted("long_wait_site") as f64,
        counted("short_wait_site") as f64,
    );
    for (what, got, expected) in [
        ("time waited", profiled_time, measured_time),
        ("waits", profiled_waits, measured_waits),
    ] {
        eprintln!("long_wait_site's share of the {what}: {got:.2}% sampled, {expected:.2}% measured");
        assert!(
            (got - expected).abs() <= SPLIT_POINTS,
            "long_wait_site's share of the {what}: the workload measured {expected:.2}% \
             (short_wait_site the rest), the sampled profile should show it ±{SPLIT_POINTS} points, got {got:.2}%"
        );
    }
    // The storm's drains took thousands of kernel stacks out of their maps
    // (each read and deleted in one call where the kernel can): a stack
    // that could be neither taken nor read and deleted counts here, as do
    // the drain's other map reads.
    let read_errors = metric(&daemon.get("/metrics").text(), "profilerd_map_read_errors_total");
    assert_eq!(
        read_errors, 0,
        "every drain should read its maps whole, got {read_errors} read errors"
    );
}

/// What wait_sites measured (`struct stats` of workloads/wait_sites.c).
struct SiteStats {
    pid: u32,
    waiter_tid: u32,
    long_waits: u64,
    long_ns: u64,
    short_waits: u64,
    short_ns: u64,
}

impl SiteStats {
    /// Polls for a second of the workload's waits (a minute is a stall).
    /// Each field is an aligned 8-byte store, never torn; a site's count
    /// and time may be one wait apart.
    fn read(path: &std::path::Path) -> Self {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let fields: Vec<u64> = std::fs::read(path)
                .unwrap_or_default()
                .as_chunks::<8>()
                .0
                .iter()
                .map(|chunk| u64::from_le_bytes(*chunk))
                .collect();
            if let [
                pid,
                waiter_tid,
                _answerer,
                long_waits,
                long_ns,
                short_waits,
                short_ns,
            ] = fields[..]
                && long_waits > 0
            {
                return Self {
                    pid: u32::try_from(pid).expect("a pid"),
                    waiter_tid: u32::try_from(waiter_tid).expect("a tid"),
                    long_waits,
                    long_ns,
                    short_waits,
                    short_ns,
                };
            }
            assert!(
                std::time::Instant::now() < deadline,
                "wait_sites should have written its stats to {} within 60 s",
                path.display()
            );
            sleep(Duration::from_millis(20));
        }
    }
}

fn recorded_switches(daemon: &Daemon) -> u64 {
    metric(
        &daemon.get("/metrics").text(),
        "profilerd_sampler_events_total{event=\"off_cpu_recorded_switches\"}",
    )
}

/// Context switches on the machine so far (`ctxt` in /proc/stat).
fn context_switches() -> u64 {
    std::fs::read_to_string("/proc/stat")
        .expect("/proc/stat")
        .lines()
        .find_map(|line| line.strip_prefix("ctxt ")?.trim().parse().ok())
        .expect("ctxt in /proc/stat")
}

fn start_sampled_daemon() -> Daemon {
    Daemon::start(&[
        "--off-cpu",
        "--off-cpu-sample-every",
        SAMPLE_EVERY,
        // One in four, not halved further on a storm.
        "--off-cpu-budget",
        "0",
        "--drain-interval-ms",
        "100",
    ])
}

/// Percent by which a ping-pong thread's weighted count of waits may differ
/// from the times it ran in the window: the window's edges (drains every
/// 100 ms, so ±2% of 5 s) and, under a budget, ~2,500 recorded waits (±2%).
const COUNT_PERCENT: f64 = 10.0;

/// Checks that each thread of `pid` ran (was switched in) as many times in
/// the last WINDOW_SECONDS as the off-CPU profile counts its waits, weighted;
/// `runs_before` is each thread's count of runs at the window's start.
fn assert_weighted_waits_are_the_runs(daemon: &Daemon, pid: u32, runs_before: &HashMap<u32, u64>) {
    let runs_after = runs_of(pid);
    let response = daemon.get(&format!("/pprof?type=offcpu&pid={pid}&seconds={WINDOW_SECONDS}"));
    assert_eq!(response.status, 200, "the off-CPU profile: {}", response.text());
    let profile = pprof::decode(&response.body);
    let mut weighted: HashMap<u32, u64> = HashMap::new();
    for sample in &profile.samples {
        let tid = sample.label("thread_id").parse().expect("a thread_id label");
        *weighted.entry(tid).or_default() += u64::try_from(sample.values[0]).expect("a count");
    }
    for (tid, before) in runs_before {
        let runs = runs_after.get(tid).copied().unwrap_or(*before) - before;
        let counted = weighted.get(tid).copied().unwrap_or(0);
        let error = percent_off(counted, runs);
        eprintln!(
            "thread {tid}: {counted} waits counted (weighted), {runs} runs in schedstat ({error:.2}% off)"
        );
        assert!(
            error <= COUNT_PERCENT,
            "thread {tid}: the weighted count of its waits should be the times it ran, {runs} \
             ±{COUNT_PERCENT}% (schedstat), got {counted}"
        );
    }
}

/// Each thread of `pid`: the times it was switched in so far (schedstat's
/// third field).
fn runs_of(pid: u32) -> HashMap<u32, u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process's threads");
    tasks
        .flatten()
        .filter_map(|task| {
            let tid = task.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            let runs = stat.split_whitespace().nth(2)?.parse().ok()?;
            Some((tid, runs))
        })
        .collect()
}

/// /threads of process `pid` over the last WINDOW_SECONDS, asked once it
/// has run that long and 2 s more: the window's length in ns, and the answer.
fn last_window(daemon: &Daemon, pid: u32) -> (u64, serde_json::Value) {
    sleep(Duration::from_secs(2));
    last_window_after(daemon, pid)
}

/// The same, asked WINDOW_SECONDS from now.
fn last_window_after(daemon: &Daemon, pid: u32) -> (u64, serde_json::Value) {
    sleep(Duration::from_secs(WINDOW_SECONDS));
    let json = threads_json(daemon, &format!("pid={pid}&seconds={WINDOW_SECONDS}"));
    let (start_ms, end_ms) = window_of(&json);
    ((end_ms - start_ms) * 1_000_000, json)
}

/// A thread's on-CPU and off-CPU ns, and how far their sum is from the
/// window, in percent (printed).
fn on_and_off(what: &str, tid: u32, thread: &serde_json::Value, window_ns: u64) -> (u64, u64, f64) {
    let (on, off) = (field_ns(thread, "cpu_ns"), field_ns(thread, "off_cpu_ns"));
    let error = percent_off(on + off, window_ns);
    eprintln!("{what} {tid}: on {on} + off {off} ns in a {window_ns} ns window ({error:.2}% off)");
    (on, off, error)
}

/// Threads alive now, over every process (/proc/*/task/*).
fn threads_on_the_machine() -> u64 {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.parse::<u32>().is_ok())
        })
        .map(|entry| std::fs::read_dir(entry.path().join("task")).map_or(0, |tasks| tasks.count() as u64))
        .sum()
}
