//! The allocation profiler's harness (tests/allocations.rs), by what it
//! deals with: `workload` (alloc_sites, which counts its own allocations
//! per call site: tests/workloads/alloc_sites.c), `profile` (the daemon's
//! heap profiles as `go tool pprof -raw` reads them), `dhat` (valgrind's
//! DHAT, the independent oracle of the workload's counts) and `uprobes`
//! (whether uprobes are attached: the daemon's perf links and the
//! breakpoints in the traced process's own code). Here: the sites, windows
//! of the daemon over the workload, and the checks of a profile's labels.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use crate::daemon::Daemon;

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

mod dhat;
mod profile;
mod uprobes;
mod workload;

pub use dhat::*;
pub use profile::*;
pub use uprobes::*;
pub use workload::*;

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
