//! The views a person looks at, loaded in headless Chromium, and the text
//! views cross-checked against pprof.

use std::{collections::HashMap, path::Path, process::Command, time::Duration};

use profilerd_tests::{
    Workload, artifacts_dir,
    daemon::{Daemon, go_pprof, parse_raw},
    serial,
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

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("profilerd-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[test]
fn chromium_shows_the_index_and_the_flame_graph() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    let split = Workload::spawn(env!("WORKLOAD_SPLIT"), &["30"]);
    std::thread::sleep(Duration::from_secs(3));

    let index = daemon.url("/?seconds=5");
    let dom = chromium(&index, None);
    assert!(
        dom.contains(&format!("<td>{}</td>", split.pid())),
        "the index should list pid {}:\n{dom}",
        split.pid()
    );
    assert!(dom.contains("split"), "and its name:\n{dom}");
    let shot = artifacts_dir().join("index.png");
    chromium(&index, Some(&shot));
    assert!(
        std::fs::metadata(&shot).is_ok_and(|meta| meta.len() > 1000),
        "a screenshot at {}",
        shot.display()
    );

    let svg_url = daemon.url(&format!("/flamegraph.svg?pid={}&seconds=5", split.pid()));
    let response = daemon.get(&format!("/flamegraph.svg?pid={}&seconds=5", split.pid()));
    assert_eq!(response.status, 200, "{}", response.text());
    assert!(response.header("content-type").starts_with("image/svg+xml"));
    let dom = chromium(&svg_url, None);
    assert!(
        dom.contains("hot_a"),
        "the flame graph should show hot_a:\n{}",
        &dom[..dom.len().min(2000)]
    );
    assert!(
        dom.contains(&format!("pid {}", split.pid())),
        "its title names the process"
    );
    let shot = artifacts_dir().join("flamegraph.png");
    chromium(&svg_url, Some(&shot));
    assert!(
        std::fs::metadata(&shot).is_ok_and(|meta| meta.len() > 1000),
        "a screenshot at {}",
        shot.display()
    );
}

#[test]
fn top_folded_and_pprof_agree_exactly() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    let split = Workload::spawn(env!("WORKLOAD_SPLIT"), &["3"]);
    let pid = split.pid();
    split.wait();
    // Gone: later drains add nothing for it, so every view sees the same samples.
    std::thread::sleep(Duration::from_secs(2));
    let query = format!("pid={pid}&seconds=30");

    let top = daemon.get(&format!("/top?{query}&format=json&limit=10000"));
    assert_eq!(top.status, 200, "{}", top.text());
    let top: serde_json::Value = serde_json::from_slice(&top.body).expect("/top JSON");
    let top_self: HashMap<String, u64> = top["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .map(|f| {
            (
                f["name"].as_str().expect("name").to_owned(),
                f["self"].as_u64().expect("self"),
            )
        })
        .filter(|(_, count)| *count > 0)
        .collect();

    let folded = daemon.get(&format!("/folded?{query}"));
    assert_eq!(folded.status, 200, "{}", folded.text());
    let lines = profilerd_tests::parse_folded(&folded.text());
    let mut folded_leaf: HashMap<String, u64> = HashMap::new();
    for line in &lines {
        let leaf = line.frames.last().cloned().unwrap_or_default();
        let leaf = leaf
            .strip_suffix("_[k]")
            .map_or(leaf.clone(), |name| format!("{name} [k]"));
        *folded_leaf.entry(leaf).or_default() += line.count;
    }

    let file = artifacts_dir().join("agree.pb.gz").display().to_string();
    daemon.fetch_pprof(&format!("/pprof?{query}"), file.as_ref());
    let raw = parse_raw(&go_pprof(&["-raw", &file]));
    let pprof_total: u64 = raw.iter().map(|s| s.values[0] as u64).sum();
    let pprof_hot_a: u64 = raw
        .iter()
        .filter(|s| s.functions.first().is_some_and(|f| f == "hot_a"))
        .map(|s| s.values[0] as u64)
        .sum();

    let top_total: u64 = top_self.values().sum();
    let folded_total: u64 = lines.iter().map(|l| l.count).sum();
    assert!(
        folded_total > 100,
        "the workload's ~300 samples expected, got {folded_total}"
    );
    assert_eq!(top_total, folded_total, "/top self counts add up to /folded's");
    assert_eq!(
        folded_total, pprof_total,
        "/folded and /pprof hold the same samples"
    );
    assert_eq!(
        top_self, folded_leaf,
        "/top's self counts are /folded's leaf counts, function by function"
    );
    assert_eq!(
        top_self.get("hot_a").copied(),
        Some(pprof_hot_a),
        "hot_a's self count matches pprof's leaf count"
    );
}
