//! Off-CPU tests' harness: the offcpu_mix workload and what it measured
//! (tests/workloads/offcpu_mix.c), typed profiles (`/pprof?type=`), the
//! shapes of wait stacks, /threads' off-CPU fields, and schedstat.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use crate::{
    Workload, artifacts_dir,
    daemon::{Daemon, RawSample, go_pprof, parse_raw},
    stacks::percent,
};

const MIX: &str = env!("WORKLOAD_OFFCPU_MIX");
/// Far longer than any test: the workload is killed when it is dropped.
const WORKLOAD_SECONDS: &str = "300";

/// 999 Hz: a thread's CPU time reaches the profile with its samples (each
/// carries the CPU time since the thread's previous one), so the CPU time
/// run near either end of a window lands in it to a sample period's worth.
/// Drains every 100 ms: a window ends at a drain.
pub fn start_daemon() -> Daemon {
    // Every switch recorded (no budget): these tests hold the waits to
    // what each thread did, wait by wait (tests/offcpu_sampled.rs covers
    // the budget).
    Daemon::start(&[
        "--off-cpu",
        "--off-cpu-budget",
        "0",
        "--frequency",
        "999",
        "--drain-interval-ms",
        "100",
    ])
}

/// The workload and the file it writes its measurements to.
pub fn spawn_mix(name: &str, short_waiters: u32) -> (Workload, PathBuf) {
    let stats = std::env::temp_dir().join(format!("profilerd-offcpu-{name}-{}.stats", std::process::id()));
    let _ = std::fs::remove_file(&stats);
    let path = stats.display().to_string();
    let workload = Workload::spawn(MIX, &[&path, WORKLOAD_SECONDS, &short_waiters.to_string()]);
    (workload, stats)
}

/// One short waiter of the workload (`struct short_waiter`).
#[derive(Clone, Debug)]
pub struct ShortWaiter {
    pub pid: u32,
    pub tid: u32,
    pub start_ms: u64,
    pub end_ms: u64,
    pub slept_ns: u64,
    pub done: bool,
}

/// What the workload measured (`struct stats` of offcpu_mix.c): cumulative
/// CLOCK_MONOTONIC nanoseconds of the worker's phases.
#[derive(Clone, Debug)]
pub struct Stats {
    pub worker_pid: u32,
    pub worker_tid: u32,
    pub feeder_tid: u32,
    pub idle_reader_pid: u32,
    pub iterations: u64,
    pub sleep_ns: u64,
    pub pipe_ns: u64,
    pub compute_ns: u64,
    pub total_ns: u64,
    pub short_done: u64,
    /// When the idle reader started its endless read (Unix ms; 0 before).
    pub idle_since_ms: u64,
    pub shorts: Vec<ShortWaiter>,
}

const HEADER_FIELDS: usize = 12;
const SHORT_FIELDS: usize = 6;

impl Stats {
    /// Each field is an aligned 8-byte store, never torn; fields may be up to
    /// one worker iteration (~10 ms) apart, nothing next to a 10 s window.
    pub fn read(path: &Path) -> Self {
        let bytes = std::fs::read(path)
            .unwrap_or_else(|err| panic!("reading the workload's stats {}: {err}", path.display()));
        let fields: Vec<i64> = bytes
            .as_chunks::<8>()
            .0
            .iter()
            .map(|chunk| i64::from_le_bytes(*chunk))
            .collect();
        assert!(
            fields.len() >= HEADER_FIELDS,
            "the stats file {} should hold at least {HEADER_FIELDS} fields, got {}",
            path.display(),
            fields.len()
        );
        let u = |i: usize| u64::try_from(fields[i]).expect("a non-negative stats field");
        let id = |i: usize| u32::try_from(fields[i]).expect("a pid in range");
        let shorts = fields[HEADER_FIELDS..]
            .as_chunks::<SHORT_FIELDS>()
            .0
            .iter()
            .map(|slot| ShortWaiter {
                pid: slot[0] as u32,
                tid: slot[1] as u32,
                start_ms: slot[2] as u64,
                end_ms: slot[3] as u64,
                slept_ns: slot[4] as u64,
                done: slot[5] == 1,
            })
            .filter(|slot| slot.tid != 0)
            .collect();
        Self {
            worker_pid: id(0),
            worker_tid: id(1),
            feeder_tid: id(2),
            idle_reader_pid: id(3),
            iterations: u(4),
            sleep_ns: u(5),
            pipe_ns: u(6),
            compute_ns: u(7),
            total_ns: u(8),
            short_done: u(10),
            idle_since_ms: u(11),
            shorts,
        }
    }

    /// Polls the stats until `ready` holds; a minute is a stall.
    pub fn wait_until(path: &Path, what: &str, ready: impl Fn(&Stats) -> bool) -> Self {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if std::fs::metadata(path).is_ok_and(|meta| meta.len() > 0) {
                let stats = Self::read(path);
                if ready(&stats) {
                    return stats;
                }
                assert!(
                    Instant::now() < deadline,
                    "the workload should have reached {what} within 60 s; its stats: {stats:?}"
                );
            } else {
                assert!(
                    Instant::now() < deadline,
                    "the workload did not create its stats file {} within 60 s",
                    path.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A profile as `go tool pprof -raw` reads it.
pub struct Profile {
    /// `type/unit` in value order.
    pub sample_types: Vec<String>,
    pub samples: Vec<RawSample>,
}

/// GETs `/pprof?type=TYPE&QUERY`, saved as artifacts/offcpu_NAME.pb.gz.
pub fn profile(daemon: &Daemon, profile_type: &str, query: &str, name: &str) -> Profile {
    let file = artifacts_dir().join(format!("offcpu_{name}_{profile_type}.pb.gz"));
    daemon.fetch_pprof(&format!("/pprof?type={profile_type}&{query}"), &file);
    let text = go_pprof(&["-raw", &file.display().to_string()]);
    Profile {
        sample_types: sample_types(&text),
        samples: parse_raw(&text),
    }
}

/// The line after `Samples:` in `go tool pprof -raw` output: the sample types.
pub fn sample_types(raw: &str) -> Vec<String> {
    let mut lines = raw.lines().skip_while(|line| *line != "Samples:");
    lines.next();
    lines
        .next()
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

pub fn ns(sample: &RawSample) -> u64 {
    u64::try_from(sample.values[1]).expect("non-negative nanoseconds")
}

pub fn total_ns<'a>(samples: impl IntoIterator<Item = &'a RawSample>) -> u64 {
    samples.into_iter().map(ns).sum()
}

pub fn through<'a>(samples: &'a [RawSample], function: &'a str) -> impl Iterator<Item = &'a RawSample> + 'a {
    samples
        .iter()
        .filter(move |sample| sample.functions.iter().any(|f| f == function))
}

/// The sample through `function` with the most time: the stack of that wait.
pub fn heaviest_through<'a>(samples: &'a [RawSample], function: &'a str, what: &str) -> &'a RawSample {
    through(samples, function)
        .max_by_key(|sample| ns(sample))
        .unwrap_or_else(|| panic!("{what}: expected a stack through {function}, found none"))
}

/// Panics unless `sample`'s stack is a wait as the daemon records it: leaf
/// `schedule` (the frames of the switch itself, down to `__schedule`, are
/// trimmed), the syscall entry, then `user` (root first, e.g. main,
/// worker_main, sleep_phase) in order, every frame from the leaf to
/// `user[0]` named.
pub fn assert_wait_stack(what: &str, sample: &RawSample, user: &[&str]) {
    let frames = &sample.functions;
    let shown = frames.join(" <- ");
    assert_eq!(
        frames.first().map(String::as_str),
        Some("schedule"),
        "{what}: the leaf of a blocked wait's stack should be schedule, got {shown}"
    );
    let root = user[0];
    let root_at = frames
        .iter()
        .position(|f| f == root)
        .unwrap_or_else(|| panic!("{what}: the stack should reach {root}, got {shown}"));
    let unnamed: Vec<&String> = frames[..=root_at]
        .iter()
        .filter(|f| f.is_empty() || f.starts_with("[unknown]"))
        .collect();
    assert!(
        unnamed.is_empty(),
        "{what}: every frame up to {root} should be named, got {unnamed:?} in {shown}"
    );
    // Leaf first: the syscall entry, then the user chain from its leaf end.
    let syscall_at = frames
        .iter()
        .position(|f| f.to_ascii_lowercase().contains("syscall"));
    let user_leaf_at = frames.iter().position(|f| f == user[user.len() - 1]);
    match (syscall_at, user_leaf_at) {
        (Some(syscall), Some(leaf)) if 1 < syscall && syscall < leaf => {}
        _ => panic!(
            "{what}: expected schedule, then a syscall entry, then {} (leaf first), got {shown}",
            user[user.len() - 1]
        ),
    }
    let root_first: Vec<&str> = frames.iter().rev().map(String::as_str).collect();
    let mut rest = root_first.iter();
    for wanted in user {
        assert!(
            rest.any(|frame| frame == wanted),
            "{what}: expected the chain {} (root first) in order, got {shown}",
            user.join(" -> ")
        );
    }
}

/// Panics unless (nearly) all the off-CPU time of `samples` is on stacks
/// that start where a thread gives up the CPU (`schedule`, `__cond_resched`,
/// `preempt_schedule...`: not the switch's own frames, which the daemon
/// trims); a lost stack may leave a little elsewhere.
pub fn assert_waits_start_at_schedule(what: &str, samples: &[RawSample]) {
    let all = total_ns(samples);
    let elsewhere: Vec<&RawSample> = samples
        .iter()
        .filter(|sample| {
            sample
                .functions
                .first()
                .is_none_or(|leaf| !is_scheduler_entry(leaf))
        })
        .collect();
    let share = percent(total_ns(elsewhere.iter().copied()), all);
    let mut leaves: HashMap<&str, u64> = HashMap::new();
    for sample in &elsewhere {
        let leaf = sample.functions.first().map_or("(no frames)", String::as_str);
        *leaves.entry(leaf).or_default() += ns(sample);
    }
    assert!(
        share <= 1.0,
        "{what}: off-CPU stacks should start at schedule (or another scheduler entry); {share:.2}% of {all} ns start \
         elsewhere (leaf -> ns: {leaves:?})"
    );
}

/// A kernel function through which a thread gives up the CPU.
fn is_scheduler_entry(name: &str) -> bool {
    name == "schedule"
        || name == "__cond_resched"
        || name.starts_with("preempt_schedule")
        || name.starts_with("schedule_")
}

pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// tid -> ns on CPU (schedstat's first field) for every thread of `pids`.
pub fn schedstat(pids: &[u32]) -> HashMap<u32, u64> {
    let mut threads = HashMap::new();
    for &pid in pids {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap_or_else(|err| panic!("listing the threads of {pid}: {err}"));
        for task in tasks.filter_map(Result::ok) {
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            let stat = std::fs::read_to_string(task.path().join("schedstat"))
                .unwrap_or_else(|err| panic!("schedstat of {pid}/{tid}: {err}"));
            let on_cpu = stat
                .split_whitespace()
                .next()
                .and_then(|field| field.parse().ok())
                .unwrap_or_else(|| panic!("schedstat of {tid} without a first field: {stat:?}"));
            threads.insert(tid, on_cpu);
        }
    }
    threads
}

/// GETs `/threads?QUERY` as JSON.
pub fn threads_json(daemon: &Daemon, query: &str) -> serde_json::Value {
    let response = daemon.get(&format!("/threads?{query}"));
    assert_eq!(response.status, 200, "GET /threads?{query}: {}", response.text());
    serde_json::from_slice(&response.body).expect("/threads answers JSON")
}

/// (start_ms, end_ms) of a /threads answer.
pub fn window_of(json: &serde_json::Value) -> (u64, u64) {
    let field = |name: &str| {
        json["window"][name]
            .as_u64()
            .unwrap_or_else(|| panic!("/threads should give window.{name} in ms, got {json}"))
    };
    (field("start_ms"), field("end_ms"))
}

/// The threads of a /threads answer by tid.
pub fn threads_by_tid(json: &serde_json::Value) -> HashMap<u32, serde_json::Value> {
    json["processes"]
        .as_array()
        .unwrap_or_else(|| panic!("/threads should hold a processes array, got {json}"))
        .iter()
        .flat_map(|process| process["threads"].as_array().cloned().unwrap_or_default())
        .map(|thread| {
            let tid = thread["tid"]
                .as_u64()
                .unwrap_or_else(|| panic!("every thread should have a tid, got {thread}"));
            (tid as u32, thread)
        })
        .collect()
}

/// Each process's times are the sums of its threads'.
pub fn assert_processes_sum_their_threads(json: &serde_json::Value) {
    for process in json["processes"].as_array().into_iter().flatten() {
        let threads = process["threads"].as_array().cloned().unwrap_or_default();
        for name in [
            "cpu_ns",
            "off_cpu_ns",
            "off_cpu_blocked_ns",
            "off_cpu_runnable_ns",
        ] {
            let sum: u64 = threads.iter().map(|thread| field_ns(thread, name)).sum();
            assert_eq!(
                field_ns(process, name),
                sum,
                "a process's {name} should be the sum of its threads': {process}"
            );
        }
    }
}

pub fn field_ns(thread: &serde_json::Value, name: &str) -> u64 {
    thread[name]
        .as_u64()
        .unwrap_or_else(|| panic!("/threads should give {name} for every thread, got {thread}"))
}

pub fn percent_off(got: u64, expected: u64) -> f64 {
    (got as f64 - expected as f64).abs() * 100.0 / (expected as f64).max(1.0)
}
