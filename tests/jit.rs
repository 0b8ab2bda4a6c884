//! Issue 27, JIT-compiled code named: a Node.js program (Debian's nodejs,
//! started with `--perf-basic-prof`) and a Java one (OpenJDK 17, with
//! `-XX:+PreserveFramePointer`, its map written by `jcmd PID
//! Compiler.perfmap`) split their CPU between two functions in a proportion
//! they measure themselves (and V8's own profiler, `node --cpu-prof`, a
//! second oracle for Node); the daemon names both from the perf map the
//! runtime writes, splits them as the program measured, and walks Node's
//! stacks (JIT frames crossed by frame pointer) down to its native start.
//! Without a map, JIT code is `[jit]`. And the perf maps of hostile owners:
//! see `jit_hostile.rs`.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use profilerd_tests::{
    artifacts_dir,
    daemon::{Daemon, RawSample, go_pprof, parse_raw},
    serial,
};

/// Its own measure of where its time went.
#[derive(Debug, Clone, Copy)]
struct Spent {
    hot_a: f64,
    hot_b: f64,
}

/// A runtime running a split workload of tests/workloads/jit.
struct Runtime {
    child: Child,
    stats: PathBuf,
}

fn workload(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("workloads/jit")
        .join(name)
}

impl Runtime {
    /// `program ARGS... SECONDS STATS`.
    fn start(program: &str, args: &[&str], seconds: u32) -> Self {
        let stats =
            std::env::temp_dir().join(format!("profilerd-jit-{program}-{}.stats", std::process::id()));
        let _ = std::fs::remove_file(&stats);
        // Node writes V8 logs where it runs: a scratch directory.
        let child = Command::new(program)
            .args(args)
            .arg(seconds.to_string())
            .arg(&stats)
            .current_dir(std::env::temp_dir())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| panic!("starting {program}: {err}"));
        Self { child, stats }
    }

    /// Node on split.js; with `cpu_prof`, V8's own sampling profiler writes
    /// its profile there when node exits (`--cpu-prof`).
    fn node(perf_map: bool, cpu_prof: Option<&Path>, seconds: u32) -> Self {
        let script = workload("split.js");
        let mut args = vec!["--no-turbo-inlining"];
        if perf_map {
            args.push("--perf-basic-prof");
        }
        if let Some(dir) = cpu_prof {
            args.extend([
                "--cpu-prof",
                "--cpu-prof-dir",
                dir.to_str().expect("a UTF-8 path"),
            ]);
        }
        args.push(script.to_str().expect("a UTF-8 path"));
        Self::start("node", &args, seconds)
    }

    /// Waits for the program to end by itself.
    fn wait_exit(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        while self.child.try_wait().expect("polling the runtime").is_none() {
            assert!(
                Instant::now() < deadline,
                "the runtime should have ended within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn spent(&self) -> Spent {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // {"hotA": "NS", "hotB": "NS"} from node, "hotA NS hotB NS" from Java.
            if let Ok(text) = std::fs::read_to_string(&self.stats) {
                let words: Vec<&str> = text
                    .split(|c: char| !c.is_ascii_alphanumeric())
                    .filter(|word| !word.is_empty())
                    .collect();
                let ns = |key: &str| {
                    let at = words.iter().position(|word| *word == key)?;
                    words.get(at + 1)?.parse::<f64>().ok()
                };
                if let (Some(hot_a), Some(hot_b)) = (ns("hotA"), ns("hotB")) {
                    return Spent { hot_a, hot_b };
                }
            }
            assert!(Instant::now() < deadline, "no stats in {}", self.stats.display());
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stats);
        let _ = std::fs::remove_file(format!("/tmp/perf-{}.map", self.child.id()));
        let v8_log = format!("-{}-v8.log", self.child.id());
        for entry in std::fs::read_dir(std::env::temp_dir())
            .into_iter()
            .flatten()
            .flatten()
        {
            if entry.file_name().to_string_lossy().ends_with(&v8_log) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// The samples with a frame whose name holds `name`.
fn with_frame<'a>(samples: &'a [RawSample], name: &'a str) -> impl Iterator<Item = &'a RawSample> + 'a {
    samples
        .iter()
        .filter(move |sample| sample.functions.iter().any(|function| function.contains(name)))
}

fn count(samples: &[RawSample], name: &str) -> i64 {
    with_frame(samples, name).map(|sample| sample.values[0]).sum()
}

/// Profiles `runtime` for 8 s: its samples, hotA's and hotB's counts, and
/// hotA's share of the two as the program measured it.
fn profile(daemon: &Daemon, runtime: &Runtime, name: &str) -> (Vec<RawSample>, i64, i64, f64) {
    let before = runtime.spent();
    let file = artifacts_dir().join(format!("{name}.pb.gz"));
    daemon.fetch_pprof(
        &format!("/debug/pprof/profile?seconds=8&pid={}", runtime.pid()),
        &file,
    );
    let after = runtime.spent();
    let samples = parse_raw(&go_pprof(&["-raw", &file.display().to_string()]));
    let (a, b) = (count(&samples, "hotA"), count(&samples, "hotB"));
    let expected = (after.hot_a - before.hot_a) / (after.hot_a - before.hot_a + after.hot_b - before.hot_b);
    let mut leaves: HashMap<&str, i64> = HashMap::new();
    for sample in &samples {
        let leaf = sample.functions.first().map_or("", String::as_str);
        *leaves.entry(leaf).or_default() += sample.values[0];
    }
    let mut leaves: Vec<_> = leaves.into_iter().collect();
    leaves.sort_by_key(|(_, count)| -count);
    leaves.truncate(8);
    eprintln!(
        "{name} {}: hotA {a}, hotB {b} of {} samples: {:.1}% vs {:.1}% measured; leaves {leaves:?}",
        runtime.pid(),
        samples.iter().map(|sample| sample.values[0]).sum::<i64>(),
        a as f64 * 100.0 / (a + b).max(1) as f64,
        expected * 100.0
    );
    (samples, a, b, expected)
}

/// hotA's share of the samples under hotA or hotB in the one V8 CPU profile
/// (`.cpuprofile`: a tree of nodes with their own hit counts) in `dir`.
fn v8_share(dir: &Path) -> f64 {
    let file = std::fs::read_dir(dir)
        .unwrap_or_else(|err| panic!("node --cpu-prof wrote nothing in {}: {err}", dir.display()))
        .flatten()
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|ext| ext == "cpuprofile"))
        .expect("a .cpuprofile");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).expect("reading the .cpuprofile")).expect("its JSON");
    let nodes = json["nodes"].as_array().expect("nodes");
    let mut parent: HashMap<u64, u64> = HashMap::new();
    let mut name: HashMap<u64, &str> = HashMap::new();
    for node in nodes {
        let id = node["id"].as_u64().expect("an id");
        name.insert(id, node["callFrame"]["functionName"].as_str().unwrap_or(""));
        for child in node["children"].as_array().map(Vec::as_slice).unwrap_or_default() {
            parent.insert(child.as_u64().expect("a child id"), id);
        }
    }
    let (mut a, mut b) = (0, 0);
    for node in nodes {
        let hits = node["hitCount"].as_u64().unwrap_or(0);
        let mut at = node["id"].as_u64();
        while let Some(id) = at {
            match name.get(&id).copied() {
                Some("hotA") => a += hits,
                Some("hotB") => b += hits,
                _ => {
                    at = parent.get(&id).copied();
                    continue;
                }
            }
            break;
        }
    }
    assert!(a > 0 && b > 0, "V8's profile should hold hotA and hotB: {a}, {b}");
    a as f64 / (a + b) as f64
}

fn assert_split(name: &str, a: i64, b: i64, expected: f64) {
    let got = a as f64 / (a + b).max(1) as f64;
    assert!(
        a > 0 && b > 0 && (got - expected).abs() * 100.0 <= 5.0,
        "{name}: hotA's share of hotA + hotB: {:.1}% in the profile ({a} and {b} samples), {:.1}% as it measured",
        got * 100.0,
        expected * 100.0
    );
}

#[test]
fn node_functions_are_named_from_its_perf_map_and_split_as_it_measured() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    let cpu_prof = std::env::temp_dir().join(format!("profilerd-jit-cpuprof-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cpu_prof);
    let mut node = Runtime::node(true, Some(&cpu_prof), 17);
    // Compiled, optimized (and written to the perf map) in the first seconds.
    std::thread::sleep(Duration::from_secs(5));
    let (samples, a, b, expected) = profile(&daemon, &node, "node-jit");
    node.wait_exit(Duration::from_secs(20));
    let v8 = v8_share(&cpu_prof);
    let _ = std::fs::remove_dir_all(&cpu_prof);
    let ours = a as f64 / (a + b).max(1) as f64;
    eprintln!("node --cpu-prof: hotA {:.1}% of hotA + hotB", v8 * 100.0);
    assert!(
        (ours - v8).abs() * 100.0 <= 5.0,
        "hotA's share: {:.1}% here, {:.1}% by V8's own profiler (node --cpu-prof)",
        ours * 100.0,
        v8 * 100.0
    );
    let total: i64 = samples.iter().map(|sample| sample.values[0]).sum();
    assert!(
        (a + b) as f64 >= 0.8 * total as f64,
        "hotA and hotB should be named in >= 80% of node's samples (it does little else), got {} of {total}",
        a + b
    );
    assert_split("node", a, b, expected);
    // Node's `main` tail-calls node::Start (no frame of its own on the
    // stack): a whole stack ends node::Start, __libc_start_main, _start.
    let reaching_main: i64 = with_frame(&samples, "hot")
        .filter(|sample| {
            let root = |name: &str| sample.functions.iter().any(|function| function.starts_with(name));
            root("node::Start(") && root("_start")
        })
        .map(|sample| sample.values[0])
        .sum();
    assert!(
        reaching_main as f64 >= 0.9 * (a + b) as f64,
        "the stacks through hotA and hotB should reach node::Start and _start (JIT frames crossed by frame pointer): \
         {reaching_main} of {}",
        a + b
    );
    drop(node);

    // Without --perf-basic-prof: the same code, as JIT code, not a bare address.
    let unnamed = Runtime::node(false, None, 30);
    std::thread::sleep(Duration::from_secs(2));
    let file = artifacts_dir().join("node-no-map.pb.gz");
    daemon.fetch_pprof(
        &format!("/debug/pprof/profile?seconds=3&pid={}", unnamed.pid()),
        &file,
    );
    let samples = parse_raw(&go_pprof(&["-raw", &file.display().to_string()]));
    let jit = count(&samples, "[jit]");
    let total: i64 = samples.iter().map(|sample| sample.values[0]).sum();
    assert!(
        jit as f64 >= 0.5 * total as f64 && count(&samples, "hotA") == 0,
        "without a perf map, node's JIT code should show as [jit] ({jit} of {total} samples)"
    );
}

#[test]
fn java_methods_are_named_from_the_map_jcmd_writes_and_split_as_it_measured() {
    let _serial = serial();
    let classes = std::env::temp_dir().join(format!("profilerd-jit-classes-{}", std::process::id()));
    std::fs::create_dir_all(&classes).expect("a directory for the class");
    let javac = Command::new("javac")
        .arg("-d")
        .arg(&classes)
        .arg(workload("Split.java"))
        .status()
        .expect("running javac (openjdk-17-jdk-headless)");
    assert!(javac.success(), "javac Split.java: {javac}");
    let daemon = Daemon::start(&[]);
    let classpath = classes.to_str().expect("a UTF-8 path");
    let java = Runtime::start(
        "java",
        &[
            "-XX:+PreserveFramePointer",
            "-XX:CompileCommand=quiet",
            // hotA and hotB keep frames of their own (not inlined into main).
            "-XX:CompileCommand=dontinline,Split::*",
            "-cp",
            classpath,
            "Split",
        ],
        60,
    );
    // Compiled by C2 within a few seconds; then the map is written.
    std::thread::sleep(Duration::from_secs(5));
    let jcmd = Command::new("jcmd")
        .args([&java.pid().to_string(), "Compiler.perfmap"])
        .output()
        .expect("running jcmd");
    assert!(
        jcmd.status.success(),
        "jcmd Compiler.perfmap: {}",
        String::from_utf8_lossy(&jcmd.stdout)
    );
    let (_, a, b, expected) = profile(&daemon, &java, "java-jit");
    assert_split("java", a, b, expected);
    let _ = std::fs::remove_dir_all(&classes);
}
