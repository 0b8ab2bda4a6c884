//! The allocation profiler's harness (tests/allocations.rs): the workload
//! that counts its own allocations per call site (tests/workloads/alloc_sites.c),
//! the daemon's heap profiles as `go tool pprof -raw` reads them, DHAT (the
//! independent oracle of the workload's counts), and what tells whether
//! uprobes are attached: the daemon's perf links and the breakpoints in the
//! traced process's own code.

use std::{
    collections::{BTreeMap, HashSet},
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use crate::{
    container::Container,
    daemon::{Daemon, RawSample, go_pprof, parse_raw},
    elf,
};

/// The non-leaking sites of alloc_sites, in the order of its batch's ratio
/// 3:1:2:2 (by expected bytes).
pub const SITES: [&str; 4] = [
    "site_malloc_big",
    "site_calloc_small",
    "site_realloc_grow",
    "site_posix_memalign",
];
/// The site that never frees.
pub const LEAK_SITE: &str = "site_leak";
/// The churn mode's only site.
pub const CHURN_SITE: &str = "site_churn";
/// Where [`AllocProfile::by_site`] puts what no `site_*` frame holds.
pub const NO_SITE: &str = "(no site_* frame)";

/// The sample types of Go's heap profile, in its order.
pub const HEAP_SAMPLE_TYPES: [&str; 4] = [
    "alloc_objects/count",
    "alloc_space/bytes",
    "inuse_objects/count",
    "inuse_space/bytes",
];
pub const ALLOC_OBJECTS: &str = "alloc_objects/count";
pub const ALLOC_SPACE: &str = "alloc_space/bytes";
pub const INUSE_OBJECTS: &str = "inuse_objects/count";
pub const INUSE_SPACE: &str = "inuse_space/bytes";

pub const MIB: u64 = 1 << 20;

/// alloc_sites's path (built by tests/build.rs without frame pointers).
pub fn binary() -> &'static str {
    env!("WORKLOAD_ALLOC_SITES")
}

/// How alloc_sites runs: its arguments.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// "all" or "churn".
    pub mode: &'static str,
    /// Its whole life, unless stopped earlier.
    pub seconds: f64,
    pub leak_per_s: u64,
    /// Bytes the non-leaking sites allocate per second between them.
    pub sites_per_s: u64,
}

impl Options {
    /// Every site, for `seconds`, at these rates.
    pub fn all(seconds: f64, leak_per_s: u64, sites_per_s: u64) -> Self {
        Self {
            mode: "all",
            seconds,
            leak_per_s,
            sites_per_s,
        }
    }

    /// The malloc storm: about 2 million malloc(64) + free a second.
    pub fn churn(seconds: f64) -> Self {
        Self {
            mode: "churn",
            seconds,
            leak_per_s: 0,
            sites_per_s: 0,
        }
    }

    fn args(&self, stats: &Path) -> Vec<String> {
        vec![
            stats.display().to_string(),
            self.seconds.to_string(),
            self.mode.to_owned(),
            self.leak_per_s.to_string(),
            self.sites_per_s.to_string(),
        ]
    }
}

/// A temporary directory of this test process, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("profilerd-allocs-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|err| panic!("creating {}: {err}", dir.display()));
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running alloc_sites; killed on drop. Its stdin is a pipe this holds:
/// should the test process die, the pipe closes and the workload ends.
pub struct AllocSites {
    /// alloc_sites itself, or what runs it (nsenter, for a container).
    child: Child,
    /// alloc_sites's pid in the host's pid namespace.
    pid: u32,
    stdin: Option<ChildStdin>,
    /// Its stats file, as the host reaches it.
    stats: PathBuf,
    _dir: Option<TempDir>,
}

impl AllocSites {
    pub fn start(options: Options) -> Self {
        Self::start_with(&[], options)
    }

    /// Runs `wrapper... alloc_sites ARGS` (valgrind, for one).
    pub fn start_with(wrapper: &[&str], options: Options) -> Self {
        Self::spawn(wrapper, None, options)
    }

    /// Runs alloc_sites under another name (its comm, at most 15 bytes),
    /// through a link in its directory: a test that chooses it by name must
    /// not pick up the alloc_sites of a test in the suite's other lane.
    pub fn start_as(name: &str, options: Options) -> Self {
        Self::spawn(&[], Some(name), options)
    }

    fn spawn(wrapper: &[&str], name: Option<&str>, options: Options) -> Self {
        let dir = TempDir::new(options.mode);
        let stats = dir.0.join("stats");
        let args = options.args(&stats);
        let link = name.map(|name| crate::NameLink::new(binary(), name));
        let program = link.as_ref().map_or(binary(), crate::NameLink::path);
        let mut command = match wrapper.split_first() {
            Some((wrapper, rest)) => {
                let mut command = Command::new(wrapper);
                command.args(rest).arg(program);
                command
            }
            None => Command::new(program),
        };
        let mut child = command
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| panic!("starting {wrapper:?} alloc_sites {args:?}: {err}"));
        let stdin = child.stdin.take();
        if let Some(name) = name {
            // exec succeeded (spawn returned): the name is the link's.
            crate::assert_comm(child.id(), name);
        }
        Self {
            pid: child.id(),
            child,
            stdin,
            stats,
            _dir: Some(dir),
        }
    }

    /// Runs alloc_sites inside `container`, in every namespace of its PID 1
    /// (its mount namespace: the container's own root and libc; its pid
    /// namespace: a pid of its own there), from a copy of the binary put in
    /// the container's root (its volatile overlay: the cached rootfs stays
    /// pristine). The stats file is in the container's /tmp, which the host
    /// reads through [`Container::root`].
    pub fn start_in_container(container: &Container, options: Options) -> Self {
        let root = container.root();
        let inside = "/usr/local/bin/alloc_sites";
        let copy = root.join(inside.trim_start_matches('/'));
        std::fs::copy(binary(), &copy)
            .unwrap_or_else(|err| panic!("copying alloc_sites to {}: {err}", copy.display()));
        let stats_inside = format!("/tmp/profilerd-allocs-{}-stats", std::process::id());
        let stats = root.join(stats_inside.trim_start_matches('/'));
        let _ = std::fs::remove_file(&stats);
        let args = options.args(Path::new(&stats_inside));
        let argv: Vec<&str> = std::iter::once(inside)
            .chain(args.iter().map(String::as_str))
            .collect();
        let mut child = container
            .command(&argv)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| panic!("starting alloc_sites {args:?} in the container: {err}"));
        let stdin = child.stdin.take();
        // nsenter forks into the pid namespace, then its child execs
        // alloc_sites: that child's host pid, once it is alloc_sites.
        let nsenter = child.id();
        let pid = eventually(Duration::from_secs(10), || {
            let children =
                std::fs::read_to_string(format!("/proc/{nsenter}/task/{nsenter}/children")).ok()?;
            let pid: u32 = children.split_whitespace().next()?.parse().ok()?;
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "alloc_sites")
                .then_some(pid)
        });
        let mut workload = Self {
            child,
            pid: 0,
            stdin,
            stats,
            _dir: None,
        };
        workload.pid = pid.unwrap_or_else(|| {
            panic!(
                "no alloc_sites under nsenter ({nsenter}) in the container within 10 s (nsenter {})",
                if workload.running() { "runs" } else { "exited" }
            )
        });
        workload
    }

    /// Its pid in the host's pid namespace: what was started (valgrind's,
    /// when wrapped: valgrind runs the program in its own process), or
    /// nsenter's child in a container.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Its stats as last written; waits (10 s at most) for the first ones.
    pub fn stats(&mut self) -> Stats {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // Written to a temporary file and renamed: whole, or not yet there.
            if let Ok(text) = std::fs::read_to_string(&self.stats) {
                return Stats::parse(&text);
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "alloc_sites exited ({status}) before writing {}",
                    self.stats.display()
                );
            }
            assert!(
                Instant::now() < deadline,
                "alloc_sites wrote no {} within 10 s",
                self.stats.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until it has run `at_least` (by its own clock), and returns
    /// its stats then. A minute at most: a stall.
    pub fn wait_until_run(&mut self, at_least: Duration) -> Stats {
        let deadline = Instant::now() + at_least + Duration::from_secs(60);
        loop {
            let stats = self.stats();
            if stats.elapsed() >= at_least {
                return stats;
            }
            assert!(
                self.running(),
                "alloc_sites exited after {:?}, before running {at_least:?}",
                stats.elapsed()
            );
            assert!(
                Instant::now() < deadline,
                "alloc_sites had run only {:?} of the {at_least:?} awaited a minute later",
                stats.elapsed()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for it to end by itself (`within` at most) and returns its
    /// exit status and its last stats.
    pub fn wait_exit(&mut self, within: Duration) -> (ExitStatus, Stats) {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return (status, self.stats());
            }
            assert!(
                Instant::now() < deadline,
                "alloc_sites still runs {within:?} after it was due to end"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for AllocSites {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One stats file of alloc_sites (see its header for the keys).
#[derive(Clone, Debug)]
pub struct Stats {
    values: BTreeMap<String, String>,
}

impl Stats {
    pub fn parse(text: &str) -> Self {
        let values = text
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(key, value)| (key.to_owned(), value.to_owned()))
            .collect();
        Self { values }
    }

    pub fn value(&self, key: &str) -> u64 {
        let text = self
            .values
            .get(key)
            .unwrap_or_else(|| panic!("{key} missing from alloc_sites's stats: {:?}", self.values));
        text.parse()
            .unwrap_or_else(|_| panic!("{key}={text} in alloc_sites's stats is not a number"))
    }

    pub fn pid(&self) -> u32 {
        u32::try_from(self.value("pid")).expect("a pid")
    }

    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.value("elapsed_ns"))
    }

    pub fn done(&self) -> bool {
        self.value("done") == 1
    }

    pub fn calls(&self, site: &str) -> u64 {
        self.value(&format!("{site}.calls"))
    }

    pub fn bytes(&self, site: &str) -> u64 {
        self.value(&format!("{site}.bytes"))
    }

    /// The most the non-leaking sites ever hold live.
    pub fn max_outstanding_bytes(&self) -> u64 {
        self.value("max_outstanding_bytes")
    }

    /// What happened between `before` and this.
    pub fn since(&self, before: &Stats) -> Delta {
        let mut bytes = BTreeMap::new();
        let mut calls = BTreeMap::new();
        for site in SITES.iter().chain(&[LEAK_SITE, CHURN_SITE]) {
            bytes.insert(site.to_string(), self.bytes(site) - before.bytes(site));
            calls.insert(site.to_string(), self.calls(site) - before.calls(site));
        }
        Delta {
            elapsed: self.elapsed() - before.elapsed(),
            bytes,
            calls,
        }
    }
}

/// The counts of alloc_sites over an interval.
#[derive(Clone, Debug)]
pub struct Delta {
    pub elapsed: Duration,
    pub bytes: BTreeMap<String, u64>,
    pub calls: BTreeMap<String, u64>,
}

impl Delta {
    pub fn bytes(&self, site: &str) -> u64 {
        self.bytes[site]
    }

    /// Bytes per second of `site` over the interval.
    pub fn rate(&self, site: &str) -> f64 {
        self.bytes(site) as f64 / self.elapsed.as_secs_f64()
    }

    /// Bytes per second of the non-leaking sites together.
    pub fn sites_rate(&self) -> f64 {
        SITES.iter().map(|site| self.rate(site)).sum()
    }
}

/// Each of `values`' share of their sum, in percent (0 for an empty sum).
pub fn shares(values: &[f64]) -> Vec<f64> {
    let total: f64 = values.iter().sum();
    values
        .iter()
        .map(|value| if total > 0.0 { 100.0 * value / total } else { 0.0 })
        .collect()
}

/// Panics unless each of [`SITES`]' share in `got` is within `points`
/// percentage points of its share in `expected`; prints both either way.
pub fn assert_site_shares(what: &str, got: &[f64; 4], expected: &[f64; 4], points: f64) {
    assert_shares(what, &SITES, got, expected, points);
}

/// Panics unless each of `names`' share in `got` is within `points`
/// percentage points of its share in `expected` (both in the order of
/// `names`); prints both either way.
pub fn assert_shares(what: &str, names: &[&str], got: &[f64], expected: &[f64], points: f64) {
    assert_eq!(names.len(), got.len(), "{what}: a value per name");
    assert_eq!(names.len(), expected.len(), "{what}: an expected value per name");
    let got_shares = shares(got);
    let expected_shares = shares(expected);
    let mut table = String::new();
    for (index, site) in names.iter().enumerate() {
        table.push_str(&format!(
            "  {site:<20} got {:6.2} % ({:.0} bytes), expected {:6.2} % ({:.0} bytes)\n",
            got_shares[index], got[index], expected_shares[index], expected[index]
        ));
    }
    eprintln!("{what}:\n{table}");
    for (index, site) in names.iter().enumerate() {
        let off = (got_shares[index] - expected_shares[index]).abs();
        assert!(
            off <= points,
            "{what}: {site}'s share should be within {points} points of {:.2} %, got {:.2} % \
             ({off:.2} points off); all sites:\n{table}",
            expected_shares[index],
            got_shares[index]
        );
    }
}

/// The `site_*` function a stack (leaf first) allocates from: its first
/// frame of that name (a compiler's clone suffix, `.isra.0` and such,
/// dropped).
pub fn site_of(functions: &[String]) -> Option<&str> {
    functions
        .iter()
        .find(|function| function.starts_with("site_"))
        .map(|function| function.split('.').next().unwrap_or(function))
}

/// A heap profile as `go tool pprof -raw` prints it.
#[derive(Clone, Debug)]
pub struct AllocProfile {
    /// Where it was saved.
    pub file: PathBuf,
    /// "TYPE UNIT", as `PeriodType:` says ("" without one).
    pub period_type: String,
    pub period: i64,
    /// "type/unit", in the order of each sample's values.
    pub sample_types: Vec<String>,
    pub samples: Vec<RawSample>,
}

impl AllocProfile {
    /// Reads `file` (a gzipped profile) with `go tool pprof -raw`: the
    /// header by this, the samples (any number of values each) by
    /// [`parse_raw`].
    pub fn read(file: &Path) -> Self {
        Self::parse(file, &go_pprof(&["-raw", &file.display().to_string()]))
    }

    /// Parses `raw`, what `go tool pprof -raw` printed of `file`.
    pub fn parse(file: &Path, raw: &str) -> Self {
        let mut period_type = String::new();
        let mut period = 0;
        let mut sample_types = Vec::new();
        let mut lines = raw.lines();
        while let Some(line) = lines.next() {
            if let Some(value) = line.strip_prefix("PeriodType: ") {
                period_type = value.trim().to_owned();
            } else if let Some(value) = line.strip_prefix("Period: ") {
                period = value
                    .trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{}: a bad period line {line:?}", file.display()));
            } else if line == "Samples:" {
                // The next line names the sample types; "[dflt]" marks the
                // default one.
                sample_types = lines
                    .next()
                    .unwrap_or_default()
                    .split_whitespace()
                    .map(|name| name.trim_end_matches("[dflt]").to_owned())
                    .collect();
                break;
            }
        }
        let samples = parse_raw(raw);
        for sample in &samples {
            assert_eq!(
                sample.values.len(),
                sample_types.len(),
                "{}: a sample has {} values for the {} sample types {sample_types:?}: {sample:?}",
                file.display(),
                sample.values.len(),
                sample_types.len()
            );
        }
        Self {
            file: file.to_owned(),
            period_type,
            period,
            sample_types,
            samples,
        }
    }

    /// Panics unless the sample types are Go's heap profile's, in its order.
    pub fn assert_heap_sample_types(&self) {
        assert_eq!(
            self.sample_types,
            HEAP_SAMPLE_TYPES,
            "{}: the sample types should be Go's heap profile's",
            self.file.display()
        );
        assert_eq!(
            self.period_type,
            "space bytes",
            "{}: the period type should be space/bytes, as Go's heap profile's",
            self.file.display()
        );
    }

    fn index(&self, sample_type: &str) -> usize {
        self.sample_types
            .iter()
            .position(|name| name == sample_type)
            .unwrap_or_else(|| {
                panic!(
                    "{}: no sample type {sample_type} among {:?}",
                    self.file.display(),
                    self.sample_types
                )
            })
    }

    /// One sample's value of `sample_type`.
    pub fn value(&self, sample: &RawSample, sample_type: &str) -> i64 {
        sample.values[self.index(sample_type)]
    }

    /// The sum of `sample_type` over the samples that satisfy `keep`.
    pub fn sum(&self, sample_type: &str, keep: impl Fn(&RawSample) -> bool) -> i64 {
        let index = self.index(sample_type);
        self.samples
            .iter()
            .filter(|sample| keep(sample))
            .map(|sample| sample.values[index])
            .sum()
    }

    /// `sample_type` summed per site ([`site_of`] each sample's stack;
    /// [`NO_SITE`] for stacks without one).
    pub fn by_site(&self, sample_type: &str) -> BTreeMap<String, i64> {
        let index = self.index(sample_type);
        let mut sums = BTreeMap::new();
        for sample in &self.samples {
            let site = site_of(&sample.functions).unwrap_or(NO_SITE);
            *sums.entry(site.to_owned()).or_insert(0) += sample.values[index];
        }
        sums
    }

    /// [`Self::by_site`] for [`SITES`], as floats in their order.
    pub fn sites(&self, sample_type: &str) -> [f64; 4] {
        let sums = self.by_site(sample_type);
        SITES.map(|site| sums.get(site).copied().unwrap_or(0) as f64)
    }

    /// `sample_type` at one site.
    pub fn at_site(&self, sample_type: &str, site: &str) -> i64 {
        self.by_site(sample_type).get(site).copied().unwrap_or(0)
    }

    /// `sample_type` summed over the samples whose stack holds `function`
    /// (see [`is_function`]).
    pub fn under(&self, sample_type: &str, function: &str) -> i64 {
        self.sum(sample_type, |sample| {
            sample.functions.iter().any(|frame| is_function(frame, function))
        })
    }
}

/// Whether a frame's name is `function`: exactly, or as a Rust path's last
/// segment (`crate::function`), or with a compiler's clone suffix
/// (`function.isra.0`).
pub fn is_function(frame: &str, function: &str) -> bool {
    let frame = frame.split('.').next().unwrap_or(frame);
    frame == function || frame.ends_with(&format!("::{function}"))
}

/// The numeric label `bytes` of a sample (`go tool pprof -raw` prints it
/// as `bytes:[N]`, or `bytes:[N bytes]` with a unit).
pub fn bytes_label(sample: &RawSample) -> Option<i64> {
    let text = sample.labels.get("bytes")?;
    let digits: String = text.trim().chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

// ---------------------------------------------------------------------------
// DHAT, the workload's oracle.

/// What DHAT (`valgrind --tool=dhat`) counted: total bytes per site.
pub struct Dhat {
    /// Total bytes (`tb`) per [`site_of`] the program point's stack.
    pub bytes: BTreeMap<String, u64>,
    /// Allocations (`tbk`) per site.
    pub blocks: BTreeMap<String, u64>,
}

/// Runs alloc_sites under DHAT with `options` until it ends by itself and
/// returns DHAT's counts and the program's last stats.
pub fn run_under_dhat(options: Options) -> (Dhat, Stats) {
    let dir = TempDir::new("dhat");
    let output = dir.0.join("dhat.json");
    let out_arg = format!("--dhat-out-file={}", output.display());
    let mut workload = AllocSites::start_with(&["valgrind", "--tool=dhat", "--quiet", &out_arg], options);
    // Valgrind starts slowly, then the program runs its `seconds`.
    let (status, stats) = workload.wait_exit(Duration::from_secs_f64(options.seconds + 120.0));
    assert!(status.success(), "alloc_sites under valgrind failed: {status}");
    assert!(
        stats.done(),
        "alloc_sites under valgrind ended without its last stats"
    );
    let text = std::fs::read_to_string(&output)
        .unwrap_or_else(|err| panic!("reading DHAT's {}: {err}", output.display()));
    (parse_dhat(&text), stats)
}

/// DHAT's JSON: program points `pps`, each with `tb` (total bytes), `tbk`
/// (total blocks) and `fs`, its stack as indices into the frame table
/// `ftbl`, leaf first, whose strings read `0xADDR: FUNCTION (FILE:LINE)`.
pub fn parse_dhat(text: &str) -> Dhat {
    let json: serde_json::Value = serde_json::from_str(text).expect("DHAT writes JSON");
    let frames: Vec<String> = json["ftbl"]
        .as_array()
        .expect("DHAT's frame table ftbl")
        .iter()
        .map(|frame| {
            let frame = frame.as_str().unwrap_or_default();
            // "0x109F5: site_malloc_big (alloc_sites.c:133)" -> site_malloc_big
            let name = frame.split_once(": ").map_or(frame, |(_, rest)| rest);
            name.split(" (").next().unwrap_or(name).to_owned()
        })
        .collect();
    let mut bytes = BTreeMap::new();
    let mut blocks = BTreeMap::new();
    for point in json["pps"].as_array().expect("DHAT's program points pps") {
        let stack: Vec<String> = point["fs"]
            .as_array()
            .expect("a program point's stack fs")
            .iter()
            .map(|index| {
                let index = index.as_u64().expect("a frame index") as usize;
                frames.get(index).cloned().unwrap_or_default()
            })
            .collect();
        let site = site_of(&stack).unwrap_or(NO_SITE).to_owned();
        *bytes.entry(site.clone()).or_insert(0) += point["tb"].as_u64().expect("tb");
        *blocks.entry(site).or_insert(0) += point["tbk"].as_u64().expect("tbk");
    }
    Dhat { bytes, blocks }
}

// ---------------------------------------------------------------------------
// Whether uprobes are attached.

/// The allocator functions the daemon probes, by their exported names.
pub const ALLOCATOR_FUNCTIONS: [&str; 7] = [
    "malloc",
    "calloc",
    "realloc",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "free",
];

/// Allocator entry points of `pid`'s libc that hold a breakpoint now: the
/// int3 (0xcc) the kernel writes over the first instruction byte of a
/// probed function in each process it traces (a uretprobe too: it enters
/// by the same breakpoint), and puts back when the last probe goes. Read
/// from the process's memory against the library file: what the process
/// runs, whoever holds the probe, and after whatever death of the tracer.
pub fn breakpoints(pid: u32) -> Vec<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_else(|err| panic!("reading the mappings of {pid}: {err}"));
    let code: Vec<Mapping> = maps
        .lines()
        .filter_map(Mapping::parse)
        .filter(|m| m.executable)
        .collect();
    let libc = code
        .iter()
        .find(|mapping| {
            Path::new(&mapping.path)
                .file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("libc.so") || name.starts_with("libc-"))
        })
        .unwrap_or_else(|| panic!("{pid} maps no libc:\n{maps}"))
        .path
        .clone();
    let image = std::fs::read(&libc).unwrap_or_else(|err| panic!("reading {libc}: {err}"));
    let memory = std::fs::File::open(format!("/proc/{pid}/mem"))
        .unwrap_or_else(|err| panic!("opening the memory of {pid}: {err}"));
    let mut probed = Vec::new();
    for function in ALLOCATOR_FUNCTIONS {
        let Some(offset) = elf::dynamic_function_file_offset(&image, function) else {
            continue;
        };
        let mapping = code
            .iter()
            .find(|m| m.path == libc && (m.offset..m.offset + (m.end - m.start)).contains(&offset))
            .unwrap_or_else(|| {
                panic!("{function} of {libc} at file offset {offset:#x} is in no code mapping of {pid}")
            });
        let address = mapping.start + (offset - mapping.offset);
        let mut byte = [0u8];
        memory
            .read_exact_at(&mut byte, address)
            .unwrap_or_else(|err| panic!("reading {function} at {address:#x} in {pid}: {err}"));
        let original = image[usize::try_from(offset).expect("an offset within the file")];
        if byte[0] == 0xcc && original != 0xcc {
            probed.push(format!("{function} ({libc}+{offset:#x})"));
        }
    }
    probed
}

/// The libc a process maps, as it names it and as the host reaches it.
#[derive(Clone, Debug)]
pub struct MappedLibc {
    /// The path in the process's /proc/PID/maps (in its own mount namespace).
    pub path: String,
    /// /proc/PID/map_files/START-END of its first mapping: the very file
    /// the process maps, whatever the namespace.
    pub map_files: PathBuf,
}

/// The libc `pid` maps (libc.so.* or libc-*), from its first mapping of it.
pub fn mapped_libc(pid: u32) -> MappedLibc {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_else(|err| panic!("reading the mappings of {pid}: {err}"));
    let libc = maps
        .lines()
        .filter_map(Mapping::parse)
        .find(|mapping| {
            Path::new(&mapping.path)
                .file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("libc.so") || name.starts_with("libc-"))
        })
        .unwrap_or_else(|| panic!("{pid} maps no libc:\n{maps}"));
    MappedLibc {
        map_files: PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", libc.start, libc.end)),
        path: libc.path,
    }
}

struct Mapping {
    start: u64,
    end: u64,
    offset: u64,
    executable: bool,
    path: String,
}

impl Mapping {
    /// `start-end perms offset dev inode path`.
    fn parse(line: &str) -> Option<Self> {
        let mut fields = line.split_whitespace();
        let (start, end) = fields.next()?.split_once('-')?;
        let perms = fields.next()?;
        let offset = fields.next()?;
        let path = fields.nth(2)?;
        Some(Self {
            start: u64::from_str_radix(start, 16).ok()?,
            end: u64::from_str_radix(end, 16).ok()?,
            offset: u64::from_str_radix(offset, 16).ok()?,
            executable: perms.contains('x'),
            path: path.to_owned(),
        })
    }
}

/// One uprobe a process holds attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Uprobe {
    /// "uprobe" or "uretprobe".
    pub kind: String,
    /// The probed file and offset, as the kernel says.
    pub file: String,
    pub offset: String,
    /// The BPF link's id, for a probe attached through a link (aya's way
    /// on kernels that have perf links).
    pub link_id: Option<u64>,
}

/// The uprobes `pid` holds attached: its uprobe_multi links (one entry per
/// offset), the perf links among its file descriptors whose fdinfo says
/// `event_type: uprobe` or `uretprobe`, and
/// the perf events `bpftool perf list` shows it holding (probes attached
/// without a link; bpftool lists no link-held perf event).
pub fn uprobes_of(pid: u32) -> Vec<Uprobe> {
    let mut probes = Vec::new();
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return probes;
    };
    for entry in entries.filter_map(Result::ok) {
        let Ok(info) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let field = |key: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
                .map(|value| value.trim().to_owned())
        };
        if field("link_type").as_deref() == Some("uprobe_multi") {
            // One link, many offsets: a line `COOKIE OFFSET REF_CTR_OFFSET`
            // each, after the header `cookie offset ref_ctr_offset`.
            let offsets = info
                .lines()
                .skip_while(|line| !line.starts_with("cookie"))
                .skip(1)
                .filter_map(|line| line.split_whitespace().nth(1).map(str::to_owned));
            for offset in offsets {
                probes.push(Uprobe {
                    kind: "uprobe_multi".into(),
                    file: field("path").unwrap_or_default(),
                    offset,
                    link_id: field("link_id").and_then(|id| id.parse().ok()),
                });
            }
            continue;
        }
        if field("link_type").as_deref() != Some("perf") {
            continue;
        }
        let Some(kind) = field("event_type").filter(|kind| kind == "uprobe" || kind == "uretprobe") else {
            continue;
        };
        probes.push(Uprobe {
            kind,
            file: field("name").unwrap_or_default(),
            offset: field("offset").unwrap_or_default(),
            link_id: field("link_id").and_then(|id| id.parse().ok()),
        });
    }
    for entry in bpftool(&["perf", "list"]).as_array().into_iter().flatten() {
        let kind = entry["fd_type"].as_str().unwrap_or_default();
        if entry["pid"].as_u64() == Some(u64::from(pid)) && (kind == "uprobe" || kind == "uretprobe") {
            probes.push(Uprobe {
                kind: kind.to_owned(),
                file: entry["filename"].as_str().unwrap_or_default().to_owned(),
                offset: entry["offset"].to_string(),
                link_id: None,
            });
        }
    }
    probes
}

/// The ids of every BPF link the kernel holds now (`bpftool link show`).
pub fn link_ids() -> HashSet<u64> {
    bpftool(&["link", "show"])
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|link| link["id"].as_u64())
        .collect()
}

/// `bpftool -j ARGS`, parsed.
pub fn bpftool(args: &[&str]) -> serde_json::Value {
    let output = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .expect("running bpftool (scripts/setup-tests.sh installs it)");
    assert!(
        output.status.success(),
        "bpftool {args:?} failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|err| panic!("bpftool -j {args:?} printed no JSON: {err}"))
}

/// Polls `check` every 50 ms until it returns Some, `within` at most.
pub fn eventually<T>(within: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILL to `pid` (a child of this test, not reaped yet).
pub fn sigkill(pid: u32) {
    crate::cpu::signal(pid, libc::SIGKILL);
}

/// Builds tests/tools/go_allocs (a Go program that allocates, no cgo, no
/// libc), once per test process.
pub fn go_allocs() -> PathBuf {
    static TOOL: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    TOOL.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/go_allocs");
        let out = std::env::temp_dir().join(format!("profilerd-go-allocs-{}", std::process::id()));
        let build = Command::new("go")
            .args(["build", "-o"])
            .arg(&out)
            .arg(".")
            .current_dir(&source)
            .env("CGO_ENABLED", "0")
            .output()
            .expect("running go build (Go is installed by scripts/setup-tests.sh)");
        assert!(
            build.status.success(),
            "building tests/tools/go_allocs failed:\n{}",
            String::from_utf8_lossy(&build.stderr)
        );
        out
    })
    .clone()
}

// ---------------------------------------------------------------------------
// Windows of the daemon.

/// One allocation window of the daemon over alloc_sites, and what the
/// program counted around it.
pub struct Window {
    pub seconds: u64,
    /// The program's counts from just before the request to just after the
    /// answer: an interval that holds the window.
    pub delta: Delta,
    pub profile: AllocProfile,
}

/// GETs /debug/pprof/allocs for `workload` over `seconds` (saved under
/// tests/artifacts as allocs-NAME.pb.gz) and reads the program's stats
/// around it.
pub fn observe(daemon: &Daemon, workload: &mut AllocSites, seconds: u64, name: &str) -> Window {
    let before = workload.stats();
    let file = crate::artifacts_dir().join(format!("allocs-{name}.pb.gz"));
    daemon.fetch_pprof(&allocs_path(workload.pid(), seconds), &file);
    // The stats are rewritten every 100 ms: those read 300 ms after the
    // answer count everything the window saw (and a little more).
    std::thread::sleep(Duration::from_millis(300));
    let after = workload.stats();
    let delta = after.since(&before);
    eprintln!(
        "window of {seconds} s over alloc_sites {}: the program counted {:.3} s, {:?} bytes",
        workload.pid(),
        delta.elapsed.as_secs_f64(),
        delta.bytes
    );
    Window {
        seconds,
        delta,
        profile: AllocProfile::read(&file),
    }
}

pub fn allocs_path(pid: u32, seconds: u64) -> String {
    format!("/debug/pprof/allocs?pid={pid}&seconds={seconds}")
}

/// Panics unless every sample carries the labels of alloc_sites's one
/// thread (pid, comm, thread_id, thread_name) and a numeric `bytes`.
pub fn assert_labels(profile: &AllocProfile, pid: u32) {
    assert_labels_of(profile, pid, "alloc_sites");
}

/// Panics unless every sample carries the labels of a one-thread program
/// `comm` of pid `pid` (pid, comm, thread_id, thread_name) and a numeric
/// `bytes`.
pub fn assert_labels_of(profile: &AllocProfile, pid: u32, comm: &str) {
    let pid = pid.to_string();
    for sample in &profile.samples {
        for (key, expected) in [
            ("pid", pid.as_str()),
            ("comm", comm),
            ("thread_id", pid.as_str()),
            ("thread_name", comm),
        ] {
            assert_eq!(
                sample.label(key),
                expected,
                "{}: every sample's {key} label should be {expected:?} ({comm} is one thread); this one: {sample:?}",
                profile.file.display()
            );
        }
        assert!(
            bytes_label(sample).is_some_and(|bytes| bytes > 0),
            "{}: every sample should carry a numeric label bytes (its objects' size), this one: {sample:?}",
            profile.file.display()
        );
    }
}

/// Panics unless each sample's allocated space is its objects times its
/// `bytes` label (profilerd's: the average block, rounded down), within a
/// byte per object, and two when sampled (scaled values are rounded too);
/// and no sample has more objects in use than allocated.
pub fn assert_space_is_objects_times_size(profile: &AllocProfile, exact: bool) {
    for sample in &profile.samples {
        // profilerd keys samples by stack, not by size: `bytes` is the
        // sample's average allocated block, rounded down (Go's has one size
        // per sample). In-use blocks are some of them, of their own sizes.
        let bytes = bytes_label(sample).unwrap_or(0);
        let (objects, space) = (
            profile.value(sample, ALLOC_OBJECTS),
            profile.value(sample, ALLOC_SPACE),
        );
        let off = space - objects * bytes;
        // Sampled values are scaled and rounded once more: a byte per object either way.
        let allowed = if exact {
            0..objects.max(1)
        } else {
            -objects..objects.max(1) * 2
        };
        assert!(
            allowed.contains(&off),
            "{}: {ALLOC_SPACE} should be {ALLOC_OBJECTS} x the average block `bytes` \
             ({objects} x {bytes} = {}, plus less than a byte per object), got {space}: {sample:?}",
            profile.file.display(),
            objects * bytes,
        );
        assert!(
            profile.value(sample, INUSE_OBJECTS) <= profile.value(sample, ALLOC_OBJECTS),
            "{}: a sample cannot have more objects in use than were allocated in the window: {sample:?}",
            profile.file.display()
        );
    }
}

/// Waits until the daemon traces `pid` while it runs (its heap answers).
pub fn wait_until_traced(daemon: &Daemon, pid: u32) {
    let path = format!("/debug/pprof/heap?pid={pid}");
    // Found within a search of /proc (every 5 s) and the programs' load.
    let asked = Instant::now();
    loop {
        let response = daemon.get(&path);
        if response.status == 200 {
            return;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(30),
            "{path} should answer once the daemon traces the process, still {}: {}",
            response.status,
            response.text()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `go tool pprof -raw` prints of a heap profile written by Go's
    /// runtime/pprof (trimmed).
    const GO_HEAP_RAW: &str = "PeriodType: space bytes
Period: 524288
Time: 2026-11-26 08:53:55.411513129 +0000 UTC
Samples:
alloc_objects/count alloc_space/bytes inuse_objects/count inuse_space/bytes
          1     840284          1     840284: 1 2 3 
                bytes:[540672]
      19729  323241258      19729  323241258: 4 2 3 
                bytes:[16384]
       4096     524352          0          0: 5 2 3 
                bytes:[128 bytes]
Locations
     1: 0x4d96de M=1 site_leak /tmp/a.c:12:0 s=12
     2: 0x4d97b0 M=1 main /tmp/a.c:17:0 s=14
     3: 0x44cd14 M=1 __libc_start_call_main /x/libc.c:290:0 s=149
     4: 0x4d96a8 M=1 site_malloc_big.isra.0 /tmp/a.c:12:0 s=12
     5: 0x47c32b M=1 operator new /x/new.cc:1143:0 s=1067
Mappings
1: 0x400000/0x4da000/0x0 /tmp/a d58cec865b2618851ce1efafdbd18998e75d8dbc [FN]
";

    #[test]
    fn parses_a_go_heap_profile() {
        let profile = AllocProfile::parse(Path::new("heap.pb.gz"), GO_HEAP_RAW);
        profile.assert_heap_sample_types();
        assert_eq!(profile.period, 524_288);
        assert_eq!(profile.samples.len(), 3);
        assert_eq!(
            profile.samples.iter().map(bytes_label).collect::<Vec<_>>(),
            [Some(540_672), Some(16384), Some(128)]
        );
        let by_site = profile.by_site(INUSE_SPACE);
        assert_eq!(by_site.get(LEAK_SITE), Some(&840_284));
        assert_eq!(by_site.get("site_malloc_big"), Some(&323_241_258));
        assert_eq!(profile.by_site(ALLOC_OBJECTS).get(NO_SITE), Some(&4096));
        assert_eq!(
            profile.sum(ALLOC_SPACE, |_| true),
            840_284 + 323_241_258 + 524_352
        );
        // Go's own rounding: 524352 is 4096 x 128 and a bit.
        // Not `assert_space_is_objects_times_size`: Go labels a sample with its
        // block size and scales and rounds objects and space apart, while
        // profilerd labels the average of its scaled values.
    }

    #[test]
    fn parses_dhat_output() {
        let dhat = parse_dhat(
            r#"{"dhatFileVersion":2,"mode":"heap","pps":[
                {"tb":100,"tbk":2,"fs":[1,2,3]},
                {"tb":50,"tbk":1,"fs":[1,4,3]},
                {"tb":7,"tbk":1,"fs":[1,3]}],
              "ftbl":["[root]","0x48417B4: malloc (in /usr/libexec/valgrind/vgpreload_dhat-amd64-linux.so)",
                "0x1099F5: site_malloc_big (alloc_sites.c:133)","0x10A004: main (alloc_sites.c:273)",
                "0x1099F9: site_leak (alloc_sites.c:150)"]}"#,
        );
        assert_eq!(dhat.bytes.get("site_malloc_big"), Some(&100));
        assert_eq!(dhat.blocks.get("site_malloc_big"), Some(&2));
        assert_eq!(dhat.bytes.get(LEAK_SITE), Some(&50));
        assert_eq!(dhat.bytes.get(NO_SITE), Some(&7));
    }

    /// [`breakpoints`] sees an int3 over malloc's first byte: written by
    /// hand (as the kernel writes a uprobe's) into a stopped alloc_sites,
    /// which is killed before it could run into it.
    #[test]
    fn sees_a_breakpoint_at_malloc() {
        let mut workload = AllocSites::start(Options::all(60.0, MIB, MIB));
        workload.wait_until_run(Duration::from_millis(100));
        let pid = workload.pid();
        assert_eq!(breakpoints(pid), Vec::<String>::new());
        crate::cpu::pause(pid);
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
        let code: Vec<Mapping> = maps
            .lines()
            .filter_map(Mapping::parse)
            .filter(|m| m.executable)
            .collect();
        let libc = code
            .iter()
            .find(|m| m.path.contains("/libc.so"))
            .expect("a libc mapping");
        let image = std::fs::read(&libc.path).expect("libc");
        let offset = elf::dynamic_function_file_offset(&image, "malloc").expect("malloc in libc");
        let mapping = code
            .iter()
            .find(|m| m.path == libc.path && (m.offset..m.offset + (m.end - m.start)).contains(&offset))
            .expect("malloc's mapping");
        let memory = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .expect("opening the workload's memory for writing");
        memory
            .write_all_at(&[0xcc], mapping.start + offset - mapping.offset)
            .expect("writing an int3");
        let probed = breakpoints(pid);
        assert_eq!(probed.len(), 1, "{probed:?}");
        assert!(probed[0].starts_with("malloc ("), "{probed:?}");
    }
}
