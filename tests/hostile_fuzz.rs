//! Fuzz: thousands of corrupted variants of one ELF file with DWARF, each
//! mapped and run by an unprivileged user, so that the daemon samples them
//! and parses every one. The daemon must neither crash nor stall: same pid,
//! /metrics and a root workload's profile answered within seconds, new
//! samples arriving throughout.
//!
//! Replay or widen a run with PROFILERD_FUZZ_SEED and PROFILERD_FUZZ_MUTANTS.

use std::{
    collections::{HashMap, HashSet},
    io::{BufRead, BufReader},
    process::{Child, Stdio},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use profilerd_tests::{
    Workload, artifacts_dir, attacker::attacker, daemon::Daemon, daemon::go_pprof, elf_mutants::Layout,
    parse_folded, serial,
};

const SEED: u64 = 0x0014_f022;
const MUTANTS: u64 = 5000;
/// One loader per CPU of this 2-CPU machine.
const LOADERS: u64 = 2;
/// CPU time each mutant's function runs: ~4 samples at 999 Hz.
const CPU_US_PER_MUTANT: u64 = 4000;
/// Mappings a loader keeps: each lives for >= KEEP x 4 ms, well past the
/// daemon's 100 ms drain, so it is still mapped when its samples are symbolized.
const KEEP: u64 = 96;
const LOAD_DEADLINE: Duration = Duration::from_secs(60);
/// A scrape slower than this, or this long without new samples, is a stall.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);
const STALLED_AFTER: Duration = Duration::from_secs(4);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn thousands_of_corrupted_elf_and_dwarf_files_neither_crash_nor_stall_the_daemon() {
    let _serial = serial();
    let started = Instant::now();
    let (seed, count) = (
        env_u64("PROFILERD_FUZZ_SEED", SEED),
        env_u64("PROFILERD_FUZZ_MUTANTS", MUTANTS),
    );
    let attacker = attacker();
    let dir = attacker.workdir(&std::env::temp_dir(), "fuzz");
    let original = std::fs::read(env!("WORKLOAD_FUZZ_VICTIM")).expect("reading the fuzz victim");
    let layout = Layout::of(&original, "fuzz_hot");
    let mut lists = vec![String::new(); LOADERS as usize];
    let mut targets = HashMap::new();
    for index in 0..count {
        let (bytes, target) = layout.mutant(&original, seed, index);
        *targets.entry(format!("{target:?}")).or_insert(0) += 1;
        let path = dir.join(format!("m{index:05}.so"));
        std::fs::write(&path, bytes).unwrap_or_else(|err| panic!("writing {}: {err}", path.display()));
        std::os::unix::fs::chown(&path, Some(attacker.uid), Some(attacker.gid)).expect("chown mutant");
        lists[(index % LOADERS) as usize] += &format!("{}\n", path.display());
    }
    let prepared = started.elapsed();

    let daemon = Daemon::start(&["--frequency", "999", "--drain-interval-ms", "100"]);
    let root = Workload::spawn(env!("WORKLOAD_SPLIT"), &["150"]);
    let mut loaders: Vec<Loader> = lists
        .iter()
        .enumerate()
        .map(|(index, list)| {
            let file = dir.join(format!("list{index}"));
            std::fs::write(&file, list).expect("writing a loader's list");
            Loader::start(&file, layout.protected.start)
        })
        .collect();
    let mut watch = Watch::new(daemon.pid(), &daemon.addr, root.pid());
    let done = |loaders: &[Loader]| {
        loaders
            .iter()
            .map(|l| l.done.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let deadline = Instant::now() + LOAD_DEADLINE + Duration::from_secs(15);
    while loaders.iter_mut().any(Loader::running) {
        std::thread::sleep(Duration::from_secs(1));
        // Loader k runs mutants k, k + LOADERS, ...: where each one is.
        let reached: Vec<String> = (0..LOADERS)
            .zip(&loaders)
            .map(|(k, loader)| {
                let done = loader.done.load(Ordering::Relaxed);
                format!("m{:05}", (done.max(1) - 1) * LOADERS + k)
            })
            .collect();
        if let Err(problem) = watch.check() {
            panic!(
                "the daemon failed with mutants up to {reached:?} of seed {seed:#x} run (each loader \
                 keeps its last {KEEP} mapped): {problem}"
            );
        }
        assert!(Instant::now() < deadline, "the loaders overran their deadline");
    }
    let loaded = started.elapsed() - prepared;
    for loader in &mut loaders {
        let status = loader.child.wait().expect("reaping a loader");
        assert!(
            status.success(),
            "a loader failed ({status}); the run did not test what it should"
        );
    }
    std::thread::sleep(Duration::from_millis(500));
    watch
        .check()
        .unwrap_or_else(|problem| panic!("after the run: {problem}"));

    let (mut sampled, mut resolved) = (HashSet::new(), HashSet::new());
    for (index, loader) in loaders.iter().enumerate() {
        let (s, r) = mutants_in_profile(&daemon, loader.pid, index);
        sampled.extend(s);
        resolved.extend(r);
    }
    let run = done(&loaders);
    println!(
        "fuzz: seed {seed:#x}, {run} of {count} mutants run ({targets:?}); {} sampled, {} of them symbolized to a name; \
         daemon alive with {} samples, {} checks, slowest scrape {:?}, peak RSS {} KiB; prepare {prepared:?}, load {loaded:?}",
        sampled.len(),
        resolved.len(),
        watch.samples,
        watch.checks,
        watch.slowest,
        peak_rss_kib(daemon.pid()),
    );
    assert!(
        sampled.len() as u64 * 2 >= run,
        "only {} of {run} mutants were sampled: the run did not exercise the symbolizer",
        sampled.len()
    );
    // Most mutants keep readable symbols (~3 in 4 on the first runs): the
    // symbolizer parsed them rather than giving up on every file.
    assert!(
        resolved.len() as u64 * 4 >= run,
        "only {} of {run} mutants got a function name: the symbolizer did not parse them",
        resolved.len()
    );
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A loader run as the attacker, its progress read from its output.
struct Loader {
    child: Child,
    pid: u32,
    done: Arc<AtomicU64>,
}

impl Loader {
    fn start(list: &std::path::Path, hot: usize) -> Self {
        let mut command = attacker().command(env!("WORKLOAD_FUZZ_LOADER"));
        command
            .arg(list)
            .arg(hot.to_string())
            .arg(CPU_US_PER_MUTANT.to_string())
            .arg(KEEP.to_string())
            .arg(LOAD_DEADLINE.as_secs().to_string())
            .stdout(Stdio::piped());
        let mut child = command.spawn().expect("starting the fuzz loader as the attacker");
        let done = Arc::new(AtomicU64::new(0));
        let stdout = child.stdout.take().expect("the loader's stdout");
        let counter = done.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(index) = line.parse::<u64>() {
                    counter.store(index + 1, Ordering::Relaxed);
                }
            }
        });
        let pid = child.id();
        Self { child, pid, done }
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The liveness checks, with what the last ones saw.
struct Watch {
    pid: u32,
    addr: String,
    root: u32,
    agent: ureq::Agent,
    samples: u64,
    samples_changed: Instant,
    /// (when, the root workload's CPU ns) at the last check.
    root_cpu: (Instant, u64),
    checks: u32,
    slowest: Duration,
}

impl Watch {
    fn new(pid: u32, addr: &str, root: u32) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(ANSWER_WITHIN))
            .build()
            .into();
        Self {
            pid,
            addr: addr.to_owned(),
            root,
            agent,
            samples: 0,
            samples_changed: Instant::now(),
            root_cpu: (Instant::now(), cpu_ns(root)),
            checks: 0,
            slowest: Duration::ZERO,
        }
    }

    fn get(&mut self, path: &str) -> Result<String, String> {
        let started = Instant::now();
        let url = format!("http://{}{path}", self.addr);
        let mut response = self
            .agent
            .get(&url)
            .call()
            .map_err(|err| format!("GET {path}: {err}"))?;
        let body = response
            .body_mut()
            .read_to_string()
            .map_err(|err| format!("GET {path}: {err}"))?;
        let took = started.elapsed();
        self.slowest = self.slowest.max(took);
        match response.status().as_u16() {
            200 => Ok(body),
            status => Err(format!("GET {path}: {status} after {took:?}: {body}")),
        }
    }

    fn check(&mut self) -> Result<(), String> {
        self.checks += 1;
        let state = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.trim_start().chars().next())
            });
        if !matches!(state, Some(state) if state != 'Z' && state != 'X') {
            return Err(format!("daemon pid {} is gone (state {state:?})", self.pid));
        }
        let metrics = self.get("/metrics")?;
        let samples = metrics
            .lines()
            .find_map(|line| line.strip_prefix("profilerd_samples_total "))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .ok_or("no profilerd_samples_total in /metrics")? as u64;
        if samples > self.samples {
            (self.samples, self.samples_changed) = (samples, Instant::now());
        } else if self.samples_changed.elapsed() > STALLED_AFTER {
            return Err(format!(
                "no new samples for {:?} (profilerd_samples_total stays {samples})",
                self.samples_changed.elapsed()
            ));
        }
        let folded = self.get(&format!("/folded?pid={}&seconds=2", self.root))?;
        let got: u64 = parse_folded(&folded).iter().map(|line| line.count).sum();
        // What the root workload ran since the last check, at 999 Hz: a
        // window of about the same length as the profile's.
        let (now, cpu) = (Instant::now(), cpu_ns(self.root));
        let per_second =
            (cpu - self.root_cpu.1) as f64 / now.duration_since(self.root_cpu.0).as_secs_f64() / 1e9;
        self.root_cpu = (now, cpu);
        let expected = per_second * 2.0 * 999.0;
        if expected >= 200.0 && (got as f64) < expected / 4.0 {
            return Err(format!(
                "the root workload's last 2 s hold {got} samples; it ran {per_second:.2} CPU-s/s (~{expected:.0} expected)"
            ));
        }
        Ok(())
    }
}

/// The workload's CPU time so far, in ns (schedstat: no tick rounding).
fn cpu_ns(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("reading /proc/{pid}/schedstat"))
}

fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Mutant files with samples in a loader's profile, and those among them
/// whose frames got a name (from `go tool pprof -raw`: the Locations refer
/// to Mappings by id).
fn mutants_in_profile(daemon: &Daemon, loader: u32, index: usize) -> (HashSet<String>, HashSet<String>) {
    let file = artifacts_dir().join(format!("fuzz-loader{index}.pb.gz"));
    daemon.fetch_pprof(&format!("/pprof?pid={loader}&seconds=200"), &file);
    // -symbolize=none: pprof would open the mutants itself (and go's ELF
    // reader crashes on some of them).
    let raw = go_pprof(&["-raw", "-symbolize=none", &file.display().to_string()]);
    let (mut section, mut named, mut files) = ("", HashSet::new(), HashMap::new());
    for line in raw.lines() {
        if matches!(line, "Locations" | "Mappings") {
            section = line;
            continue;
        }
        let mut words = line.split_whitespace();
        match section {
            // "  7: 0xADDR M=3 fuzz_hot /src/fuzz_victim.c:9:0 s=0"
            "Locations" => {
                let (Some(_), Some(_), Some(mapping), Some(name)) =
                    (words.next(), words.next(), words.next(), words.next())
                else {
                    continue;
                };
                if let Some(id) = mapping.strip_prefix("M=")
                    && !name.starts_with("[unknown]")
                {
                    named.insert(id.to_owned());
                }
            }
            // "3: 0xSTART/0xLIMIT/0xOFFSET /tmp/.../m00042.so BUILDID [FN]"
            "Mappings" => {
                if let (Some(id), Some(_), Some(path)) = (words.next(), words.next(), words.next())
                    && let Some(name) = path
                        .rsplit('/')
                        .next()
                        .filter(|name| name.starts_with('m') && name.ends_with(".so"))
                {
                    files.insert(id.trim_end_matches(':').to_owned(), name.to_owned());
                }
            }
            _ => {}
        }
    }
    let resolved = files
        .iter()
        .filter(|(id, _)| named.contains(*id))
        .map(|(_, name)| name.clone())
        .collect();
    (files.into_values().collect(), resolved)
}
