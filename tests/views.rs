//! The views a person looks at, loaded in headless Chromium; the text views
//! cross-checked against pprof; their errors the same as /pprof's.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use profilerd_tests::{
    FoldedLine, Workload, artifacts_dir,
    cpu::Expected,
    daemon::{Daemon, RawSample, go_pprof, parse_raw},
    parse_folded, record_while, serial,
};

/// Runs headless Chromium on `url`: `--dump-dom` output, or a screenshot.
fn chromium(url: &str, screenshot: Option<&Path>) -> String {
    let profile_dir = tempdir("chromium-profile");
    let mut command = Command::new("chromium");
    command.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,900",
    ]);
    command.arg(format!("--user-data-dir={}", profile_dir.display()));
    match screenshot {
        Some(file) => command.arg(format!("--screenshot={}", file.display())),
        None => command.arg("--dump-dom"),
    };
    let output = command
        .arg(url)
        .output()
        .expect("running chromium (installed by scripts/setup.sh)");
    let _ = std::fs::remove_dir_all(&profile_dir);
    assert!(
        output.status.success(),
        "chromium {url} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("profilerd-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn screenshot(url: &str, name: &str) {
    let shot = artifacts_dir().join(name);
    let _ = std::fs::remove_file(&shot);
    chromium(url, Some(&shot));
    assert!(
        std::fs::metadata(&shot).is_ok_and(|meta| meta.len() > 1000),
        "a screenshot at {}",
        shot.display()
    );
}

#[test]
fn chromium_shows_the_index_and_the_flame_graph() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    // Outlives the test however slow the machine (chromium included); killed on drop.
    let split = Workload::spawn(env!("WORKLOAD_SPLIT"), &["300"]);
    let pid = split.pid();
    split.run_for(Duration::from_secs(3));

    let index = daemon.url("/?seconds=5");
    let dom = chromium(&index, None);
    assert!(
        dom.contains(&format!("<td>{pid}</td><td>split</td>")),
        "the index should list pid {pid} named split:\n{dom}"
    );
    assert!(
        dom.contains(&format!("/flamegraph.svg?pid={pid}&amp;seconds=5")),
        "and link to its flame graph:\n{dom}"
    );
    screenshot(&index, "index.png");

    let path = format!("/flamegraph.svg?pid={pid}&seconds=5");
    let response = daemon.get(&path);
    assert_eq!(response.status, 200, "{}", response.text());
    assert!(response.header("content-type").starts_with("image/svg+xml"));
    let dom = chromium(&daemon.url(&path), None);
    assert!(
        dom.contains("<title>hot_a ("),
        "the flame graph should show hot_a:\n{}",
        &dom[..dom.len().min(2000)]
    );
    assert!(
        dom.contains(&format!("CPU: pid {pid} — ")),
        "its title names the process"
    );
    screenshot(&daemon.url(&path), "flamegraph.png");

    let icicle = daemon.get(&format!("{path}&icicle=true"));
    assert_eq!(icicle.status, 200, "{}", icicle.text());
    assert!(
        icicle.text().contains("var inverted = true"),
        "icicle=true inverts it"
    );
}

/// Function -> samples, from each view.
type Counts = HashMap<String, u64>;

/// `/top?format=json` as (self, total) per function.
fn top_counts(daemon: &Daemon, query: &str) -> (Counts, Counts) {
    let top = daemon.get(&format!("/top?{query}&format=json&limit=100000"));
    assert_eq!(top.status, 200, "{}", top.text());
    assert!(top.header("content-type").starts_with("application/json"));
    let top: serde_json::Value = serde_json::from_slice(&top.body).expect("/top JSON");
    assert!(top["window"]["start_ms"].as_u64() < top["window"]["end_ms"].as_u64());
    let (mut own, mut total) = (Counts::new(), Counts::new());
    for function in top["functions"].as_array().expect("functions") {
        let name = function["name"].as_str().expect("name").to_owned();
        let count = |key: &str| function[key].as_u64().unwrap_or_else(|| panic!("{key}"));
        if count("self") > 0 {
            own.insert(name.clone(), count("self"));
        }
        total.insert(name, count("total"));
    }
    (own, total)
}

/// Folded lines as (leaf, anywhere) per function, named as /top names them.
fn folded_counts(lines: &[FoldedLine]) -> (Counts, Counts) {
    let name = |frame: &str| match frame.strip_suffix("_[k]") {
        Some(kernel) => format!("{kernel} [k]"),
        None => frame.strip_suffix("_[i]").unwrap_or(frame).to_owned(),
    };
    let (mut leaf, mut anywhere) = (Counts::new(), Counts::new());
    for line in lines {
        if let Some(frame) = line.frames.last() {
            *leaf.entry(name(frame)).or_default() += line.count;
        }
        let mut names: Vec<String> = line.frames.iter().map(|frame| name(frame)).collect();
        names.sort();
        names.dedup();
        for frame in names {
            *anywhere.entry(frame).or_default() += line.count;
        }
    }
    (leaf, anywhere)
}

/// pprof samples as (leaf, anywhere) per function. pprof marks no kernel
/// frames in names, so /top's ` [k]` is dropped before comparing.
fn pprof_counts(raw: &[RawSample]) -> (Counts, Counts) {
    let (mut leaf, mut anywhere) = (Counts::new(), Counts::new());
    for sample in raw {
        let count = u64::try_from(sample.values[0]).expect("a sample count");
        if let Some(function) = sample.functions.first() {
            *leaf.entry(function.clone()).or_default() += count;
        }
        let mut names = sample.functions.clone();
        names.sort();
        names.dedup();
        for function in names {
            *anywhere.entry(function).or_default() += count;
        }
    }
    (leaf, anywhere)
}

fn without_kernel_marks(counts: &Counts) -> Counts {
    let mut plain = Counts::new();
    for (name, count) in counts {
        *plain
            .entry(name.strip_suffix(" [k]").unwrap_or(name).to_owned())
            .or_default() += count;
    }
    plain
}

#[test]
fn top_folded_and_pprof_agree_exactly() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    let split = Workload::spawn(env!("WORKLOAD_SPLIT"), &["300"]);
    let born = std::time::Instant::now();
    let pid = split.pid();
    // Its whole life is sampled (the daemon was attached before it started):
    // 3 s of CPU time, however long a busy machine takes to give it.
    let cpu = split.run_to_end(Duration::from_secs(3));
    // Gone: later drains add nothing for it, so every view sees the same samples.
    std::thread::sleep(Duration::from_secs(2));
    // A window that holds its whole life, however long the machine took.
    let query = format!("pid={pid}&seconds={}", (born.elapsed().as_secs() + 2).min(300));

    let (top_self, top_total) = top_counts(&daemon, &query);

    let folded = daemon.get(&format!("/folded?{query}"));
    assert_eq!(folded.status, 200, "{}", folded.text());
    assert!(folded.header("content-type").starts_with("text/plain"));
    let lines = parse_folded(&folded.text());
    let (folded_leaf, folded_anywhere) = folded_counts(&lines);

    let file = artifacts_dir().join("agree.pb.gz");
    daemon.fetch_pprof(&format!("/pprof?{query}"), &file);
    let raw = parse_raw(&go_pprof(&["-raw", &file.display().to_string()]));
    let (pprof_leaf, pprof_anywhere) = pprof_counts(&raw);

    let folded_total: u64 = lines.iter().map(|line| line.count).sum();
    let pprof_total: u64 = raw.iter().map(|sample| sample.values[0] as u64).sum();
    // ~300 (3 s of CPU at 99 Hz); 0.8: all of them.
    Expected::new(cpu, 99).check("the workload in /folded", folded_total, 0.8, 100);
    assert_eq!(
        folded_total, pprof_total,
        "/folded and /pprof hold the same samples"
    );
    assert_eq!(
        top_self.values().sum::<u64>(),
        folded_total,
        "/top's self counts add up to all samples"
    );
    assert_eq!(
        top_self, folded_leaf,
        "/top self = /folded leaf, function by function"
    );
    assert_eq!(
        top_total, folded_anywhere,
        "/top total = /folded lines containing it, function by function"
    );
    assert_eq!(
        without_kernel_marks(&top_self),
        pprof_leaf,
        "/top self = pprof leaf"
    );
    assert_eq!(
        without_kernel_marks(&top_total),
        pprof_anywhere,
        "/top total = pprof samples containing it"
    );
    assert!(
        top_self.get("hot_a") > top_self.get("hot_b"),
        "hot_a is the hottest: {top_self:?}"
    );
}

#[test]
fn the_views_have_the_pprof_errors_and_their_own_content_types() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .expect("pid_max")
        .trim()
        .parse()
        .expect("numeric pid_max");
    let never_ran = pid_max - 1;
    let cases: Vec<(String, u16, &str)> = vec![
        (format!("/?pid={never_ran}"), 404, "pid"),
        (format!("/flamegraph.svg?pid={never_ran}"), 404, "pid"),
        (format!("/top?pid={never_ran}"), 404, "pid"),
        (format!("/folded?pid={never_ran}"), 404, "pid"),
        ("/?seconds=0".into(), 400, "seconds"),
        ("/folded?pid=abc".into(), 400, "pid"),
        ("/flamegraph.svg?icicle=maybe".into(), 400, "icicle"),
        ("/flamegraph.svg?format=json".into(), 400, "icicle"),
        ("/top?limit=0".into(), 400, "limit"),
        ("/top?limit=ten".into(), 400, "limit"),
        ("/top?format=xml".into(), 400, "format"),
        ("/top?format=json&format=text".into(), 400, "format"),
        ("/top?color=blue".into(), 400, "format, limit"),
        ("/folded?limit=5".into(), 400, "seconds"),
    ];
    for (path, status, names) in cases {
        let response = daemon.get(&path);
        let text = response.text();
        assert_eq!(response.status, status, "GET {path}: {text}");
        assert_eq!(response.header("x-go-pprof"), "1", "GET {path}: X-Go-Pprof: 1");
        assert!(
            response.header("content-type").starts_with("text/plain"),
            "GET {path}: errors are text/plain"
        );
        assert_eq!(
            text.trim_end().lines().count(),
            1,
            "GET {path}: one line: {text:?}"
        );
        assert!(
            text.contains(names),
            "GET {path}: should name {names:?}: {text:?}"
        );
    }
    for (path, content_type) in [
        ("/", "text/html"),
        ("/?seconds=2", "text/html"),
        ("/flamegraph.svg", "image/svg+xml"),
        ("/flamegraph.svg?icicle=true&seconds=2", "image/svg+xml"),
        ("/top", "text/plain"),
        ("/top?format=text&limit=5", "text/plain"),
        ("/top?format=json", "application/json"),
        ("/folded?seconds=2", "text/plain"),
    ] {
        let response = daemon.get(path);
        assert_eq!(response.status, 200, "GET {path}: {}", response.text());
        assert!(
            response.header("content-type").starts_with(content_type),
            "GET {path}: {content_type}, got {}",
            response.header("content-type")
        );
    }
    let table = daemon.get("/top?limit=3").text();
    assert!(table.starts_with('#'), "a header line: {table}");
    assert!(table.lines().count() <= 2 + 3, "limit=3 rows: {table}");
}

#[test]
fn record_writes_a_flame_graph() {
    let _serial = serial();
    // Outlives the recording however slow the machine; killed on drop.
    let split = Workload::spawn(env!("WORKLOAD_SPLIT"), &["300"]);
    let pid = split.pid().to_string();
    // Ended after 2 s of the workload's CPU time; 120 s only bounds it.
    let recording = record_while(&["--pid", &pid, "--seconds", "120", "--format", "svg"], |run| {
        split.run_for(Duration::from_secs(2));
        run.interrupt();
    });
    let svg = recording.output;
    assert!(svg.starts_with("<?xml"), "an SVG: {}", &svg[..svg.len().min(200)]);
    assert!(svg.contains("<title>hot_a ("), "with hot_a");
    assert!(svg.contains(&format!("CPU: pid {pid} — ")), "titled with the pid");
    assert!(
        recording.stderr.contains("(svg,"),
        "the summary names the format: {}",
        recording.stderr
    );
}
