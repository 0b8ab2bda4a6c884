//! Issue 24 on this machine's own kernel: CPython programs profiled as
//! Python. Each test starts one daemon and runs its workloads side by side
//! (tests/workloads/python, plain Python for 3.8 to 3.13) under Debian's
//! /usr/bin/python3.11 and, where the issue asks it, every pyenv CPython
//! 3.8–3.13 present; it reads the daemon's pprof with its own decoder
//! (src/pprof.rs), where a Python frame is a location under the `[python]`
//! mapping (src/python.rs).
//!
//! - the split of a program that measures its own CPU time per function,
//!   through a closure inside a method called from main(), on every CPython;
//! - py-spy (PyPI) as an independent oracle on the same process;
//! - interleaving: C frames between the Python frames that call them and
//!   are called by them (zlib, OpenSSL's SHA-256, `sorted(key=...)`);
//! - threads: each thread's stack is its own, the GIL released or not;
//! - processes started before and after the daemon, living 300 ms, forked
//!   by multiprocessing, in a PID namespace of their own;
//! - a forged interpreter (tests/workloads/forged_python.c) run by an
//!   unprivileged user beside a real one.
//!
//! Expectations come from what the workloads measured themselves (their CPU
//! time), never from wall-clock promises.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use profilerd_tests::{
    Workload, artifacts_dir,
    attacker::attacker,
    cpu::{self, CpuMeter, Expected},
    daemon::Daemon,
    hostile::{Attack, Watched, metric_sum},
    pprof::{self, Profile, Sample},
    python::{
        self, Interpreter, count, holds, innermost, is_python, offending, python_names, root_first, script,
    },
    serial,
    stacks::{disagreements, percent, side_by_side},
};

/// The daemon's frequency in these tests: at 99 Hz a process sharing two
/// CPUs with six others gets ~300 samples in 10 s, whose sampling error
/// alone (~2.7 points on a 70% share) would make a 3-point agreement a coin
/// toss; at 999 Hz, with the CPU time asked below, it is under 1 point.
const HZ: u64 = 999;
const HZ_ARG: &str = "999";
/// Percentage points.
const POINTS: f64 = 3.0;
/// Seconds of wall time the long workloads are given: killed on drop long
/// before, however slow the machine.
const FOREVER: &str = "300";
/// CPU time each workload runs before a window opens: the interpreter's
/// start-up is over and the daemon has seen the process.
const WARM_UP: Duration = Duration::from_millis(700);
/// The longest a window waits for its workloads' CPU time on a busy machine.
const MAX_WINDOW: Duration = Duration::from_secs(45);

/// A fresh scratch directory for one test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("profilerd-python-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|err| panic!("creating {}: {err}", dir.display()));
    dir
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// Lets each process run [`WARM_UP`] of CPU time.
fn warm_up(pids: &[u32]) {
    for &pid in pids {
        cpu::run_for(pid, WARM_UP);
    }
}

/// Waits until each of `pids` has run `min_cpu` (or [`MAX_WINDOW`] has
/// passed), then fetches the daemon's profile of them over that time (the
/// last N whole seconds), saved as `name` under tests/artifacts.
fn observe(daemon: &Daemon, pids: &[u32], min_cpu: Duration, name: &str) -> Profile {
    let meters: Vec<CpuMeter> = pids.iter().map(|&pid| CpuMeter::start(&[pid])).collect();
    let started = Instant::now();
    while started.elapsed() < MAX_WINDOW && meters.iter().any(|meter| meter.so_far() < min_cpu) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let seconds = started.elapsed().as_secs_f64().ceil() as u64;
    fetch(daemon, pids, &format!("seconds={seconds}"), name)
}

/// `/pprof?pid=...&QUERY`, saved under tests/artifacts and decoded.
fn fetch(daemon: &Daemon, pids: &[u32], query: &str, name: &str) -> Profile {
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let path = format!("/pprof?pid={}&{query}", pids.join(","));
    let response = daemon.fetch_pprof(&path, &artifacts_dir().join(name));
    pprof::decode(&response.body)
}

fn of_pid(profile: &Profile, pid: u32) -> Vec<&Sample> {
    let pid = pid.to_string();
    profile
        .samples
        .iter()
        .filter(|sample| sample.label("pid") == pid)
        .collect()
}

/// Panics listing every failure, once all were collected, with the
/// daemon's Python metrics and lost samples (what a failure needs to be
/// understood).
fn assert_none(daemon: &Daemon, failures: &[String], what: &str) {
    if failures.is_empty() {
        return;
    }
    let metrics = daemon.get("/metrics").text();
    let relevant: Vec<&str> = metrics
        .lines()
        .filter(|line| {
            !line.starts_with('#')
                && (line.starts_with("profilerd_python")
                    || line.starts_with("profilerd_samples_lost")
                    || line.contains("stack_collision")
                    || line.contains("\"spilled\""))
        })
        .collect();
    panic!(
        "{what}: {} failure(s):\n\n{}\n\nthe daemon's metrics:\n{}",
        failures.len(),
        failures.join("\n\n"),
        relevant.join("\n")
    );
}

// ---------------------------------------------------------------- split.py

/// split.py under one interpreter, and the figures it writes.
struct Split {
    interpreter: Interpreter,
    workload: Workload,
    output: PathBuf,
    script: String,
}

impl Split {
    fn spawn(interpreter: &Interpreter, dir: &Path, scale: u32) -> Self {
        let output = dir.join(format!("split-{}.out", interpreter.label));
        let script = script("split.py");
        let scale = scale.to_string();
        let workload = Workload::spawn(
            interpreter.path_str(),
            &[&script, FOREVER, path_str(&output), &scale],
        );
        Self {
            interpreter: interpreter.clone(),
            workload,
            output,
            script,
        }
    }

    fn pid(&self) -> u32 {
        self.workload.pid()
    }

    /// What the program measured (ns of CPU in hot_a, in hot_b) between
    /// wall-clock times `start` and `end` (ns since the epoch): its
    /// cumulative figures interpolated at both ends.
    fn measured(&self, start: u64, end: u64) -> Result<(f64, f64), String> {
        let text = std::fs::read_to_string(&self.output)
            .map_err(|err| format!("reading {}: {err}", self.output.display()))?;
        // The last line may be half written.
        let series: Vec<[u64; 3]> = text
            .lines()
            .filter_map(|line| {
                let fields: Vec<u64> = line
                    .split_whitespace()
                    .filter_map(|field| field.parse().ok())
                    .collect();
                <[u64; 3]>::try_from(fields).ok()
            })
            .collect();
        let at = |time: u64| -> Result<(f64, f64), String> {
            let after = series.iter().position(|point| point[0] >= time);
            match after {
                Some(0) | None if series.is_empty() => Err("no figures yet".to_owned()),
                Some(0) => Err(format!(
                    "the window starts at {time}, before the program's first figure ({})",
                    series[0][0]
                )),
                Some(index) => {
                    let (before, after) = (series[index - 1], series[index]);
                    let part = (time - before[0]) as f64 / (after[0] - before[0]).max(1) as f64;
                    let lerp = |field: usize| {
                        before[field] as f64 + part * (after[field] as f64 - before[field] as f64)
                    };
                    Ok((lerp(1), lerp(2)))
                }
                None => {
                    let last = series[series.len() - 1];
                    Ok((last[1] as f64, last[2] as f64))
                }
            }
        };
        let (a0, b0) = at(start)?;
        let (a1, b1) = at(end)?;
        Ok((a1 - a0, b1 - b0))
    }

    /// Checks the process's samples in `profile` against what it measured
    /// over the profile's window; failures are pushed, a summary returned.
    fn check(&self, profile: &Profile, failures: &mut Vec<String>) -> String {
        let label = &self.interpreter.label;
        let name = |qualname: &str| self.interpreter.name(qualname);
        let (hot_a, hot_b) = (name("hot_a"), name("hot_b"));
        let chain: Vec<String> = [
            "<module>",
            "main",
            "Ledger.settle",
            "Ledger.settle.<locals>.one_round",
        ]
        .iter()
        .map(|qualname| name(qualname))
        .collect();
        let samples = of_pid(profile, self.pid());
        let a = count(samples.iter().copied(), |sample| holds(sample, &hot_a));
        let b = count(samples.iter().copied(), |sample| holds(sample, &hot_b));
        let total = count(samples.iter().copied(), |_| true);
        let window = (profile.time_nanos, profile.time_nanos + profile.duration_nanos);
        let (ma, mb) = match self.measured(window.0, window.1) {
            Ok(measured) => measured,
            Err(err) => {
                failures.push(format!("{label}: the program's figures: {err}"));
                return format!("{label}: no figures");
            }
        };
        let daemon_split = percent(a, a + b);
        let program_split = ma * 100.0 / (ma + mb).max(1.0);

        // The samples the program's CPU time in the two functions is worth.
        let expected = Expected::new(Duration::from_nanos((ma + mb) as u64), HZ);
        let worth = expected.samples();
        if worth < 500.0 {
            failures.push(format!(
                "{label}: the program ran only {:.3} s in hot_a and hot_b in the window ({worth:.0} samples' \
                 worth, 500 needed): the machine starved it; the test proves nothing like this",
                (ma + mb) / 1e9
            ));
        } else if !(0.8 * worth..=1.2 * worth).contains(&((a + b) as f64)) {
            failures.push(format!(
                "{label}: {} samples hold hot_a or hot_b, the {:.3} s the program measured in them are worth \
                 {worth:.0} (0.8 to 1.2 of that accepted); {total} samples of the process; the heaviest stacks:\n{}",
                a + b,
                (ma + mb) / 1e9,
                offending(samples.iter().copied(), |_| false, 8)
            ));
        }
        if (daemon_split - program_split).abs() > POINTS {
            failures.push(format!(
                "{label}: hot_a has {daemon_split:.2}% of the samples of hot_a and hot_b ({a} of {}), the program \
                 measured {program_split:.2}% of its CPU time there (±{POINTS} points accepted)",
                a + b
            ));
        }

        // No sample loses its stack: every one reaches the native root.
        let rooted = |sample: &Sample| {
            sample
                .frames
                .iter()
                .any(|frame| !is_python(frame) && frame.function == "Py_BytesMain")
        };
        let rooted_share = percent(count(samples.iter().copied(), rooted), total);
        if rooted_share < 98.0 {
            failures.push(format!(
                "{label}: only {rooted_share:.2}% of the process's {total} samples reach Py_BytesMain (98% needed: \
                 with --no-python-frames every one does); the heaviest others:\n{}",
                offending(samples.iter().copied(), rooted, 8)
            ));
        }

        // Every Python frame of the chain, in order, Py_BytesMain below.
        let whole = |sample: &Sample| {
            let names = python_names(sample);
            let frames = root_first(sample);
            let first_python = frames.iter().position(|frame| is_python(frame));
            let bytes_main = frames
                .iter()
                .position(|frame| !is_python(frame) && frame.function == "Py_BytesMain");
            names.len() == chain.len() + 1
                && names.iter().zip(&chain).all(|(got, wanted)| got == wanted)
                && (names[chain.len()] == hot_a || names[chain.len()] == hot_b)
                && matches!((bytes_main, first_python), (Some(native), Some(python)) if native < python)
        };
        let hot = |sample: &Sample| holds(sample, &hot_a) || holds(sample, &hot_b);
        let hot_samples: Vec<&Sample> = samples.iter().copied().filter(|sample| hot(sample)).collect();
        let whole_share = percent(count(hot_samples.iter().copied(), whole), a + b);
        if whole_share < 95.0 {
            failures.push(format!(
                "{label}: {whole_share:.2}% of the {} samples of hot_a or hot_b hold Py_BytesMain (native) -> {} -> \
                 hot_a|hot_b as their Python frames (95% needed); the heaviest others:\n{}",
                a + b,
                chain.join(" -> "),
                offending(hot_samples.iter().copied(), whole, 8)
            ));
        }

        // The leaf Python frame's file and line.
        let source = std::fs::read_to_string(&self.script).expect("reading split.py");
        let ranges = [
            (hot_a.clone(), python::function_lines(&source, "hot_a")),
            (hot_b.clone(), python::function_lines(&source, "hot_b")),
        ];
        let placed = |sample: &Sample| {
            sample
                .frames
                .iter()
                .find(|frame| is_python(frame))
                .is_some_and(|leaf| {
                    leaf.file == self.script
                        && ranges.iter().any(|(function, (first, last))| {
                            leaf.function == *function && (*first..=*last).contains(&leaf.line)
                        })
                })
        };
        let placed_share = percent(count(hot_samples.iter().copied(), placed), a + b);
        if placed_share < 95.0 {
            let lines: BTreeMap<String, u64> =
                hot_samples.iter().fold(BTreeMap::new(), |mut lines, sample| {
                    if let Some(leaf) = sample.frames.iter().find(|frame| is_python(frame)) {
                        *lines
                            .entry(format!("{} {}:{}", leaf.function, leaf.file, leaf.line))
                            .or_default() += sample.count();
                    }
                    lines
                });
            failures.push(format!(
                "{label}: {placed_share:.2}% of the samples of hot_a or hot_b have their leaf Python frame in {} \
                 within the function's lines {ranges:?} (95% needed); leaf frames seen:\n{lines:#?}",
                self.script
            ));
        }
        format!(
            "{label}: hot_a {daemon_split:.2}% in the profile, {program_split:.2}% measured by the program; \
             {} samples of hot_a/hot_b ({worth:.0} expected), {whole_share:.2}% with the whole chain, \
             {placed_share:.2}% at the right file and line; {rooted_share:.2}% of all {total} reach Py_BytesMain",
            a + b
        )
    }
}

#[test]
fn the_split_of_two_functions_behind_a_closure_is_the_program_s_own_on_every_cpython() {
    let _serial = serial();
    let interpreters = python::all();
    eprintln!(
        "CPython versions run: {}",
        interpreters
            .iter()
            .map(|interpreter| interpreter.label.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let dir = scratch("split");
    let daemon = Daemon::start(&["--frequency", HZ_ARG]);
    let runs: Vec<Split> = interpreters
        .iter()
        .map(|interpreter| Split::spawn(interpreter, &dir, 1))
        .collect();
    let pids: Vec<u32> = runs.iter().map(Split::pid).collect();
    warm_up(&pids);
    // ~4 000 samples each: a 3-point bar is over 4 standard deviations.
    let profile = observe(&daemon, &pids, Duration::from_secs(4), "python-split.pb.gz");
    let mut failures = Vec::new();
    let summaries: Vec<String> = runs
        .iter()
        .map(|run| run.check(&profile, &mut failures))
        .collect();
    eprintln!("{}", summaries.join("\n"));
    assert_none(&daemon, &failures, "split.py on every CPython");
}

// ------------------------------------------------------------------ py-spy

/// py-spy's `--format raw` output: (Python function names root first, count).
fn parse_py_spy_raw(text: &str) -> Vec<(Vec<String>, u64)> {
    text.lines()
        .filter_map(|line| {
            let (stack, count) = line.rsplit_once(' ')?;
            let count = count.parse().ok()?;
            let frames = stack
                .split(';')
                .filter(|frame| !frame.is_empty())
                // `name (file:line)`
                .map(|frame| frame.rsplit_once(" (").map_or(frame, |(name, _)| name).to_owned())
                .collect();
            Some((frames, count))
        })
        .collect()
}

/// Functions by inclusive share: the percentage of all samples whose stack
/// holds each, counted once per sample, highest first.
fn inclusive<'a>(stacks: impl IntoIterator<Item = (Vec<&'a str>, u64)>) -> Vec<(String, f64)> {
    let mut counts: HashMap<&str, u64> = HashMap::new();
    let mut total = 0;
    for (mut names, count) in stacks {
        total += count;
        names.sort_unstable();
        names.dedup();
        for name in names {
            *counts.entry(name).or_default() += count;
        }
    }
    let mut shares: Vec<(String, f64)> = counts
        .into_iter()
        .map(|(name, count)| (name.to_owned(), percent(count, total)))
        .collect();
    shares.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    shares
}

#[test]
fn py_spy_agrees_on_the_top_python_functions() {
    let _serial = serial();
    let interpreter = python::debian();
    let dir = scratch("py-spy");
    let daemon = Daemon::start(&["--frequency", HZ_ARG]);
    // Calls of ~0.2 s: py-spy samples wall-clock time, and a process that
    // reads its CPU clock every few milliseconds is preempted there more
    // often than elsewhere on a busy machine (the kernel checks its slice
    // as it reads it), which py-spy would count and a CPU profile not.
    let run = Split::spawn(&interpreter, &dir, 100);
    let pid = run.pid().to_string();
    warm_up(&[run.pid()]);
    let raw = dir.join("py-spy.raw");
    let seconds = "10";
    let py_spy = Command::new("py-spy")
        .args([
            "record",
            "--pid",
            &pid,
            "--duration",
            seconds,
            "--rate",
            "500",
            "--format",
            "raw",
        ])
        .arg("--output")
        .arg(&raw)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running py-spy (scripts/setup-tests.sh installs it from PyPI as /usr/local/bin/py-spy)");
    // The same seconds, drained at both ends.
    let response = daemon.fetch_pprof(
        &format!("/debug/pprof/profile?seconds={seconds}&pid={pid}"),
        &artifacts_dir().join("python-py-spy.pb.gz"),
    );
    let py_spy = py_spy.wait_with_output().expect("waiting for py-spy");
    assert!(
        py_spy.status.success(),
        "py-spy record failed ({}):\n{}{}",
        py_spy.status,
        String::from_utf8_lossy(&py_spy.stdout),
        String::from_utf8_lossy(&py_spy.stderr)
    );
    let _ = std::fs::copy(&raw, artifacts_dir().join("python-py-spy.raw"));
    let oracle = parse_py_spy_raw(&std::fs::read_to_string(&raw).expect("reading py-spy's output"));
    let oracle_total: u64 = oracle.iter().map(|(_, count)| count).sum();
    let profile = pprof::decode(&response.body);
    let samples = of_pid(&profile, run.pid());
    let daemon_total = count(samples.iter().copied(), |_| true);
    assert!(
        oracle_total >= 1000,
        "py-spy took only {oracle_total} samples in {seconds} s at 500 Hz: {}",
        String::from_utf8_lossy(&py_spy.stderr)
    );

    let theirs = inclusive(
        oracle
            .iter()
            .map(|(names, count)| (names.iter().map(String::as_str).collect(), *count)),
    );
    let ours = inclusive(
        samples
            .iter()
            .map(|sample| (python_names(sample), sample.count())),
    );
    eprintln!(
        "inclusive shares, py-spy ({oracle_total} samples) then profilerd ({daemon_total}):\n{}",
        side_by_side(&theirs, &ours, 10)
    );
    let differ = disagreements(&theirs, &ours, 10, POINTS);
    let mut failures = Vec::new();
    if !differ.is_empty() {
        failures.push(format!(
            "the top 10 Python functions of py-spy and of profilerd differ by more than {POINTS} points: \
             {differ:?}\n{}profilerd's heaviest stacks:\n{}",
            side_by_side(&theirs, &ours, 10),
            offending(samples.iter().copied(), |_| false, 8)
        ));
    }
    // And both against the program itself.
    eprintln!("{}", run.check(&profile, &mut failures));
    assert_none(&daemon, &failures, "py-spy and profilerd on split.py");
}

// -------------------------------------------------------------- interleave

/// Whether a native frame is zlib's.
fn zlib_frame(frame: &pprof::Frame) -> bool {
    !is_python(frame) && frame.mapping.contains("libz.so")
}

/// Whether a native frame is SHA-256's (OpenSSL's, or CPython's own
/// `_sha256` module where hashlib has no OpenSSL).
fn sha256_frame(frame: &pprof::Frame) -> bool {
    !is_python(frame)
        && (frame.mapping.contains("libcrypto") || frame.function.to_ascii_lowercase().contains("sha256"))
}

/// The share (percent) of `among` samples that satisfy `keep`, pushing a
/// failure below `min`.
#[allow(clippy::too_many_arguments)]
fn bar(
    label: &str,
    what: &str,
    among: &[&Sample],
    keep: impl Fn(&Sample) -> bool,
    min: f64,
    failures: &mut Vec<String>,
) -> String {
    let total = count(among.iter().copied(), |_| true);
    let share = percent(count(among.iter().copied(), &keep), total);
    if total < 50 {
        failures.push(format!(
            "{label}: only {total} samples to measure {what} (50 needed); the process's heaviest stacks:\n{}",
            offending(among.iter().copied(), |_| false, 8)
        ));
    } else if share < min {
        failures.push(format!(
            "{label}: {what}: {share:.2}% of {total} samples ({min}% needed); the heaviest others:\n{}",
            offending(among.iter().copied(), &keep, 8)
        ));
    }
    format!("{label}: {what}: {share:.2}% of {total}")
}

fn check_interleaving(
    interpreter: &Interpreter,
    samples: &[&Sample],
    failures: &mut Vec<String>,
) -> Vec<String> {
    let label = &interpreter.label;
    let mut summary = Vec::new();
    let holding = |name: &str| -> Vec<&Sample> {
        samples
            .iter()
            .copied()
            .filter(|sample| holds(sample, name))
            .collect()
    };
    // Native frames leafward of the innermost `caller`, and no Python frame.
    let leafward = |sample: &Sample, caller: &str, native: &dyn Fn(&pprof::Frame) -> bool| {
        let frames = root_first(sample);
        innermost(&frames, caller).is_some_and(|at| {
            let above = &frames[at + 1..];
            above.iter().all(|frame| !is_python(frame)) && above.iter().any(|frame| native(frame))
        })
    };
    summary.push(bar(
        label,
        "compress_stage samples with zlib's frames (and no Python frame) leafward of it",
        &holding("compress_stage"),
        |sample| leafward(sample, "compress_stage", &zlib_frame),
        90.0,
        failures,
    ));
    summary.push(bar(
        label,
        "compress_stage samples with zlib's `deflate` leafward of it",
        &holding("compress_stage"),
        |sample| leafward(sample, "compress_stage", &|frame| frame.function == "deflate"),
        80.0,
        failures,
    ));
    // The other way round: zlib's frames are under compress_stage, never
    // under another Python frame.
    let with_zlib: Vec<&Sample> = samples
        .iter()
        .copied()
        .filter(|sample| sample.frames.iter().any(zlib_frame))
        .collect();
    summary.push(bar(
        label,
        "samples in zlib whose innermost Python frame is compress_stage",
        &with_zlib,
        |sample| {
            let frames = root_first(sample);
            let first_zlib = frames.iter().position(|frame| zlib_frame(frame));
            let last_python = frames.iter().rposition(|frame| is_python(frame));
            matches!((last_python, first_zlib), (Some(python), Some(zlib)) if python < zlib)
                && python_names(sample).last() == Some(&"compress_stage")
        },
        99.0,
        failures,
    ));
    summary.push(bar(
        label,
        "hash_stage samples with SHA-256 frames (and no Python frame) leafward of it",
        &holding("hash_stage"),
        |sample| leafward(sample, "hash_stage", &sha256_frame),
        90.0,
        failures,
    ));
    // sorted(key=pykey): pykey above the C sort, the C sort above sort_stage.
    let sort_names: &[&str] = if interpreter.has_symbols {
        &["list_sort_impl"]
    } else {
        &[]
    };
    summary.push(bar(
        label,
        &format!(
            "pykey samples with sort_stage rootward and native frames{} (no other Python frame) between them",
            if sort_names.is_empty() {
                String::new()
            } else {
                format!(" including {sort_names:?}")
            }
        ),
        &holding("pykey"),
        |sample| {
            let frames = root_first(sample);
            let (Some(key), Some(sort)) = (innermost(&frames, "pykey"), innermost(&frames, "sort_stage"))
            else {
                return false;
            };
            sort < key && {
                let between = &frames[sort + 1..key];
                !between.is_empty()
                    && between.iter().all(|frame| !is_python(frame))
                    && sort_names
                        .iter()
                        .all(|name| between.iter().any(|frame| frame.function == *name))
            }
        },
        95.0,
        failures,
    ));
    summary
}

#[test]
fn c_frames_sit_between_the_python_frames_that_call_them_and_that_they_call() {
    let _serial = serial();
    let interpreters = python::all();
    let daemon = Daemon::start(&["--frequency", HZ_ARG]);
    let script = script("interleave.py");
    let workloads: Vec<(Interpreter, Workload)> = interpreters
        .iter()
        .map(|interpreter| {
            let workload = Workload::spawn(interpreter.path_str(), &[&script, FOREVER]);
            (interpreter.clone(), workload)
        })
        .collect();
    let pids: Vec<u32> = workloads.iter().map(|(_, workload)| workload.pid()).collect();
    // Its start-up builds the data (~0.5 s).
    for &pid in &pids {
        cpu::run_for(pid, WARM_UP * 2);
    }
    let profile = observe(&daemon, &pids, Duration::from_secs(1), "python-interleave.pb.gz");
    let mut failures = Vec::new();
    for (interpreter, workload) in &workloads {
        let samples = of_pid(&profile, workload.pid());
        let summary = check_interleaving(interpreter, &samples, &mut failures);
        eprintln!("{}", summary.join("\n"));
    }
    assert_none(&daemon, &failures, "interleave.py");
}

// ----------------------------------------------------------------- threads

#[test]
fn each_thread_has_its_own_stack_with_or_without_the_gil() {
    let _serial = serial();
    let interpreters = python::all();
    let dir = scratch("threads");
    let daemon = Daemon::start(&["--frequency", HZ_ARG]);
    let script = script("threads.py");
    let workloads: Vec<(Interpreter, Workload, PathBuf)> = interpreters
        .iter()
        .map(|interpreter| {
            let output = dir.join(format!("threads-{}.out", interpreter.label));
            let workload = Workload::spawn(interpreter.path_str(), &[&script, FOREVER, path_str(&output)]);
            (interpreter.clone(), workload, output)
        })
        .collect();
    let pids: Vec<u32> = workloads.iter().map(|(_, workload, _)| workload.pid()).collect();
    warm_up(&pids);
    // Two busy threads each: 1.5 s of CPU per process is ~750 samples a thread.
    let profile = observe(
        &daemon,
        &pids,
        Duration::from_millis(1500),
        "python-threads.pb.gz",
    );
    let mut failures = Vec::new();
    for (interpreter, workload, output) in &workloads {
        let label = &interpreter.label;
        let tids: HashMap<String, String> = std::fs::read_to_string(output)
            .unwrap_or_else(|err| panic!("{label}: reading {}: {err}", output.display()))
            .lines()
            .filter_map(|line| line.split_once(' '))
            .map(|(name, tid)| (name.to_owned(), tid.to_owned()))
            .collect();
        let samples = of_pid(&profile, workload.pid());
        let of_thread = |name: &str| -> Vec<&Sample> {
            let tid = &tids[name];
            samples
                .iter()
                .copied()
                .filter(|sample| sample.label("thread_id") == tid.as_str())
                .collect()
        };
        let python_thread = of_thread("py-compute");
        let c_thread = of_thread("c-hash");
        let summary = [
            bar(
                label,
                "py-compute thread: samples in python_compute (leaf Python frame), never hash_in_c",
                &python_thread,
                |sample| {
                    python_names(sample).last() == Some(&"python_compute") && !holds(sample, "hash_in_c")
                },
                95.0,
                &mut failures,
            ),
            bar(
                label,
                "c-hash thread (GIL released): SHA-256 frames leafward of its own hash_in_c, never python_compute",
                &c_thread,
                |sample| {
                    let frames = root_first(sample);
                    !holds(sample, "python_compute")
                        && innermost(&frames, "hash_in_c").is_some_and(|at| {
                            frames[at + 1..].iter().all(|frame| !is_python(frame))
                                && frames[at + 1..].iter().any(|frame| sha256_frame(frame))
                        })
                },
                90.0,
                &mut failures,
            ),
        ];
        // Whatever the shares, no sample of one thread may hold the other's function.
        for (thread, samples, foreign) in [
            ("py-compute", &python_thread, "hash_in_c"),
            ("c-hash", &c_thread, "python_compute"),
        ] {
            let mixed = count(samples.iter().copied(), |sample| holds(sample, foreign));
            if mixed > 0 {
                failures.push(format!(
                    "{label}: {mixed} samples of thread {thread} (tid {}) hold the other thread's {foreign}:\n{}",
                    tids[thread],
                    offending(samples.iter().copied(), |sample| !holds(sample, foreign), 5)
                ));
            }
        }
        eprintln!("{}", summary.join("\n"));
    }
    assert_none(&daemon, &failures, "threads.py");
}

// --------------------------------------------------------------- lifecycle

/// A process that is not our child (a multiprocessing child), killed when
/// dropped.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.0) {
            // SAFETY: kill(2) takes no pointers.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Waits (at most 30 s) for a file a workload writes, and returns it.
fn wait_for_file(path: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{} was not written within 30 s",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The first child of `pid`.
fn child_of(pid: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(child) = children
            .split_whitespace()
            .next()
            .and_then(|child| child.parse().ok())
        {
            return child;
        }
        assert!(Instant::now() < deadline, "pid {pid} has no child after 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `NSpid:` line of a process: its pid in each namespace, outermost first.
fn ns_pids(pid: u32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))
        .map(|pids| pids.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

#[test]
fn processes_before_after_short_lived_forked_and_namespaced_show_their_python() {
    let _serial = serial();
    let interpreter = python::debian();
    let python = interpreter.path_str();
    let dir = scratch("lifecycle");
    let burn = script("burn.py");
    let before = Workload::spawn(python, &[&burn, "started_before_daemon", FOREVER]);
    cpu::run_for(before.pid(), WARM_UP);
    let daemon = Daemon::start(&["--frequency", HZ_ARG]);
    let after = Workload::spawn(python, &[&burn, "started_after_daemon", FOREVER]);
    let forked_output = dir.join("multiprocessing.out");
    let _parent = Workload::spawn(
        python,
        &[&script("multiproc.py"), FOREVER, path_str(&forked_output)],
    );
    let forked: u32 = wait_for_file(&forked_output)
        .trim()
        .parse()
        .expect("the child's pid");
    let _forked_guard = KillOnDrop(forked);
    // Its own PID namespace (and mount namespace, for its /proc): the
    // interpreter runs as PID 1 there.
    let unshare = Workload::spawn(
        "unshare",
        &[
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            python,
            &burn,
            "in_pid_namespace",
            FOREVER,
        ],
    );
    let namespaced = child_of(unshare.pid());
    let _namespaced_guard = KillOnDrop(namespaced);
    let nspid = ns_pids(namespaced);
    assert!(
        nspid.len() == 2 && nspid[1] == "1",
        "pid {namespaced} should be PID 1 of a namespace of its own, NSpid: {nspid:?}"
    );
    let long = [
        (before.pid(), "started_before_daemon"),
        (after.pid(), "started_after_daemon"),
        (forked, "multiprocessing_child_work"),
        (namespaced, "in_pid_namespace"),
    ];
    let long_pids: Vec<u32> = long.iter().map(|(pid, _)| *pid).collect();
    warm_up(&long_pids);

    // The window: short-lived processes one after another, each ~300 ms.
    let meters: Vec<CpuMeter> = long_pids.iter().map(|&pid| CpuMeter::start(&[pid])).collect();
    let started = Instant::now();
    let short_output = dir.join("short-lived.out");
    let short_lived = script("short_lived.py");
    let mut short_pids = Vec::new();
    for _ in 0..4 {
        let process = Workload::spawn(python, &[&short_lived, "250", path_str(&short_output)]);
        short_pids.push(process.pid());
        process.wait();
    }
    while started.elapsed() < MAX_WINDOW && meters.iter().any(|meter| meter.so_far() < Duration::from_secs(1))
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    let seconds = started.elapsed().as_secs_f64().ceil() as u64 + 1;
    let all: Vec<u32> = long_pids.iter().chain(&short_pids).copied().collect();
    let profile = fetch(
        &daemon,
        &all,
        &format!("seconds={seconds}"),
        "python-lifecycle.pb.gz",
    );

    let mut failures = Vec::new();
    let mut summary = Vec::new();
    for (pid, function) in long {
        let samples = of_pid(&profile, pid);
        let what = format!("pid {pid}, {function}");
        // burn.py's functions call spin(); the child's work is its own loop.
        let leaf = if function == "multiprocessing_child_work" {
            function
        } else {
            "spin"
        };
        summary.push(bar(
            &what,
            &format!("samples whose Python frames go from <module> through {function} to {leaf} (leaf)"),
            &samples,
            |sample| {
                let names = python_names(sample);
                names.first() == Some(&"<module>") && names.contains(&function) && names.last() == Some(&leaf)
            },
            95.0,
            &mut failures,
        ));
        if pid == namespaced {
            let labels: Vec<&str> = samples.iter().map(|sample| sample.label("ns_pid")).collect();
            eprintln!(
                "the namespaced process's ns_pid labels: {:?}",
                labels.iter().collect::<std::collections::BTreeSet<_>>()
            );
        }
    }
    // The short-lived ones: the CPU their work ran, as they measured it.
    let work_ns: u64 = std::fs::read_to_string(&short_output)
        .expect("the short-lived processes' figures")
        .lines()
        .filter_map(|line| line.trim().parse::<u64>().ok())
        .sum();
    let short_samples: Vec<&Sample> = short_pids.iter().flat_map(|&pid| of_pid(&profile, pid)).collect();
    let in_work = count(short_samples.iter().copied(), |sample| {
        python_names(sample).last() == Some(&"short_lived_work")
    });
    let worth = Expected::new(Duration::from_nanos(work_ns), HZ).samples();
    summary.push(format!(
        "the 4 short-lived processes: {in_work} samples in short_lived_work, {worth:.0} expected from the {:.3} s \
         they measured",
        work_ns as f64 / 1e9
    ));
    if worth < 400.0 || !(0.7 * worth..=1.2 * worth).contains(&(in_work as f64)) {
        failures.push(format!(
            "the short-lived processes: {in_work} samples in short_lived_work (leaf Python frame), {worth:.0} \
             expected from the {:.3} s they measured (0.7 to 1.2 of that accepted, and at least 400 expected); \
             their heaviest stacks:\n{}",
            work_ns as f64 / 1e9,
            offending(short_samples.iter().copied(), |_| false, 8)
        ));
    }
    eprintln!("{}", summary.join("\n"));
    assert_none(&daemon, &failures, "processes of every kind of life");
}

// ------------------------------------------------------------------ forged

/// The forged interpreter (tests/workloads/forged_python.c).
const FORGED: &str = env!("WORKLOAD_FORGED_PYTHON");
/// The longest name a Python frame may get ("a few KiB").
const MAX_NAME: usize = 4096;
/// The most Python frames a stack may get: the walk is bounded (the issue
/// asks a cap of at least 128; the forged "deep" thread has 100 000).
const MAX_DEPTH: usize = 4096;
/// How much the daemon's RSS may grow over the attack's last 20 s, beyond
/// what its sample store grew.
const RSS_GROWTH_KIB: u64 = 16 << 10;

/// The bytes the daemon's sample store holds.
fn store_bytes(metrics: &str) -> u64 {
    metric_sum(metrics, "profilerd_store_bytes").expect("profilerd_store_bytes in /metrics") as u64
}

/// Every series of the daemon's Python walk ends, by its labels: the
/// metrics whose name holds `python_walks` (`profilerd_python_walks_total`,
/// labelled by `end`).
fn python_walk_ends(metrics: &str) -> BTreeMap<String, f64> {
    metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (name, labels) = series.split_once('{')?;
            (name.contains("python_walks") && labels.contains("end=\""))
                .then(|| Some((series.to_owned(), value.parse().ok()?)))
                .flatten()
        })
        .collect()
}

/// The walks that ended otherwise than complete (for the record).
fn failed_walks(ends: &BTreeMap<String, f64>) -> f64 {
    ends.iter()
        .filter(|(series, _)| !series.contains("\"complete\""))
        .map(|(_, value)| value)
        .sum()
}

#[test]
fn a_forged_interpreter_beside_a_real_one_is_walked_bounded_and_counted() {
    let _serial = serial();
    let dir = scratch("forged");
    let mut watched = Watched::start(&["--frequency", HZ_ARG]);
    let real = Split::spawn(&python::debian(), &dir, 1);
    let mut command = attacker().command(FORGED);
    command.arg("120");
    let mut attack = Attack::spawn("forged CPython 3.11", command);
    attack.wait_for("ready", Duration::from_secs(30));
    warm_up(&[real.pid()]);
    let ends_before = python_walk_ends(&watched.metrics());
    // 10 s for the daemon to meet the forged process (and its store to
    // fill at this rate), then 20 s in which its memory must stay flat.
    let warm = watched.during_attack(&mut attack, Duration::from_secs(10));
    let store_warm = store_bytes(&watched.metrics());
    let observed = watched.during_attack(&mut attack, Duration::from_secs(20));
    let metrics = watched.metrics();
    let store_grown = store_bytes(&metrics).saturating_sub(store_warm) >> 10;
    let ends_after = python_walk_ends(&metrics);
    let profile = fetch(
        &watched.daemon,
        &[real.pid(), attack.pid()],
        "seconds=25",
        "python-forged.pb.gz",
    );
    attack.assert_running();

    let mut failures = Vec::new();
    // Memory flat: during_attack bounded it; beyond the sample store
    // filling (bounded by --store-max-mb), it must not grow either.
    let rss_grown = observed.rss_kib.1.saturating_sub(warm.rss_kib.1);
    if rss_grown > store_grown + RSS_GROWTH_KIB {
        failures.push(format!(
            "the daemon's RSS grew from {} KiB to {} KiB over the attack's last 20 s, its sample store by {store_grown} \
             KiB (at most the store's growth + {RSS_GROWTH_KIB} KiB accepted)",
            warm.rss_kib.1, observed.rss_kib.1
        ));
    }
    // The real workload's profile is right.
    let real_summary = real.check(&profile, &mut failures);
    // The forged process: walked, bounded.
    let forged = of_pid(&profile, attack.pid());
    let forged_total = count(forged.iter().copied(), |_| true);
    let longest = forged
        .iter()
        .flat_map(|sample| sample.frames.iter())
        .filter(|frame| is_python(frame))
        .map(|frame| frame.function.len().max(frame.file.len()))
        .max()
        .unwrap_or(0);
    if longest > MAX_NAME {
        failures.push(format!(
            "a forged Python frame got a name or file of {longest} bytes (at most {MAX_NAME})"
        ));
    }
    let deepest = forged
        .iter()
        .map(|sample| sample.frames.iter().filter(|frame| is_python(frame)).count())
        .max()
        .unwrap_or(0);
    if deepest > MAX_DEPTH {
        failures.push(format!(
            "a forged stack got {deepest} Python frames (the walk must be bounded; at most {MAX_DEPTH} accepted)"
        ));
    }
    let by_thread: BTreeMap<&str, u64> = forged.iter().fold(BTreeMap::new(), |mut threads, sample| {
        *threads.entry(sample.label("thread_name")).or_default() += sample.count();
        threads
    });
    let failed = failed_walks(&ends_after) - failed_walks(&ends_before);
    // Each forgery that cannot end well is counted by its end: the walk
    // metrics cover the whole attack (30 s), the profile its last 25 s, so
    // the counts are at least the samples (walked whether or not their
    // stacks were kept).
    let ended = |end: &str| {
        let series = format!("profilerd_python_walks_total{{end=\"{end}\"}}");
        ends_after.get(&series).copied().unwrap_or(0.0) - ends_before.get(&series).copied().unwrap_or(0.0)
    };
    let samples_of = |threads: &[&str]| -> u64 {
        threads
            .iter()
            .map(|name| by_thread.get(name).copied().unwrap_or(0))
            .sum()
    };
    for (threads, ends, why) in [
        (
            &["cyclic", "pair"][..],
            &["invalid", "read_fault", "depth_limit"][..],
            "a frame that is its own previous, a pair of frames each the other's previous, garbage code pointers",
        ),
        (&["deep"][..], &["depth_limit"][..], "100 000 frames"),
        (
            &["orphan"][..],
            &["no_thread_state"][..],
            "a thread in no thread list",
        ),
    ] {
        let samples = samples_of(threads);
        let counted: f64 = ends.iter().map(|end| ended(end)).sum();
        if samples < 100 || counted < 0.9 * samples as f64 {
            failures.push(format!(
                "the forged threads {threads:?} ({why}) had {samples} samples in the last 25 s (100 needed), and \
                 /metrics counted {counted} walks ending {ends:?} over the attack (0.9 of the samples needed); \
                 the walk ends before the attack:\n{ends_before:#?}\nafter:\n{ends_after:#?}"
            ));
        }
    }
    eprintln!(
        "{real_summary}\nthe forged process: {forged_total} samples by thread {by_thread:?}; longest Python name \
         {longest} bytes, deepest Python stack {deepest} frames; {failed} failed walks counted; daemon RSS \
         {} KiB at the start, {} KiB after 10 s, {} KiB at the end (peak {}), store grown {store_grown} KiB in the \
         last 20 s\nwalk ends: {ends_after:#?}",
        warm.rss_kib.0,
        warm.rss_kib.1,
        observed.rss_kib.1,
        observed.max_rss_kib.max(warm.max_rss_kib)
    );
    if failures.is_empty() {
        // Not a bar, a record: what the forged threads' stacks became.
        eprintln!(
            "forged stacks:\n{}",
            offending(forged.iter().copied(), |_| false, 12)
        );
    }
    assert_none(&watched.daemon, &failures, "the forged interpreter");
}
