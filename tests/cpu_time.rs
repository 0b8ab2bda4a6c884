//! Per-thread CPU time measured in BPF against the kernel's own accounting
//! (/proc/PID/task/TID/schedstat, first field: ns on CPU).

use std::{collections::HashMap, time::Duration};

use profilerd_tests::{
    Workload, artifacts_dir,
    daemon::{Daemon, go_pprof, parse_raw},
    serial, thread_names,
};

const THREADS: [&str; 3] = ["busy-100", "busy-50", "busy-10"];

/// CPU ns of each named thread of `pid`, from schedstat.
fn schedstat(pid: u32) -> HashMap<String, u64> {
    thread_names(pid)
        .into_iter()
        .filter(|(_, name)| THREADS.contains(&name.as_str()))
        .map(|(tid, name)| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))
                .unwrap_or_else(|err| panic!("schedstat of {tid}: {err}"));
            let ns = stat
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .expect("schedstat's first field");
            (name, ns)
        })
        .collect()
}

/// cpu/nanoseconds per thread name in a pprof file, read by go tool pprof.
fn pprof_cpu_by_thread(file: &str) -> HashMap<String, u64> {
    let mut sums = HashMap::new();
    for sample in parse_raw(&go_pprof(&["-raw", file])) {
        *sums.entry(sample.label("thread_name").to_owned()).or_default() += sample.values[1] as u64;
    }
    sums
}

fn assert_within_3_percent(what: &str, measured: &HashMap<String, u64>, kernel: &HashMap<String, u64>) {
    for name in THREADS {
        let expected = *kernel
            .get(name)
            .unwrap_or_else(|| panic!("thread {name} missing from /proc: {kernel:?}"));
        let got = measured.get(name).copied().unwrap_or(0);
        let error = (got as f64 - expected as f64).abs() * 100.0 / expected as f64;
        eprintln!("{what}: {name}: {got} ns vs kernel {expected} ns ({error:.2}% off)");
        assert!(
            error <= 3.0,
            "{what}: thread {name} should have {expected} ns ±3% (schedstat), got {got} ns ({error:.2}% off)"
        );
    }
}

#[test]
fn a_window_of_cpu_time_matches_schedstat() {
    let _serial = serial();
    let daemon = Daemon::start(&["--frequency", "999"]);
    // Outlives the window however slow the machine; killed on drop.
    let workload = Workload::spawn(env!("WORKLOAD_CPU_SHARES"), &["300"]);
    // Its threads started and named.
    std::thread::sleep(Duration::from_secs(2));
    // The window runs from the drain as the request arrives to the drain 10 s
    // later. The workload runs only well inside it, stopped at either end, so
    // the CPU time schedstat counts is all in the window, however long a busy
    // machine takes to answer the request or to read /proc.
    workload.pause();
    let before = schedstat(workload.pid());
    let file = artifacts_dir().join("cpu_window.pb.gz").display().to_string();
    std::thread::scope(|scope| {
        let fetch = scope.spawn(|| {
            daemon.fetch_pprof(
                &format!("/debug/pprof/profile?seconds=10&pid={}", workload.pid()),
                file.as_ref(),
            );
        });
        std::thread::sleep(Duration::from_secs(1));
        workload.resume();
        std::thread::sleep(Duration::from_secs(7));
        workload.pause();
        fetch.join().expect("the window's request");
    });
    let after = schedstat(workload.pid());
    let kernel: HashMap<String, u64> = after
        .iter()
        .map(|(name, ns)| (name.clone(), ns - before[name]))
        .collect();
    assert_within_3_percent(
        "10 s window, /debug/pprof/profile",
        &pprof_cpu_by_thread(&file),
        &kernel,
    );
}

#[test]
fn a_thread_life_of_cpu_time_matches_schedstat_in_pprof_and_threads() {
    let _serial = serial();
    let daemon = Daemon::start(&["--frequency", "999"]);
    // Threads born under the sampler: their first samples carry all their CPU time.
    let workload = Workload::spawn(env!("WORKLOAD_CPU_SHARES"), &["5", "6"]);
    std::thread::sleep(Duration::from_millis(6500));
    let kernel = schedstat(workload.pid());

    let file = artifacts_dir().join("cpu_life.pb.gz").display().to_string();
    daemon.fetch_pprof(
        &format!("/pprof?pid={}&seconds=30", workload.pid()),
        file.as_ref(),
    );
    assert_within_3_percent("whole life, /pprof", &pprof_cpu_by_thread(&file), &kernel);

    let response = daemon.get(&format!("/threads?pid={}&seconds=30", workload.pid()));
    assert_eq!(response.status, 200, "{}", response.text());
    let json: serde_json::Value = serde_json::from_slice(&response.body).expect("/threads is JSON");
    let mut from_threads = HashMap::new();
    let processes = json["processes"].as_array().expect("a processes array");
    assert_eq!(processes.len(), 1, "one process asked for: {json}");
    let process = &processes[0];
    assert_eq!(process["pid"].as_u64(), Some(u64::from(workload.pid())), "{json}");
    let mut sum = 0;
    for thread in process["threads"].as_array().expect("a threads array") {
        let cpu_ns = thread["cpu_ns"].as_u64().expect("cpu_ns");
        // A thread that ran a millisecond or two (the main thread, starting
        // the others) may have had no sample at 999 Hz: its CPU time is
        // still there, read at a drain (issue 29). One that ran 20 ms has
        // one but once in e^20.
        assert!(
            thread["samples"].as_u64().expect("samples") > 0 || cpu_ns < 20_000_000,
            "{thread}"
        );
        assert!(thread["tid"].as_u64().is_some(), "{thread}");
        sum += cpu_ns;
        from_threads.insert(
            thread["thread_name"].as_str().expect("thread_name").to_owned(),
            cpu_ns,
        );
    }
    assert_eq!(
        process["cpu_ns"].as_u64(),
        Some(sum),
        "a process's cpu_ns is the sum of its threads'"
    );
    assert_within_3_percent("whole life, /threads", &from_threads, &kernel);
}
