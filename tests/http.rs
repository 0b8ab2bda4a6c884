//! The HTTP front door against a running daemon, read back with `go tool pprof`.

use std::{collections::HashSet, time::Duration};

use profilerd_tests::{
    Workload, artifacts_dir,
    cpu::Expected,
    daemon::{Daemon, go_pprof, metric, parse_raw},
    pprof, serial, thread_names,
};

fn profile_path(name: &str) -> String {
    artifacts_dir().join(name).display().to_string()
}

#[test]
fn go_tool_pprof_reads_what_the_daemon_serves() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    // Outlives the test however slow the machine; killed on drop.
    let split = Workload::spawn(env!("WORKLOAD_SPLIT"), &["300"]);
    let born = std::time::Instant::now();
    // 3 s of its CPU time, however long a busy machine takes to give it.
    split.run_for(Duration::from_secs(3));
    // Stopped, its CPU time is all it ever ran, and the window holds all of it.
    split.pause();
    let cpu = split.cpu_time();
    let seconds = (born.elapsed().as_secs() + 2).min(300);
    let file = profile_path("split.pb.gz");
    daemon.fetch_pprof(
        &format!("/pprof?pid={}&seconds={seconds}", split.pid()),
        file.as_ref(),
    );
    // Go's client below profiles it running.
    split.resume();

    let top = go_pprof(&["-top", "-nodecount=10", &file]);
    assert!(
        top.contains("hot_a") && top.contains("hot_b"),
        "go tool pprof -top should list hot_a and hot_b:\n{top}"
    );
    let raw = parse_raw(&go_pprof(&["-raw", &file]));
    let total: i64 = raw.iter().map(|s| s.values[0]).sum();
    let hot_a: i64 = raw
        .iter()
        .filter(|s| s.functions.iter().any(|f| f == "hot_a"))
        .map(|s| s.values[0])
        .sum();
    // ~300 (3 s of CPU at 99 Hz); 0.67 as the 200 of ~300 asked before.
    Expected::new(cpu, 99).check("split in /pprof", total as u64, 0.67, 100);
    let share = hot_a as f64 * 100.0 / total as f64;
    assert!(
        (65.0..=85.0).contains(&share),
        "hot_a should be ~75% of samples in -raw, got {share:.1}%"
    );
    for sample in &raw {
        for key in ["pid", "comm", "thread_id", "thread_name"] {
            assert!(
                !sample.label(key).is_empty(),
                "every sample needs label {key}: {sample:?}"
            );
        }
        assert_eq!(
            sample.label("pid"),
            split.pid().to_string(),
            "only the asked pid: {sample:?}"
        );
    }

    // Go's own client, as `go tool pprof -seconds` uses it against Go programs.
    let url = daemon.url(&format!("/debug/pprof/profile?pid={}", split.pid()));
    let top = go_pprof(&["-seconds", "3", "-top", &url]);
    assert!(
        top.contains("hot_a"),
        "go tool pprof -seconds 3 {url} should show hot_a:\n{top}"
    );
}

/// Drains the scrapes were answered from, their own and shared.
fn scrape_drains(daemon: &Daemon) -> u64 {
    let text = daemon.get("/metrics").text();
    ["own", "shared"]
        .iter()
        .map(|drain| {
            metric(
                &text,
                &format!("profilerd_scrape_drains_total{{drain=\"{drain}\"}}"),
            )
        })
        .sum()
}

#[test]
fn start_and_end_ask_again_for_a_seconds_window() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    // Outlives the test however slow the machine; killed on drop.
    let split = Workload::spawn(env!("WORKLOAD_SPLIT"), &["300"]);
    split.run_for(Duration::from_secs(2));
    let pid = split.pid();
    let total = |file: &str| -> i64 {
        parse_raw(&go_pprof(&["-raw", file]))
            .iter()
            .map(|s| s.values[0])
            .sum()
    };

    let last = profile_path("window_seconds.pb.gz");
    let response = daemon.fetch_pprof(&format!("/pprof?pid={pid}&seconds=5"), last.as_ref());
    let (time_nanos, duration_nanos) = pprof::window_nanos(&response.body);
    assert!(
        time_nanos > 0
            && duration_nanos > 0
            && time_nanos % 1_000_000 == 0
            && duration_nanos % 1_000_000 == 0,
        "a window of whole milliseconds: time_nanos {time_nanos}, duration_nanos {duration_nanos}"
    );
    let (start, end) = (time_nanos / 1_000_000, (time_nanos + duration_nanos) / 1_000_000);
    let samples = total(&last);
    assert!(
        samples > 0,
        "pid {pid} ran 2 s of CPU: it has samples in the last 5 s"
    );

    // Later drains add samples after the window, not to it; and nothing drains for it.
    split.run_for(Duration::from_secs(1));
    let drains = scrape_drains(&daemon);
    let again = profile_path("window_start_end.pb.gz");
    let path = format!("/pprof?pid={pid}&start={start}&end={end}");
    let response = daemon.fetch_pprof(&path, again.as_ref());
    assert_eq!(
        pprof::window_nanos(&response.body),
        (time_nanos, duration_nanos),
        "GET {path}: the same window as seconds=5 gave"
    );
    assert_eq!(total(&again), samples, "GET {path}: the samples seconds=5 gave");
    assert_eq!(
        scrape_drains(&daemon),
        drains,
        "GET {path}: answered without a drain"
    );

    // The views take it too; /threads counts the same CPU samples.
    let threads: serde_json::Value = serde_json::from_slice(
        &daemon
            .get(&format!("/threads?pid={pid}&start={start}&end={end}"))
            .body,
    )
    .expect("/threads answers JSON");
    assert_eq!(
        (&threads["window"]["start_ms"], &threads["window"]["end_ms"]),
        (&start.into(), &end.into()),
        "/threads reports the window: {threads}"
    );
    assert_eq!(
        threads["processes"][0]["samples"].as_i64(),
        Some(samples),
        "/threads counts the samples /pprof did: {threads}"
    );
    // With seconds too, or with only one end: one line saying why.
    for bad in [
        format!("/pprof?start={start}&end={end}&seconds=5"),
        format!("/top?start={start}"),
    ] {
        let response = daemon.get(&bad);
        assert_eq!(response.status, 400, "GET {bad}: {}", response.text());
        assert!(
            response.text().contains("start"),
            "GET {bad}: {}",
            response.text()
        );
    }
}

#[test]
fn pid_filters_isolate_processes() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    // Outlive the test however slow the machine; killed on drop.
    let a = Workload::spawn(env!("WORKLOAD_SPLIT"), &["300"]);
    let b = Workload::spawn(env!("WORKLOAD_ZERO_READER"), &["300"]);
    // Each has run a while, however long a busy machine takes to let it.
    a.run_for(Duration::from_secs(1));
    b.run_for(Duration::from_secs(1));
    let only_a = profile_path("only_a.pb.gz");
    daemon.fetch_pprof(&format!("/pprof?pid={}&seconds=60", a.pid()), only_a.as_ref());
    let raw = parse_raw(&go_pprof(&["-raw", &only_a]));
    assert!(!raw.is_empty(), "pid {} has samples", a.pid());
    let pids: HashSet<&str> = raw.iter().map(|s| s.label("pid")).collect();
    assert_eq!(
        pids,
        HashSet::from([a.pid().to_string().as_str()]),
        "only A's pid in its profile"
    );
    assert!(
        raw.iter().all(|s| !s.functions.iter().any(|f| f == "read_zeros")),
        "B's functions must not appear in A's profile"
    );
    // pprof names a profile after its first mapping: one process's profile
    // is named after its executable, not the kernel.
    let executable = std::path::Path::new(env!("WORKLOAD_SPLIT"))
        .file_name()
        .and_then(|name| name.to_str())
        .expect("the workload's file name");
    let top = go_pprof(&["-top", &only_a]);
    assert!(
        top.lines()
            .any(|line| line.trim() == format!("File: {executable}")),
        "expected go tool pprof to name A's profile after {executable}:\n{}",
        top.lines().take(6).collect::<Vec<_>>().join("\n")
    );

    let both = profile_path("a_and_b.pb.gz");
    daemon.fetch_pprof(
        &format!("/pprof?pid={},{}&seconds=60", a.pid(), b.pid()),
        both.as_ref(),
    );
    let raw = parse_raw(&go_pprof(&["-raw", &both]));
    let pids: HashSet<String> = raw.iter().map(|s| s.label("pid").to_owned()).collect();
    assert_eq!(
        pids,
        HashSet::from([a.pid().to_string(), b.pid().to_string()]),
        "pid=A,B holds both, nothing else"
    );
    let repeated = profile_path("a_and_b_repeated.pb.gz");
    daemon.fetch_pprof(
        &format!("/pprof?pid={}&pid={}&seconds=60", a.pid(), b.pid()),
        repeated.as_ref(),
    );
    let pids: HashSet<String> = parse_raw(&go_pprof(&["-raw", &repeated]))
        .iter()
        .map(|s| s.label("pid").to_owned())
        .collect();
    assert_eq!(pids.len(), 2, "a repeated pid parameter is an OR too: {pids:?}");
}

#[test]
fn samples_carry_the_right_thread_ids_and_names() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    let threads = Workload::spawn(env!("WORKLOAD_THREADS"), &["10"]);
    std::thread::sleep(Duration::from_secs(3));
    let names = thread_names(threads.pid());
    let file = profile_path("threads.pb.gz");
    daemon.fetch_pprof(&format!("/pprof?pid={}&seconds=2", threads.pid()), file.as_ref());
    let raw = parse_raw(&go_pprof(&["-raw", &file]));
    let mut seen = HashSet::new();
    for sample in &raw {
        let tid: u32 = sample.label("thread_id").parse().expect("numeric thread_id");
        let expected = names
            .get(&tid)
            .unwrap_or_else(|| panic!("thread_id {tid} is not a thread of {}: {names:?}", threads.pid()));
        assert_eq!(
            sample.label("thread_name"),
            expected,
            "thread {tid} is named {expected} in /proc"
        );
        assert_eq!(
            sample.label("comm"),
            "threads",
            "the process name, not the thread's"
        );
        if sample.functions.iter().any(|f| f == "spin_worker") {
            seen.insert(sample.label("thread_name").to_owned());
        }
    }
    assert_eq!(
        seen,
        HashSet::from(["worker-a".to_owned(), "worker-b".to_owned()]),
        "both named workers should be sampled in spin_worker"
    );
}

#[test]
fn bad_input_gets_its_status_and_a_one_line_message() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .expect("pid_max")
        .trim()
        .parse()
        .expect("numeric pid_max");
    let never_ran = pid_max - 1;
    let long = format!("/pprof?comm={}", "x".repeat(10 * 1024));
    let cases: Vec<(String, u16, &str)> = vec![
        ("/pprof?pid=abc".into(), 400, "pid"),
        ("/pprof?pid=-1".into(), 400, "pid"),
        (format!("/pprof?pid={}", pid_max + 1), 400, "pid"),
        (format!("/pprof?pid={never_ran}"), 404, "pid"),
        ("/pprof?seconds=0".into(), 400, "seconds"),
        ("/pprof?seconds=-5".into(), 400, "seconds"),
        ("/pprof?seconds=abc".into(), 400, "seconds"),
        ("/pprof?seconds=1e9".into(), 400, "seconds"),
        ("/pprof?color=blue".into(), 400, "color"),
        (long, 400, ""),
        ("/debug/pprof/heap".into(), 404, ""),
        ("/debug/pprof/goroutine".into(), 404, ""),
        ("/debug/pprof/symbol".into(), 404, ""),
    ];
    for (path, status, names) in cases {
        let response = daemon.get(&path);
        let shown = &path[..path.len().min(60)];
        let accepted = if status == 400 && path.len() > 8192 {
            [400, 414].contains(&response.status)
        } else {
            response.status == status
        };
        assert!(
            accepted,
            "GET {shown}: expected {status}, got {} {}",
            response.status,
            response.text()
        );
        assert_eq!(
            response.header("x-go-pprof"),
            "1",
            "GET {shown}: errors carry X-Go-Pprof: 1"
        );
        assert!(
            response.header("content-type").starts_with("text/plain"),
            "GET {shown}: errors are text/plain"
        );
        let text = response.text();
        assert_eq!(
            text.trim_end().lines().count(),
            1,
            "GET {shown}: one line, got {text:?}"
        );
        assert!(
            text.contains(names),
            "GET {shown}: the message should name {names:?}: {text:?}"
        );
    }
    // Still serving after all that.
    assert_eq!(daemon.get("/pprof?seconds=1").status, 200);
}

#[test]
fn concurrent_scrapes_all_succeed_and_lose_no_sample() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    // Outlives the test however slow the machine; killed on drop.
    let split = Workload::spawn(env!("WORKLOAD_SPLIT"), &["600"]);
    let born = std::time::Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let started = std::time::Instant::now();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..20)
            .map(|_| scope.spawn(|| daemon.get("/pprof?seconds=60")))
            .collect();
        for handle in handles {
            let response = handle.join().expect("a scrape thread");
            assert_eq!(response.status, 200, "{}", response.text());
            assert!(response.body.len() > 20, "a real profile, not an empty body");
        }
    });
    eprintln!(
        "20 concurrent /pprof?seconds=60 answered in {:?}",
        started.elapsed()
    );
    split.run_for(Duration::from_secs(3));
    // Stopped, its CPU time is all it ever ran: the window holds its whole
    // life, the scrapes included (the retention, 300 s, bounds it).
    split.pause();
    let cpu = split.cpu_time();
    let seconds = (born.elapsed().as_secs() + 2).min(300);
    // A lost sample lowers the count but not the measured CPU time (the next
    // sample of the thread carries it): samples × period must match cpu_ns.
    let file = profile_path("after_scrapes.pb.gz");
    daemon.fetch_pprof(
        &format!("/pprof?pid={}&seconds={seconds}", split.pid()),
        file.as_ref(),
    );
    let raw = parse_raw(&go_pprof(&["-raw", &file]));
    let samples: i64 = raw.iter().map(|s| s.values[0]).sum();
    let cpu_ns: i64 = raw.iter().map(|s| s.values[1]).sum();
    let period_ns = 1_000_000_000 / 99;
    let ratio = (samples * period_ns) as f64 / cpu_ns as f64;
    // 0.8: not one sample lost to the scrapes.
    Expected::new(cpu, 99).check("split through the scrapes", samples as u64, 0.8, 150);
    assert!(
        (0.85..=1.15).contains(&ratio),
        "samples × period should match the measured CPU time: {samples} samples, {cpu_ns} ns on CPU (ratio {ratio:.2})"
    );
}
