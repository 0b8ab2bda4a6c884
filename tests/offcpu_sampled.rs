//! Off-CPU with one switch in N recorded (`--off-cpu-sample-every`): every
//! recorded wait still ends (a switch skips the waits map only for a task
//! with no recorded wait: `OFF_CPU_PENDING` in profiler-ebpf/src/off_cpu.rs),
//! and the time waited, weighted N, stays the time the threads were away.

use std::{thread::sleep, time::Duration};

use profilerd_tests::{
    Workload,
    daemon::{Daemon, metric},
    offcpu::{field_ns, percent_off, threads_by_tid, threads_json, window_of},
    serial,
};

const STORM: &str = env!("WORKLOAD_STORM");
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

#[test]
fn with_one_switch_in_four_recorded_every_recorded_wait_ends_and_the_time_away_adds_up() {
    let _serial = serial();
    let daemon = Daemon::start(&[
        "--off-cpu",
        "--off-cpu-sample-every",
        SAMPLE_EVERY,
        "--drain-interval-ms",
        "100",
    ]);
    let storm = Workload::spawn(STORM, &[&THREADS.to_string(), "60"]);
    let pid = storm.pid();
    sleep(Duration::from_secs(WINDOW_SECONDS + 2));
    let json = threads_json(&daemon, &format!("pid={pid}&seconds={WINDOW_SECONDS}"));
    let (start_ms, end_ms) = window_of(&json);
    let window_ns = (end_ms - start_ms) * 1_000_000;
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
        let (on, off) = (field_ns(thread, "cpu_ns"), field_ns(thread, "off_cpu_ns"));
        let error = percent_off(on + off, window_ns);
        eprintln!("storm thread {tid}: on {on} + off {off} ns in a {window_ns} ns window ({error:.2}% off)");
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

    // Every recorded wait ends when its thread runs again, so recorded waits
    // not yet ended are at most one per thread on the machine. A wait a
    // switch wrongly took for none would never end: over this many, the
    // difference would grow past any count of threads.
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
    let recorded = event("off_cpu_switches") - event("off_cpu_unsampled");
    let ended = event("off_cpu_waits") + event("off_cpu_short");
    let refused = lost("off_cpu_waits_map_full") + lost("off_cpu_read_error");
    let threads_now = threads_on_the_machine();
    eprintln!(
        "switches recorded {recorded}, waits ended {ended}, refused {refused}; \
         {threads_now} threads on the machine"
    );
    assert!(
        recorded >= 20 * threads_now,
        "the storm should have made at least {} recorded switches, got {recorded}",
        20 * threads_now
    );
    assert!(
        recorded <= ended + refused + threads_now,
        "{recorded} waits recorded, {ended} ended and {refused} refused: more than the \
         {threads_now} threads on the machine are still waiting, so some recorded waits \
         never ended"
    );
    drop(storm);
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
