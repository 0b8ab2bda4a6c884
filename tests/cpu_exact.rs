//! Per-thread CPU time in every window, whatever the thread's rhythm: a
//! window's cpu/nanoseconds of a thread are what the kernel accounted to it
//! in that window (/proc/PID/task/TID/schedstat, first field: ns on CPU).
//!
//! A thread's CPU time cannot be credited only when a sample lands on it: a
//! thread whose rhythm beats with the sampling period (busy 5 ms of every
//! 10 ms, sampled every 10.1 ms) goes unsampled for hundreds of
//! milliseconds, and its CPU time would land in a later window, or in none
//! when it exits first.

use std::{
    collections::HashMap,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use profilerd_tests::{
    Workload, artifacts_dir,
    daemon::Daemon,
    pprof::{self, Profile},
    protowire, serial, thread_names,
};

/// Back-to-back scrapes per frequency: a beat of the rhythm with the
/// sampling period lasts from a second (10 ms against 10.1 ms) to a hundred
/// (10.1 ms against 10.101 ms), so a thread may go unsampled for many
/// windows in a row, and then be sampled for many.
const WINDOWS: usize = 20;
const WINDOW_SECONDS: u64 = 5;
const BOUND_PERCENT: f64 = 3.0;
/// The rhythm threads' shares of each period, in percent.
const DUTIES: [u32; 3] = [50, 25, 10];
/// Always running, at nice 19: it takes only what the rhythm threads leave.
const BUSY: &str = "busy-100";
/// The rhythm workload's life: it outlives the windows however slow the
/// machine; killed on drop.
const WORKLOAD_SECONDS: &str = "600";

/// ns on CPU of `tid` of `pid`, from schedstat.
fn schedstat_ns(pid: u32, tid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))
        .unwrap_or_else(|err| panic!("schedstat of {pid}/{tid}: {err}"));
    stat.split_whitespace()
        .next()
        .and_then(|ns| ns.parse().ok())
        .unwrap_or_else(|| panic!("schedstat of {pid}/{tid} without a first field: {stat:?}"))
}

fn gunzip(gzipped: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(gzipped)
        .read_to_end(&mut bytes)
        .expect("a profile is gzipped protobuf");
    bytes
}

/// The profile's sample types (`type/unit`), from the protobuf: values[1]
/// must be cpu/nanoseconds for the sums below to mean anything.
fn sample_types(gzipped: &[u8]) -> Vec<String> {
    use protowire::{bytes_of, fields, varint_of};
    let bytes = gunzip(gzipped);
    let profile = fields(&bytes).unwrap_or_else(|err| panic!("a profile is protobuf: {err}"));
    let strings = bytes_of(&profile, 6);
    let string = |index: u64| {
        let bytes = strings
            .get(usize::try_from(index).unwrap_or(usize::MAX))
            .unwrap_or_else(|| panic!("string {index} past the profile's table"));
        String::from_utf8_lossy(bytes).into_owned()
    };
    bytes_of(&profile, 1)
        .iter()
        .map(|bytes| fields(bytes).unwrap_or_else(|err| panic!("a sample type: {err}")))
        .map(|value_type| {
            format!(
                "{}/{}",
                string(varint_of(&value_type, 1)),
                string(varint_of(&value_type, 2))
            )
        })
        .collect()
}

/// Decodes a CPU profile, checking its sample types first.
fn cpu_profile(gzipped: &[u8]) -> Profile {
    let types = sample_types(gzipped);
    assert_eq!(
        types,
        ["samples/count", "cpu/nanoseconds"],
        "a CPU profile's sample types"
    );
    pprof::decode(gzipped)
}

/// cpu/nanoseconds summed per value of the sample label `key`.
fn cpu_by_label(profile: &Profile, key: &str) -> HashMap<String, u64> {
    let mut sums = HashMap::new();
    for sample in &profile.samples {
        *sums.entry(sample.label(key).to_owned()).or_default() += u64::try_from(sample.values[1])
            .unwrap_or_else(|_| panic!("a negative cpu/nanoseconds: {sample:?}"));
    }
    sums
}

fn percent_off(got: f64, expected: f64) -> f64 {
    (got - expected).abs() * 100.0 / expected
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// How often the schedstat of the rhythm workload's threads is read while
/// it is scraped: the kernel's figure at a window's edge is interpolated
/// between the readings either side, off by at most what a thread runs in
/// one interval (a 10% thread in a 1 ms rhythm: 0.5 ms a 5 ms interval,
/// 0.1% of its 5 s window).
const READ_EVERY: Duration = Duration::from_millis(5);
/// A reading whose files took longer than this to read (the reader was
/// preempted) is dropped: its time would be unclear.
const READ_AT_MOST_NS: u64 = 1_000_000;

/// schedstat of threads, read in the background: (Unix ns, each thread's ns
/// on CPU, in the order of the tids asked for), oldest first.
type Readings = Vec<(u64, Vec<u64>)>;

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as u64)
}

/// Reads the schedstat of `tids` every [`READ_EVERY`] until `stop`.
fn read_schedstat_until(pid: u32, tids: &[u32], stop: &AtomicBool) -> Readings {
    let mut readings = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let before = unix_ns();
        let ns = tids.iter().map(|&tid| schedstat_ns(pid, tid)).collect();
        let after = unix_ns();
        if after - before <= READ_AT_MOST_NS {
            readings.push((before + (after - before) / 2, ns));
        }
        std::thread::sleep(READ_EVERY);
    }
    readings
}

/// Thread `index`'s ns on CPU at `at_ns` (Unix ns), interpolated between
/// the readings either side, and the time between those two readings.
fn schedstat_at(readings: &Readings, index: usize, at_ns: u64) -> (f64, u64) {
    let after = readings.partition_point(|(time, _)| *time < at_ns);
    assert!(
        after > 0 && after < readings.len(),
        "schedstat should have been read before and after {at_ns} ns (Unix): readings from {:?} to {:?}",
        readings.first().map(|reading| reading.0),
        readings.last().map(|reading| reading.0)
    );
    let ((t0, ns0), (t1, ns1)) = (&readings[after - 1], &readings[after]);
    let (v0, v1) = (ns0[index] as f64, ns1[index] as f64);
    let fraction = (at_ns - t0) as f64 / (t1 - t0).max(1) as f64;
    (v0 + (v1 - v0) * fraction, t1 - t0)
}

/// One scrape: each thread's CPU rate (CPUs) in the profile and in
/// schedstat, both over the profile's own window.
struct Window {
    seconds: f64,
    /// The longest time between the readings of schedstat either side of
    /// one of its edges, ms.
    gap_ms: f64,
    /// name -> (profile rate, kernel rate)
    rates: HashMap<String, (f64, f64)>,
}

/// The rhythm threads of `periods` (ms, as the workload takes them): for
/// each period ("-a" the first, "-b" the second) one thread per duty.
/// Name, period, duty percent.
fn rhythm_threads(periods: [&str; 2]) -> Vec<(String, String, u32)> {
    let mut threads = Vec::new();
    for (suffix, period) in ["a", "b"].iter().zip(periods) {
        for duty in DUTIES {
            threads.push((format!("d{duty}-{suffix}"), period.to_owned(), duty));
        }
    }
    threads
}

/// 20 back-to-back 5 s scrapes of a workload of rhythm threads at
/// `frequency` Hz; every thread's CPU rate in each profile within 3% of
/// what schedstat says it ran in the same window.
fn rhythms_match_schedstat_in_every_window(frequency: u32, periods: [&str; 2]) {
    let _serial = serial();
    let hz = frequency.to_string();
    let daemon = Daemon::start(&["--frequency", &hz]);
    let rhythms = rhythm_threads(periods);
    let mut args = vec!["rhythm".to_owned(), WORKLOAD_SECONDS.to_owned()];
    args.push(format!("{BUSY}:0:100"));
    args.extend(
        rhythms
            .iter()
            .map(|(name, period, duty)| format!("{name}:{period}:{duty}")),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let workload = Workload::spawn(env!("WORKLOAD_DUTY_CYCLE"), &args);
    let pid = workload.pid();
    let mut names = vec![BUSY.to_owned()];
    names.extend(rhythms.iter().map(|(name, _, _)| name.clone()));

    // Its threads started and named, and in their rhythm.
    let started = Instant::now();
    let tids: Vec<u32> = loop {
        let found: HashMap<String, u32> = thread_names(pid)
            .into_iter()
            .map(|(tid, name)| (name, tid))
            .filter(|(name, _)| names.contains(name))
            .collect();
        if found.len() == names.len() {
            break names.iter().map(|name| found[name]).collect();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the workload's threads {names:?} should be named within 10 s, found {found:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_secs(2));

    // The request waits for a drain at either end of its window, so the
    // request's own time is longer than the window by a fraction of a
    // second at each end, and a rate over it is the window's only on a
    // machine where nothing else changes the threads' share. schedstat is
    // read all along instead, and taken at the window's edges as the
    // profile states them (time_nanos, duration_nanos: the drains').
    let path = format!("/debug/pprof/profile?seconds={WINDOW_SECONDS}&pid={pid}");
    let stop = AtomicBool::new(false);
    let (profiles, readings) = std::thread::scope(|scope| {
        let reader = scope.spawn(|| read_schedstat_until(pid, &tids, &stop));
        // A window may start at a drain that began up to 250 ms before its
        // request (a shared one): read from well before.
        std::thread::sleep(Duration::from_millis(500));
        let profiles: Vec<Profile> = (0..WINDOWS)
            .map(|index| {
                let file = artifacts_dir().join(format!("cpu_exact_{frequency}hz_{index:02}.pb.gz"));
                cpu_profile(&daemon.fetch_pprof(&path, &file).body)
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, Ordering::Relaxed);
        (profiles, reader.join().expect("the schedstat reader"))
    });

    let windows: Vec<Window> = profiles
        .iter()
        .enumerate()
        .map(|(index, profile)| {
            assert!(
                profile.time_nanos > 0 && profile.duration_nanos > 0,
                "window {index}: a profile of /debug/pprof/profile says its window: time_nanos \
                 {}, duration_nanos {}",
                profile.time_nanos,
                profile.duration_nanos
            );
            let (start, end) = (profile.time_nanos, profile.time_nanos + profile.duration_nanos);
            let seconds = profile.duration_nanos as f64 / 1e9;
            let in_profile = cpu_by_label(profile, "thread_name");
            let mut gap_ns = 0;
            let rates = names
                .iter()
                .enumerate()
                .map(|(thread, name)| {
                    let (at_start, gap_start) = schedstat_at(&readings, thread, start);
                    let (at_end, gap_end) = schedstat_at(&readings, thread, end);
                    gap_ns = gap_ns.max(gap_start).max(gap_end);
                    let profile_ns = in_profile.get(name).copied().unwrap_or(0);
                    (
                        name.clone(),
                        (
                            profile_ns as f64 / 1e9 / seconds,
                            (at_end - at_start) / 1e9 / seconds,
                        ),
                    )
                })
                .collect();
            Window {
                seconds,
                gap_ms: gap_ns as f64 / 1e6,
                rates,
            }
        })
        .collect();

    // Every figure before any verdict: a failing window is read beside the others.
    let error = |(profile, kernel): (f64, f64)| percent_off(profile, kernel);
    eprintln!(
        "{frequency} Hz, periods {} ms (-a) and {} ms (-b): CPU rate of each thread in each \
         {WINDOW_SECONDS} s scrape's window, profile (cpu/nanoseconds) / schedstat, and the \
         error (* past {BOUND_PERCENT}%); gap: the longest time between the schedstat readings \
         around an edge of the window",
        periods[0], periods[1]
    );
    let mut header = format!("{:>3} {:>7} {:>6}", "#", "window", "gap");
    for name in &names {
        header.push_str(&format!(" | {name:<22}"));
    }
    eprintln!("{header}");
    for (index, window) in windows.iter().enumerate() {
        let mut line = format!("{index:>3} {:>6.3}s {:>4.1}ms", window.seconds, window.gap_ms);
        for name in &names {
            let rates = window.rates[name];
            let error = error(rates);
            let mark = if error <= BOUND_PERCENT { ' ' } else { '*' };
            line.push_str(&format!(" | {:.4}/{:.4} {error:>5.1}%{mark}", rates.0, rates.1));
        }
        eprintln!("{line}");
    }

    // A thread the machine starved has no rhythm left to beat with: the
    // test would prove nothing about it.
    for (name, _, duty) in &rhythms {
        let least = windows
            .iter()
            .map(|window| window.rates[name].1)
            .fold(f64::INFINITY, f64::min);
        assert!(
            least >= f64::from(*duty) / 100.0 / 2.0,
            "{name} should run {duty}% of a CPU in every window, schedstat says {:.1}% in one: \
             the machine starved it; the test proves nothing like this",
            least * 100.0
        );
    }
    for (index, window) in windows.iter().enumerate() {
        assert!(
            window.rates[BUSY].1 > 0.0,
            "window {index}: {BUSY} never ran: the machine starved it"
        );
    }
    let failures: Vec<String> = windows
        .iter()
        .enumerate()
        .flat_map(|(index, window)| {
            names.iter().filter_map(move |name| {
                let (profile, kernel) = window.rates[name];
                let error = error((profile, kernel));
                (error > BOUND_PERCENT).then(|| {
                    format!(
                        "window {index}, {name}: profile {profile:.4} CPU, schedstat {kernel:.4} \
                         CPU ({error:.1}% off)"
                    )
                })
            })
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{frequency} Hz: every thread's CPU rate in every window should be within \
         {BOUND_PERCENT}% of schedstat's; {} of {} were not:\n{}",
        failures.len(),
        WINDOWS * names.len(),
        failures.join("\n")
    );
}

/// Periods equal to the sampling period (10.1 ms against 10.101 ms) and
/// near it (10 ms: a beat a second).
#[test]
fn rhythms_at_99_hz_match_schedstat_in_every_window() {
    rhythms_match_schedstat_in_every_window(99, ["10", "10.1"]);
}

/// 20.41 ms against 20.408 ms, and 20.3 ms.
#[test]
fn rhythms_at_49_hz_match_schedstat_in_every_window() {
    rhythms_match_schedstat_in_every_window(49, ["20.41", "20.3"]);
}

/// 1.001 ms against 1.001001 ms, and 1 ms.
#[test]
fn rhythms_at_999_hz_match_schedstat_in_every_window() {
    rhythms_match_schedstat_in_every_window(999, ["1.001", "1.0"]);
}

/// The exit-exec workload's window: long enough for its ~4 s of work
/// started 1.5 s in.
const EXIT_EXEC_SECONDS: u64 = 10;

/// The next line the workload printed, with the moment it was read (and the
/// Unix ms of it); panics unless it starts with `prefix`.
fn next_line(lines: &mpsc::Receiver<(Instant, u64, String)>, prefix: &str) -> (Instant, u64, String) {
    let line = lines
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|err| panic!("the workload should print {prefix:?} within 60 s: {err}"));
    assert!(
        line.2.starts_with(prefix),
        "the workload should print {prefix:?} next, printed {:?}",
        line.2
    );
    line
}

/// A thread that exits inside a window, and a process that execs inside
/// it: all their CPU time is in the window, the exited thread's too, though
/// no sample may ever land on it after its last one.
#[test]
fn a_thread_that_exits_and_a_process_that_execs_keep_their_cpu_in_the_window() {
    let _serial = serial();
    let daemon = Daemon::start(&["--frequency", "99"]);
    let mut child = Command::new(env!("WORKLOAD_DUTY_CYCLE"))
        .arg("exit-exec")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the duty_cycle workload");
    let mut go_ahead = child.stdin.take().expect("its stdin is piped");
    let stdout = child.stdout.take().expect("its stdout is piped");
    // Killed on drop.
    let workload = Workload {
        child,
        name: "duty_cycle".to_owned(),
    };
    let pid = workload.pid();
    let (sender, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send((Instant::now(), unix_ms(), line)).is_err() {
                break;
            }
        }
    });
    // It burned 300 ms before "ready": the sampler has seen it, so its
    // threads are followed whatever their rhythm (a process never sampled
    // is not; see README). Started, and blocked on its stdin until the window has begun: all
    // the CPU time it runs from here on is in the window, and its main
    // thread's (the same tid before and after exec) is schedstat's
    // difference from now to the end.
    next_line(&lines, "ready");
    let main_before = schedstat_ns(pid, pid);

    let file = artifacts_dir().join("cpu_exact_exit_exec.pb.gz");
    let path = format!("/debug/pprof/profile?seconds={EXIT_EXEC_SECONDS}&pid={pid}");
    let sent = Instant::now();
    let (response, go_ms, exited, done) = std::thread::scope(|scope| {
        let fetch = scope.spawn(|| daemon.fetch_pprof(&path, &file));
        // The window starts at the drain the request arrives to, well
        // within this.
        std::thread::sleep(Duration::from_millis(1500));
        let go_ms = unix_ms();
        writeln!(go_ahead, "go").expect("the workload's go-ahead");
        let exited = next_line(&lines, "exited");
        let done = next_line(&lines, "done");
        let response = fetch.join().expect("the window's request");
        (response, go_ms, exited, done)
    });
    let main_after = schedstat_ns(pid, pid);
    let profile = cpu_profile(&response.body);

    // Its work inside the window: the window ends at a drain at least
    // EXIT_EXEC_SECONDS after the request arrived, and the profile says
    // where it began.
    assert!(
        done.0 < sent + Duration::from_secs(EXIT_EXEC_SECONDS),
        "the workload should be done {EXIT_EXEC_SECONDS} s after the request, {:.3} s after it \
         was: the machine is too slow for the window to hold its work",
        done.0.duration_since(sent).as_secs_f64()
    );
    let (start_ms, end_ms) = (
        profile.time_nanos / 1_000_000,
        (profile.time_nanos + profile.duration_nanos) / 1_000_000,
    );
    assert!(
        start_ms <= go_ms && done.1 <= end_ms,
        "the window ({start_ms} to {end_ms} ms) should hold the workload's work ({go_ms} to {} ms)",
        done.1
    );

    let fields: Vec<u64> = exited
        .2
        .split_whitespace()
        .skip(1)
        .map(|field| field.parse().expect("exited TID CPU_NS"))
        .collect();
    let [exited_tid, exited_ns] = fields[..] else {
        panic!("exited TID CPU_NS, printed {:?}", exited.2);
    };
    let by_tid = cpu_by_label(&profile, "thread_id");
    let main_ns = main_after - main_before;
    let checks = [
        (
            "the exited thread (its own CLOCK_THREAD_CPUTIME_ID before it returned)",
            exited_tid,
            exited_ns,
        ),
        (
            "the main thread, across its exec (schedstat over the window)",
            u64::from(pid),
            main_ns,
        ),
    ];
    let mut failures = Vec::new();
    for (what, tid, expected) in checks {
        let got = by_tid.get(&tid.to_string()).copied().unwrap_or(0);
        let error = percent_off(got as f64, expected as f64);
        eprintln!("{what}, tid {tid}: {got} ns in the profile vs {expected} ns ({error:.2}% off)");
        if error > BOUND_PERCENT {
            failures.push(format!(
                "{what}, tid {tid}: {expected} ns ±{BOUND_PERCENT}% expected, {got} ns in the \
                 profile ({error:.2}% off)"
            ));
        }
    }
    let others: HashMap<&String, &u64> = by_tid
        .iter()
        .filter(|(tid, _)| ![exited_tid.to_string(), pid.to_string()].contains(tid))
        .collect();
    eprintln!("other threads of pid {pid} in the profile: {others:?}");
    assert!(
        failures.is_empty(),
        "a thread that exits and a process that execs inside a window should have all their \
         CPU time in it:\n{}",
        failures.join("\n")
    );
}
