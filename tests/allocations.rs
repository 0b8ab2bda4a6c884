//! Allocation profiling: `GET /debug/pprof/allocs?pid=P&seconds=N` traces
//! a process's malloc family with uprobes for N seconds and answers Go's
//! heap profile of what it allocated then.
//!
//! The workload (tests/workloads/alloc_sites.c, built without frame
//! pointers) allocates from five call sites of its own and counts, per
//! site, every call and every byte it asks for: it is the oracle of what
//! the daemon should see, and DHAT (valgrind's heap profiler) is the
//! oracle of its counts. Sites are found in a sample's stack by name: its
//! first `site_*` frame. The same program runs in the Debian container too
//! (its own libc, mount and pid namespaces), and two more workloads
//! allocate 3:1 from two named functions: Rust on std's system allocator
//! (tests/workloads/rust_allocs.rs) and C++ new/delete (cxx_allocs.cpp).

use std::{
    collections::BTreeMap, os::unix::fs::MetadataExt as _, path::Path, process::Command, time::Duration,
};

use profilerd_tests::{
    Workload,
    allocations::{
        ALLOC_OBJECTS, ALLOC_SPACE, AllocProfile, AllocSites, CHURN_SITE, INUSE_OBJECTS, INUSE_SPACE,
        LEAK_SITE, MIB, NO_SITE, Options, SITES, allocs_path, assert_labels, assert_labels_of, assert_shares,
        assert_site_shares, assert_space_is_objects_times_size, binary, breakpoints, bytes_label, eventually,
        go_allocs, is_function, link_ids, mapped_libc, observe, run_under_dhat, sigkill, site_of, uprobes_of,
        wait_until_traced,
    },
    artifacts_dir,
    container::Container,
    daemon::{Daemon, RawSample, get_in_background},
    profilerd_bin,
    rootfs::{CACHE, FileLock, cached_rootfs},
    serial,
    unwind::assert_frame_pointers,
};

/// Longer than any test: the workload is killed on drop.
const FOREVER: f64 = 300.0;
/// The accuracy tests measure what was traced, not the budget: the probes
/// may cost these workloads (little CPU, many calls) more than 10% of it.
const NO_BUDGET: &str = "100";
/// How long the workload runs before a window opens: started, libc mapped.
const WARM_UP: Duration = Duration::from_secs(1);
/// The daemon's default mean of bytes between samples.
const DEFAULT_SAMPLE_BYTES: i64 = 512 * 1024;

/// The rates when every allocation is recorded: ~2,000 allocations a second
/// at the four sites (sizes 1-64 KiB, and as many frees), 1,024 leaked
/// blocks of 16 KiB. 80 MiB leak in a 5-s window, where the other sites
/// hold 1 MiB at most live at any time: the leak is > 98 % of what is in
/// use at the end.
const EXACT_LEAK_PER_S: u64 = 16 * MIB;
const EXACT_SITES_PER_S: u64 = 64 * MIB;
const EXACT_WINDOW: u64 = 5;

/// The rates when sampled at 512 KiB: 640 MiB leaked in the 10-s window is
/// ~1,280 samples at site_leak, so the estimate's relative standard error is
/// 1/sqrt(1280) = 2.8 % and the 10 % bound is 3.6 of them; 2.5 GiB at the
/// other sites is ~5,000 samples, 0.7 points of standard error on a share
/// of ~37 %, and the bound is 5 points.
const SAMPLED_LEAK_PER_S: u64 = 64 * MIB;
const SAMPLED_SITES_PER_S: u64 = 256 * MIB;
const SAMPLED_WINDOW: u64 = 10;

/// A light load, for the tests that do not measure.
const LIGHT_LEAK_PER_S: u64 = 4 * MIB;
const LIGHT_SITES_PER_S: u64 = 32 * MIB;

/// Every named function of alloc_sites on the way from main to a site:
/// none may set up a frame pointer, or the test would not need the
/// daemon's unwinder.
fn assert_built_without_frame_pointers() {
    let mut functions = vec!["main", "run_sites", "run_batch", LEAK_SITE];
    functions.extend(SITES);
    assert_frame_pointers(binary(), &functions, false);
}

#[test]
fn every_allocation_splits_by_site_as_the_program_counted() {
    let _serial = serial();
    assert_built_without_frame_pointers();
    let daemon = Daemon::start(&["--alloc-sample-bytes", "0", "--alloc-budget-percent", NO_BUDGET]);
    let mut workload = AllocSites::start(Options::all(FOREVER, EXACT_LEAK_PER_S, EXACT_SITES_PER_S));
    workload.wait_until_run(WARM_UP);
    let window = observe(&daemon, &mut workload, EXACT_WINDOW, "every-allocation");
    let profile = &window.profile;
    let delta = &window.delta;
    profile.assert_heap_sample_types();
    // Every allocation is a sample of its own weight: no sampling period to
    // speak of (Go writes 1 for MemProfileRate=1; 0 says "none" as well).
    assert!(
        matches!(profile.period, 0 | 1),
        "with --alloc-sample-bytes 0 the period should be 0 or 1 (every allocation), got {}",
        profile.period
    );
    assert_labels(profile, workload.pid());
    assert_space_is_objects_times_size(profile, true);

    // Nothing allocates outside the sites while the window is open (the
    // program writes its stats without stdio): a stack without a site is
    // one whose leaf the daemon lost.
    let total = profile.sum(ALLOC_SPACE, |_| true);
    let lost = profile.at_site(ALLOC_SPACE, NO_SITE);
    assert!(
        total > 0 && lost as f64 <= 0.01 * total as f64,
        "at most 1 % of alloc_space should be outside the site_* functions (alloc_sites allocates nowhere else); \
         got {lost} of {total} bytes: {:?}",
        profile.by_site(ALLOC_SPACE)
    );

    // The split: the window's shares against the program's own over an
    // interval a little longer (from before the request to after the
    // answer). The program allocates at a steady pace, so the shares of
    // the two agree far closer than 3 points.
    let expected = SITES.map(|site| delta.bytes(site) as f64);
    assert_site_shares(
        "alloc_space per site, every allocation recorded",
        &profile.sites(ALLOC_SPACE),
        &expected,
        3.0,
    );

    // In use at the end: the leak, and the few blocks the other sites keep
    // live at any time (at most `max_outstanding_bytes`).
    let inuse = profile.sum(INUSE_SPACE, |_| true);
    let leak_inuse = profile.at_site(INUSE_SPACE, LEAK_SITE);
    let others_inuse = inuse - leak_inuse;
    assert!(
        leak_inuse as f64 >= 0.9 * inuse as f64,
        "at least 90 % of inuse_space should be at {LEAK_SITE}, got {leak_inuse} of {inuse} bytes: {:?}",
        profile.by_site(INUSE_SPACE)
    );
    let max_outstanding = workload.stats().max_outstanding_bytes();
    assert!(
        others_inuse <= max_outstanding as i64,
        "the non-leaking sites keep at most {max_outstanding} bytes live at any time, so at most that is \
         in use at the end of the window (a free the daemon missed leaves more); got {others_inuse} bytes: {:?}",
        profile.by_site(INUSE_SPACE)
    );
    // Nothing of the leak is ever freed.
    let leak_alloc = profile.at_site(ALLOC_SPACE, LEAK_SITE);
    assert!(
        leak_inuse as f64 >= 0.99 * leak_alloc as f64,
        "{LEAK_SITE} never frees: its inuse_space should equal its alloc_space ({leak_alloc} bytes), got {leak_inuse}"
    );
    // The leak's size. The program's interval holds the window, so the
    // window cannot have seen more than the program leaked in it; and the
    // program leaks at a steady rate, so the window's N seconds hold that
    // rate times N, within 10 % (the daemon's window is N seconds of
    // attached probes, give or take their attaching and detaching).
    let leaked_in_interval = delta.bytes(LEAK_SITE);
    assert!(
        leak_inuse <= leaked_in_interval as i64,
        "inuse_space at {LEAK_SITE} ({leak_inuse} bytes) cannot exceed what the program leaked over an interval \
         that holds the window ({leaked_in_interval} bytes in {:.3} s)",
        delta.elapsed.as_secs_f64()
    );
    let expected_leak = delta.rate(LEAK_SITE) * window.seconds as f64;
    assert_within(
        &format!("inuse_space at {LEAK_SITE} over the {}-s window", window.seconds),
        leak_inuse as f64,
        expected_leak,
        0.10,
    );

    // Stacks: the leaf is the site itself (the function malloc returned
    // to), and the unwinder reaches main through code without frame
    // pointers.
    let site_objects = profile.sum(ALLOC_OBJECTS, |sample| site_of(&sample.functions).is_some());
    let leaf_is_site = profile.sum(ALLOC_OBJECTS, |sample| {
        site_of(&sample.functions)
            .is_some_and(|site| sample.functions.first().is_some_and(|leaf| leaf == site))
    });
    assert!(
        leaf_is_site as f64 >= 0.99 * site_objects as f64,
        "the leaf frame should be the site that called the allocator for at least 99 % of the site allocations; \
         got {leaf_is_site} of {site_objects}; e.g. {:?}",
        profile
            .samples
            .iter()
            .find(|sample| site_of(&sample.functions).is_some_and(|site| sample.functions[0] != site))
            .map(|sample| &sample.functions)
    );
    let reach_main = profile.sum(ALLOC_OBJECTS, |sample| {
        site_of(&sample.functions).is_some() && sample.functions.iter().any(|function| function == "main")
    });
    assert!(
        reach_main as f64 >= 0.99 * site_objects as f64,
        "at least 99 % of the site allocations should have stacks that reach main (site -> run_batch -> \
         run_sites -> main, no frame pointers); got {reach_main} of {site_objects}; e.g. {:?}",
        profile
            .samples
            .iter()
            .find(|sample| !sample.functions.iter().any(|function| function == "main"))
            .map(|sample| &sample.functions)
    );
}

#[test]
fn sampled_at_512_kib_estimates_the_leak() {
    let _serial = serial();
    let daemon = Daemon::start(&["--alloc-budget-percent", NO_BUDGET]);
    let mut workload = AllocSites::start(Options::all(FOREVER, SAMPLED_LEAK_PER_S, SAMPLED_SITES_PER_S));
    workload.wait_until_run(WARM_UP);
    let window = observe(&daemon, &mut workload, SAMPLED_WINDOW, "sampled");
    let profile = &window.profile;
    let delta = &window.delta;
    profile.assert_heap_sample_types();
    assert_eq!(
        profile.period, DEFAULT_SAMPLE_BYTES,
        "the period should be the default sampling interval, 512 KiB"
    );
    assert_labels(profile, workload.pid());
    assert_space_is_objects_times_size(profile, false);

    // How many allocations were sampled at the leak: Go's scaling
    // multiplies each sampled one by 1/(1 - exp(-size/period)).
    let sampled_leak: f64 = profile
        .samples
        .iter()
        .filter(|sample| site_of(&sample.functions) == Some(LEAK_SITE))
        .map(|sample| {
            let size = bytes_label(sample).unwrap_or(0) as f64;
            let scale = 1.0 / (1.0 - (-size / DEFAULT_SAMPLE_BYTES as f64).exp());
            profile.value(sample, INUSE_OBJECTS) as f64 / scale
        })
        .sum();
    eprintln!("~{sampled_leak:.0} allocations sampled at {LEAK_SITE}");
    assert!(
        sampled_leak >= 100.0,
        "the window should hold at least 100 sampled allocations at {LEAK_SITE} (~1,280 expected: \
         {} MiB/s for {} s at one per 512 KiB), or the 10 % bound means nothing; got ~{sampled_leak:.0}",
        SAMPLED_LEAK_PER_S / MIB,
        window.seconds
    );

    // The estimate of the leak: the program leaks at a steady rate, the
    // window's N seconds hold that rate times N.
    let expected_leak = delta.rate(LEAK_SITE) * window.seconds as f64;
    assert_within(
        &format!(
            "scaled inuse_space at {LEAK_SITE} over the {}-s window",
            window.seconds
        ),
        profile.at_site(INUSE_SPACE, LEAK_SITE) as f64,
        expected_leak,
        0.10,
    );
    // The scaled totals estimate the true bytes (~5,000 samples: 1.4 %
    // standard error).
    let sites_alloc: f64 = profile.sites(ALLOC_SPACE).iter().sum();
    assert_within(
        "scaled alloc_space of the four non-leaking sites",
        sites_alloc,
        delta.sites_rate() * window.seconds as f64,
        0.10,
    );
    let expected = SITES.map(|site| delta.bytes(site) as f64);
    assert_site_shares(
        "scaled alloc_space per site, sampled at 512 KiB",
        &profile.sites(ALLOC_SPACE),
        &expected,
        5.0,
    );
}

#[test]
fn dhat_agrees_on_the_site_ratios() {
    // Not the daemon: the oracle. DHAT intercepts every allocation of the
    // program and says how many bytes each stack asked for; the program's
    // own counts must be the same.
    let _serial = serial();
    let (dhat, stats) = run_under_dhat(Options::all(2.5, EXACT_LEAK_PER_S, EXACT_SITES_PER_S));
    let dhat_sites = SITES.map(|site| dhat.bytes.get(site).copied().unwrap_or(0) as f64);
    let program_sites = SITES.map(|site| stats.bytes(site) as f64);
    assert!(
        program_sites.iter().all(|&bytes| bytes > 0.0),
        "alloc_sites under valgrind should have allocated at every site; its stats: {stats:?}"
    );
    assert_site_shares(
        "DHAT's bytes per site against the program's counts",
        &dhat_sites,
        &program_sites,
        3.0,
    );
    // Closer still: every count is the same.
    for site in SITES.iter().chain(&[LEAK_SITE]) {
        let dhat_bytes = dhat.bytes.get(*site).copied().unwrap_or(0);
        let dhat_blocks = dhat.blocks.get(*site).copied().unwrap_or(0);
        assert_eq!(
            (dhat_bytes, dhat_blocks),
            (stats.bytes(site), stats.calls(site)),
            "DHAT's (bytes, blocks) at {site} should be the program's own (bytes, calls); DHAT's per site: {:?}",
            dhat.bytes
        );
    }
    assert_eq!(
        dhat.bytes.get(CHURN_SITE),
        None,
        "nothing allocates at {CHURN_SITE} in the \"all\" mode"
    );
}

#[test]
fn no_probe_is_left_after_the_window_or_a_sigkill() {
    let _serial = serial();
    let mut daemon = Daemon::start(&[]);
    let mut workload = AllocSites::start(Options::all(FOREVER, LIGHT_LEAK_PER_S, LIGHT_SITES_PER_S));
    workload.wait_until_run(WARM_UP);
    let pid = workload.pid();
    let daemon_pid = daemon.pid();
    assert_eq!(
        breakpoints(pid),
        Vec::<String>::new(),
        "no allocator function of {pid} should hold a breakpoint before any window"
    );

    // A whole window: its probes go with it. The answer may come a moment
    // before the last detach completes: 2 s of grace.
    let response = daemon.get(&allocs_path(pid, 3));
    assert_eq!(
        response.status,
        200,
        "a 3-s window over {pid}: {}",
        response.text()
    );
    let probes = || (uprobes_of(daemon_pid), breakpoints(pid));
    let detached = eventually(Duration::from_secs(2), || {
        let (uprobes, breakpoints) = probes();
        (uprobes.is_empty() && breakpoints.is_empty()).then_some(())
    });
    assert!(
        detached.is_some(),
        "after the window, no uprobe should be left: the daemon still holds {:?}, breakpoints remain at {:?} in {pid}",
        uprobes_of(daemon_pid),
        breakpoints(pid)
    );

    // A long window, and the daemon killed in the middle of it.
    let request = get_in_background(daemon.url(&allocs_path(pid, 30)));
    let attached = eventually(Duration::from_secs(20), || {
        let (uprobes, breakpoints) = probes();
        (!uprobes.is_empty() && !breakpoints.is_empty()).then_some((uprobes, breakpoints))
    })
    .unwrap_or_else(|| {
        let (uprobes, breakpoints) = probes();
        panic!(
            "within 20 s of asking for a 30-s window, the daemon should hold uprobes (perf links or events \
             of type uprobe/uretprobe) and {pid} should have breakpoints at its allocator; the daemon holds \
             {uprobes:?}, the breakpoints are at {breakpoints:?}"
        )
    });
    eprintln!(
        "attached: {:?}\nbreakpoints in {pid}: {:?}",
        attached.0, attached.1
    );
    let links: Vec<u64> = attached.0.iter().filter_map(|probe| probe.link_id).collect();
    sigkill(daemon_pid);
    let killed = eventually(Duration::from_secs(10), || daemon.try_wait());
    assert!(
        killed.is_some(),
        "the daemon ({daemon_pid}) should be dead 10 s after SIGKILL"
    );
    // The kernel drops a dead process's links and breakpoints as its files
    // close; give it 10 s.
    let cleared = eventually(Duration::from_secs(10), || {
        let alive = link_ids();
        (breakpoints(pid).is_empty() && links.iter().all(|id| !alive.contains(id))).then_some(())
    });
    assert!(
        cleared.is_some(),
        "10 s after the daemon's SIGKILL, its uprobes should be gone: links {:?} of {links:?} remain, \
         breakpoints at {:?} in {pid}",
        link_ids()
            .iter()
            .filter(|id| links.contains(id))
            .collect::<Vec<_>>(),
        breakpoints(pid)
    );
    // The request ends with the daemon (a reset connection, most likely).
    let answer = request.join().expect("the request's thread");
    eprintln!("the 30-s request ended with {answer:?}");

    // The traced process never noticed: it runs and allocates at every site.
    assert!(
        workload.running(),
        "alloc_sites should still run after the daemon's SIGKILL"
    );
    let before = workload.stats();
    std::thread::sleep(Duration::from_millis(500));
    let after = workload.stats();
    for site in SITES.iter().chain(&[LEAK_SITE]) {
        assert!(
            after.calls(site) > before.calls(site),
            "alloc_sites should still allocate at {site} after the daemon's SIGKILL: {} calls, then {} \
             500 ms later",
            before.calls(site),
            after.calls(site)
        );
    }
}

#[test]
fn a_go_binary_gets_422() {
    let _serial = serial();
    let go = go_allocs();
    let daemon = Daemon::start(&[]);
    let program = Workload::spawn(go.to_str().expect("a UTF-8 path"), &["60"]);
    assert_refused(
        &daemon,
        program.pid(),
        "a Go program (its own allocator, no libc)",
    );
}

#[test]
fn a_stripped_static_binary_gets_422() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    let program = Workload::spawn(env!("WORKLOAD_NO_ALLOCATOR"), &["60"]);
    assert_refused(
        &daemon,
        program.pid(),
        "a static binary without symbols (glibc's malloc in it, unnamed)",
    );
}

#[test]
fn a_pid_that_does_not_exist_gets_404() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    // A pid just freed: its process ran and was reaped.
    let mut gone = Command::new("true").spawn().expect("running true");
    let pid = gone.id();
    gone.wait().expect("waiting for true");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "pid {pid} was reused at once; run the test again"
    );
    let response = daemon.get(&allocs_path(pid, 1));
    assert_eq!(
        response.status,
        404,
        "a window over pid {pid}, which does not exist, should be refused with 404; got {}: {}",
        response.status,
        response.text()
    );
}

#[test]
fn a_process_that_exits_during_the_window_still_gets_its_profile() {
    let _serial = serial();
    let daemon = Daemon::start(&["--alloc-sample-bytes", "0", "--alloc-budget-percent", NO_BUDGET]);
    // 5 s: a daemon's first window loads (verifies) the probes first, ~2 s.
    let mut workload = AllocSites::start(Options::all(5.0, LIGHT_LEAK_PER_S, LIGHT_SITES_PER_S));
    workload.wait_until_run(Duration::from_millis(300));
    let pid = workload.pid();
    let file = artifacts_dir().join("allocs-exits-during-window.pb.gz");
    daemon.fetch_pprof(&allocs_path(pid, 9), &file);
    assert!(
        !workload.running(),
        "alloc_sites (5 s) should have exited during the 9-s window, before the answer"
    );
    let (status, last) = workload.wait_exit(Duration::from_secs(1));
    assert!(status.success(), "alloc_sites failed: {status}");
    let profile = AllocProfile::read(&file);
    profile.assert_heap_sample_types();
    assert!(
        !profile.samples.is_empty(),
        "the profile of a process that ran ~2 s or more of a 9-s window should have samples, it has none"
    );
    let objects = profile.at_site(ALLOC_OBJECTS, "site_malloc_big");
    let calls = last.calls("site_malloc_big");
    assert!(
        objects > 0,
        "the profile should have allocations at site_malloc_big (~{} calls a second), got none; sites: {:?}",
        calls / 2,
        profile.by_site(ALLOC_OBJECTS)
    );
    assert!(
        objects <= calls as i64,
        "every allocation recorded: at most the {calls} calls the program made in its whole life at \
         site_malloc_big, got {objects}"
    );
}

/// Panics unless a window over `pid` is refused with 422 and a body that
/// says why (mentioning the allocator).
fn assert_refused(daemon: &Daemon, pid: u32, what: &str) {
    let response = daemon.get(&allocs_path(pid, 2));
    let body = response.text();
    assert_eq!(
        response.status, 422,
        "a window over {what} (pid {pid}) should be refused with 422; got {}: {body}",
        response.status
    );
    assert!(
        body.to_ascii_lowercase().contains("alloc"),
        "the 422 over {what} should say why, mentioning the allocator; its body: {body:?}"
    );
}

/// Panics unless `got` is within `fraction` of `expected`.
fn assert_within(what: &str, got: f64, expected: f64, fraction: f64) {
    let off = (got - expected).abs() / expected.max(1.0);
    eprintln!(
        "{what}: {got:.0} bytes, {expected:.0} expected ({:+.1} %)",
        100.0 * (got - expected) / expected.max(1.0)
    );
    assert!(
        off <= fraction,
        "{what}: expected {expected:.0} bytes within {:.0} %, got {got:.0} ({:+.1} %)",
        100.0 * fraction,
        100.0 * (got - expected) / expected.max(1.0)
    );
}

/// A program calling malloc and free about 2 million times a second is cut
/// off at the default budget (10% of its CPU): the answer says so, /metrics
/// counts it, no probe stays, and the program runs on.
#[test]
fn a_malloc_storm_is_cut_off_at_the_budget_and_runs_on() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    let mut workload = AllocSites::start(Options::churn(FOREVER));
    workload.wait_until_run(WARM_UP);
    let pid = workload.pid();
    let file = artifacts_dir().join("allocs-budget.pb.gz");
    let response = daemon.fetch_pprof(&allocs_path(pid, 6), &file);
    let said = response.header("profilerd-tracing-cut-short");
    assert!(
        said.contains("budget"),
        "the answer should say the tracing was cut short at the budget, header says {said:?}"
    );
    let comments = profilerd_tests::daemon::go_pprof(&["-comments", &file.display().to_string()]);
    assert!(
        comments.contains("cut short") && comments.contains("budget"),
        "the profile's comments should say the tracing was cut short at the budget: {comments:?}"
    );
    let metrics = daemon.get("/metrics").text();
    assert_eq!(
        profilerd_tests::daemon::metric(&metrics, "profilerd_alloc_traces_over_budget_total"),
        1,
        "/metrics should count one tracing stopped at its budget"
    );
    assert!(
        uprobes_of(daemon.pid()).is_empty(),
        "no probe should stay after the budget stopped the tracing: {:?}",
        uprobes_of(daemon.pid())
    );
    let before = workload.stats();
    std::thread::sleep(Duration::from_millis(500));
    let after = workload.stats();
    assert!(
        workload.running() && after.calls(CHURN_SITE) > before.calls(CHURN_SITE),
        "the program should run on after its tracing was cut off ({} then {} calls)",
        before.calls(CHURN_SITE),
        after.calls(CHURN_SITE)
    );
}

// ---------------------------------------------------------------------------
// Other languages' allocators, and a container's own libc.

/// Allocations a second at each function of the Rust and C++ workloads
/// (tests/workloads/rust_allocs.rs, cxx_allocs.cpp): 2,000 rounds of one
/// block each.
const PAIR_ROUNDS_PER_S: i64 = 2000;
/// Their window: ~10,000 allocations at each function, every one recorded.
const PAIR_WINDOW: i64 = 5;
/// The bytes of each function's block, in the order of its sites: 12 KiB
/// and 4 KiB, 3:1.
const PAIR_BYTES: [i64; 2] = [12 * 1024, 4 * 1024];
const RUST_SITES: [&str; 2] = ["rust_site_vec", "rust_site_box"];
const CXX_SITES: [&str; 2] = ["cxx_site_array", "cxx_site_struct"];

/// A Rust release build without frame pointers, on std's system allocator:
/// a Vec (malloc) and a Box of a zeroed struct (which LLVM turns into
/// __rust_alloc_zeroed, so calloc) reach libc through std's __rust_alloc
/// shims. Both functions are found in the stacks, with the bytes and the
/// 3:1 split the program allocates, frees seen, and stacks that reach main.
#[test]
fn a_rust_program_with_the_system_allocator() {
    let _serial = serial();
    let daemon = Daemon::start(&["--alloc-sample-bytes", "0", "--alloc-budget-percent", NO_BUDGET]);
    let program = Workload::spawn(env!("WORKLOAD_RUST_ALLOCS"), &["120"]);
    std::thread::sleep(WARM_UP);
    let profile = observe_pair(&daemon, program.pid(), "rust_allocs");
    check_pair(&profile, program.pid(), "rust_allocs", &RUST_SITES);
    // Between malloc and the function that asked: the alloc crate's
    // (Vec::with_capacity -> RawVec..., Box::new -> box_new_uninit, inlined
    // into the site, named from its DWARF) and std's __rust_alloc ->
    // __rdl_alloc shims (tail calls at -O3: not in the stacks), nothing else.
    assert_leaf_side(
        &profile,
        &RUST_SITES,
        "frames of Rust's alloc crate or its __rust_alloc/__rdl_alloc shims",
        |frame| {
            frame.starts_with("alloc::")
                || frame.starts_with("<alloc::")
                || frame.contains("__rust_alloc")
                || frame.contains("__rdl_alloc")
        },
    );
    assert_reach_main(&profile, &RUST_SITES, "rust_alloc_loop");
}

/// C++ new and delete (-O2, no frame pointers; libstdc++ has none either):
/// malloc's caller is libstdc++'s `operator new(unsigned long)` (new[]
/// jumps to it), and the function that said `new` is right below it.
#[test]
fn a_cxx_program_using_new_and_delete() {
    let _serial = serial();
    let binary = env!("WORKLOAD_CXX_ALLOCS");
    assert_frame_pointers(
        binary,
        &["main", "cxx_alloc_loop", "cxx_site_array", "cxx_site_struct"],
        false,
    );
    let daemon = Daemon::start(&["--alloc-sample-bytes", "0", "--alloc-budget-percent", NO_BUDGET]);
    let program = Workload::spawn(binary, &["120"]);
    std::thread::sleep(WARM_UP);
    let profile = observe_pair(&daemon, program.pid(), "cxx_allocs");
    check_pair(&profile, program.pid(), "cxx_allocs", &CXX_SITES);
    // The leaf is operator new (demangled: "operator new(unsigned long)",
    // or operator new[] should it not be a jump), nothing else.
    let leaf_is_new = profile.sum(ALLOC_OBJECTS, |sample| {
        sample
            .functions
            .first()
            .is_some_and(|leaf| leaf.starts_with("operator new"))
    });
    let total = profile.sum(ALLOC_OBJECTS, |_| true);
    assert!(
        leaf_is_new as f64 >= 0.99 * total as f64,
        "the leaf of at least 99 % of the allocations should be `operator new` (malloc's caller in \
         libstdc++), got {leaf_is_new} of {total}; leaves: {:?}",
        leaves(&profile)
    );
    assert_leaf_side(&profile, &CXX_SITES, "operator new frames", |frame| {
        frame.starts_with("operator new")
    });
    assert_reach_main(&profile, &CXX_SITES, "cxx_alloc_loop");
}

/// A process of another root file system, mount namespace and pid
/// namespace: alloc_sites run inside the booted Debian container (nsenter
/// into its PID 1's namespaces), mapping the container's own libc, a file
/// of its own (another inode than the host's libc at the same path). The
/// daemon on the host, asked for its host pid, must probe that file (its
/// /proc/PID/map_files entry), not the host's file of the same name (whose
/// probes would never fire in it), and symbolize alloc_sites from the
/// container's copy. The sites' shares match the program's own counts,
/// read from its stats file in the container's /tmp through the
/// container's root as the host sees it.
#[test]
fn a_process_in_a_container_is_traced_through_its_own_libc() {
    let _serial = serial();
    // One container per machine at a time (the systemd tests' lock).
    let _machine_lock = FileLock::acquire(&Path::new(CACHE).join("systemd-test.lock"));
    let rootfs = cached_rootfs();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository root");
    let container = Container::boot(&rootfs, repo, &profilerd_bin());
    let daemon = Daemon::start(&["--alloc-sample-bytes", "0", "--alloc-budget-percent", NO_BUDGET]);
    let mut workload = AllocSites::start_in_container(
        &container,
        Options::all(FOREVER, EXACT_LEAK_PER_S, EXACT_SITES_PER_S),
    );
    workload.wait_until_run(WARM_UP);
    let pid = workload.pid();

    // What makes it another world: its namespaces, and its libc.
    for namespace in ["pid", "mnt"] {
        let ours = std::fs::read_link(format!("/proc/self/ns/{namespace}")).expect("our namespace");
        let its = std::fs::read_link(format!("/proc/{pid}/ns/{namespace}")).expect("its namespace");
        assert_ne!(
            ours, its,
            "alloc_sites in the container should be in a {namespace} namespace of its own"
        );
    }
    let libc = mapped_libc(pid);
    let file = |path: &Path| {
        let metadata = std::fs::metadata(path).unwrap_or_else(|err| panic!("stat {}: {err}", path.display()));
        (metadata.dev(), metadata.ino())
    };
    let its_libc = file(&libc.map_files);
    let host_libc = file(Path::new(&libc.path));
    eprintln!(
        "alloc_sites {pid} in the container maps {} as (dev, inode) {its_libc:?}; the host's file of that \
         name is {host_libc:?}",
        libc.path
    );
    assert_ne!(
        its_libc, host_libc,
        "the container's libc {} should be another file than the host's of the same path",
        libc.path
    );

    let window = observe(&daemon, &mut workload, EXACT_WINDOW, "container");
    let profile = &window.profile;
    profile.assert_heap_sample_types();
    assert_labels(profile, pid);
    assert_space_is_objects_times_size(profile, true);
    let total = profile.sum(ALLOC_SPACE, |_| true);
    let lost = profile.at_site(ALLOC_SPACE, NO_SITE);
    assert!(
        total > 0 && lost as f64 <= 0.01 * total as f64,
        "the window over alloc_sites in the container should have allocations, at most 1 % of them \
         outside the site_* functions; got {lost} of {total} bytes: {:?}",
        profile.by_site(ALLOC_SPACE)
    );
    let expected = SITES.map(|site| window.delta.bytes(site) as f64);
    assert_site_shares(
        "alloc_space per site of alloc_sites in the container, every allocation recorded",
        &profile.sites(ALLOC_SPACE),
        &expected,
        5.0,
    );
    assert!(
        profile.at_site(INUSE_SPACE, LEAK_SITE) > 0,
        "{LEAK_SITE}, which never frees, should hold bytes in use at the end of the window: {:?}",
        profile.by_site(INUSE_SPACE)
    );
}

/// A window of [`PAIR_WINDOW`] seconds over `pid`, saved as
/// allocs-NAME.pb.gz.
fn observe_pair(daemon: &Daemon, pid: u32, name: &str) -> AllocProfile {
    let file = artifacts_dir().join(format!("allocs-{name}.pb.gz"));
    daemon.fetch_pprof(&allocs_path(pid, PAIR_WINDOW as u64), &file);
    AllocProfile::read(&file)
}

/// What the Rust and C++ workloads share: a heap profile of every
/// allocation of one thread, each of `sites` in the stacks with its own
/// block size, their bytes split 3:1 within 5 points, all but 1 % of the
/// bytes at them, and their blocks freed.
fn check_pair(profile: &AllocProfile, pid: u32, comm: &str, sites: &[&str; 2]) {
    profile.assert_heap_sample_types();
    assert!(
        matches!(profile.period, 0 | 1),
        "with --alloc-sample-bytes 0 the period should be 0 or 1 (every allocation), got {}",
        profile.period
    );
    assert_labels_of(profile, pid, comm);
    assert_space_is_objects_times_size(profile, true);
    let expected_objects = PAIR_ROUNDS_PER_S * PAIR_WINDOW;
    for (site, bytes) in sites.iter().zip(PAIR_BYTES) {
        let objects = profile.under(ALLOC_OBJECTS, site);
        let space = profile.under(ALLOC_SPACE, site);
        eprintln!("{comm}: {objects} allocations, {space} bytes under {site}");
        // The program keeps the pace of wall time: the window's N seconds
        // of attached probes hold N seconds of its rounds, within 10 %.
        assert!(
            (objects - expected_objects).abs() as f64 <= 0.1 * expected_objects as f64,
            "{}: {expected_objects} allocations ({PAIR_ROUNDS_PER_S} a second for {PAIR_WINDOW} s) within \
             10 % should have {site} in their stacks, got {objects}; leaves: {:?}",
            profile.file.display(),
            leaves(profile)
        );
        assert_eq!(
            space,
            objects * bytes,
            "{}: every allocation under {site} is one block of {bytes} bytes",
            profile.file.display()
        );
        let inuse = profile.under(INUSE_OBJECTS, site);
        assert!(
            inuse as f64 <= 0.01 * objects as f64,
            "{}: {site} frees each block right after allocating it, so at most 1 % of its {objects} blocks \
             can be in use at the window's end (a free the daemon missed leaves more); got {inuse}",
            profile.file.display()
        );
    }
    let total = profile.sum(ALLOC_SPACE, |_| true);
    let at_sites: i64 = sites.iter().map(|site| profile.under(ALLOC_SPACE, site)).sum();
    assert!(
        at_sites as f64 >= 0.99 * total as f64,
        "{}: nothing but {sites:?} allocates in {comm}'s loop: at least 99 % of alloc_space should be \
         under them, got {at_sites} of {total} bytes; leaves: {:?}",
        profile.file.display(),
        leaves(profile)
    );
    let got = sites.map(|site| profile.under(ALLOC_SPACE, site) as f64);
    assert_shares(
        &format!("{comm}: alloc_space of its two functions, every allocation recorded"),
        sites,
        &got,
        &PAIR_BYTES.map(|bytes| bytes as f64),
        5.0,
    );
}

/// Panics unless, in at least 99 % of the allocations under `sites`, every
/// frame on the leaf side of the site (between the allocator and it)
/// satisfies `allowed`: the site is the first frame of the program.
fn assert_leaf_side(profile: &AllocProfile, sites: &[&str], what: &str, allowed: impl Fn(&str) -> bool) {
    let site_position = |functions: &[String]| {
        functions
            .iter()
            .position(|frame| sites.iter().any(|site| is_function(frame, site)))
    };
    let under = profile.sum(ALLOC_OBJECTS, |sample| site_position(&sample.functions).is_some());
    let good = profile.sum(ALLOC_OBJECTS, |sample| {
        site_position(&sample.functions)
            .is_some_and(|at| sample.functions[..at].iter().all(|frame| allowed(frame)))
    });
    let mut chains: BTreeMap<String, i64> = BTreeMap::new();
    for sample in &profile.samples {
        if let Some(at) = site_position(&sample.functions) {
            *chains.entry(sample.functions[..=at].join(" <- ")).or_default() +=
                profile.value(sample, ALLOC_OBJECTS);
        }
    }
    eprintln!("{}: leaf side of the sites: {chains:#?}", profile.file.display());
    assert!(
        good as f64 >= 0.99 * under as f64,
        "{}: in at least 99 % of the allocations under {sites:?}, the frames between the allocator and \
         the site should be {what} only; got {good} of {under}; leaf-first chains: {chains:#?}",
        profile.file.display()
    );
}

/// Panics unless at least 99 % of the allocations under `sites` have stacks
/// through `caller` to main (unwound without frame pointers).
fn assert_reach_main(profile: &AllocProfile, sites: &[&str], caller: &str) {
    let under = |sample: &RawSample| {
        sample
            .functions
            .iter()
            .any(|frame| sites.iter().any(|site| is_function(frame, site)))
    };
    let total = profile.sum(ALLOC_OBJECTS, under);
    let whole = profile.sum(ALLOC_OBJECTS, |sample| {
        under(sample)
            && sample.functions.iter().any(|frame| is_function(frame, caller))
            && sample.functions.iter().any(|frame| frame == "main")
    });
    assert!(
        whole as f64 >= 0.99 * total as f64,
        "{}: at least 99 % of the allocations under {sites:?} should have stacks through {caller} to main \
         (no frame pointers: .eh_frame unwinding); got {whole} of {total}; e.g. {:?}",
        profile.file.display(),
        profile
            .samples
            .iter()
            .find(|sample| under(sample) && !sample.functions.iter().any(|frame| frame == "main"))
            .map(|sample| &sample.functions)
    );
}

/// alloc_objects per leaf frame (the function that called the allocator).
fn leaves(profile: &AllocProfile) -> BTreeMap<String, i64> {
    let mut leaves = BTreeMap::new();
    for sample in &profile.samples {
        let leaf = sample.functions.first().cloned().unwrap_or_default();
        *leaves.entry(leaf).or_insert(0) += profile.value(sample, ALLOC_OBJECTS);
    }
    leaves
}

/// A process named in `--alloc-trace-comm` is traced while it runs: its
/// heap (what it allocated since its tracing began and has not freed) is at
/// `/debug/pprof/heap?pid=P`, at once, with its leak where it leaks; a
/// process not named gets 404 there, saying how to trace it.
#[test]
fn a_process_named_for_tracing_has_its_heap() {
    let _serial = serial();
    let daemon = Daemon::start(&[
        "--alloc-trace-comm",
        "alloc_sites",
        "--alloc-sample-bytes",
        "0",
        "--alloc-budget-percent",
        NO_BUDGET,
    ]);
    let mut workload = AllocSites::start(Options::all(FOREVER, LIGHT_LEAK_PER_S, LIGHT_SITES_PER_S));
    workload.wait_until_run(WARM_UP);
    let pid = workload.pid();
    let path = format!("/debug/pprof/heap?pid={pid}");
    wait_until_traced(&daemon, pid);
    let before = workload.stats();
    std::thread::sleep(Duration::from_secs(4));
    let file = artifacts_dir().join("heap-by-name.pb.gz");
    daemon.fetch_pprof(&path, &file);
    let after = workload.stats();
    let profile = AllocProfile::read(&file);
    profile.assert_heap_sample_types();
    let comments = profilerd_tests::daemon::go_pprof(&["-comments", &file.display().to_string()]);
    assert!(
        comments.contains("in use = allocated since"),
        "the heap profile should say since when its blocks were allocated: {comments:?}"
    );
    let leaked = profile.at_site(INUSE_SPACE, LEAK_SITE);
    let in_use = profile.sum(INUSE_SPACE, |_| true);
    assert!(
        leaked as f64 >= 0.9 * in_use as f64,
        "the leak should hold >= 90% of what is in use, {leaked} of {in_use} bytes"
    );
    // Traced since before `before`, until after `after` was read: the leak
    // in between is in the heap, and never more than the program leaked.
    let between = after.bytes(LEAK_SITE) - before.bytes(LEAK_SITE);
    assert!(
        leaked as u64 >= between * 95 / 100 && leaked as u64 <= after.bytes(LEAK_SITE),
        "in use at {LEAK_SITE}: {leaked} bytes, expected at least the {between} leaked in the last 4 s \
         and at most the {} leaked in the program's life",
        after.bytes(LEAK_SITE)
    );
    let untraced = daemon.get(&format!("/debug/pprof/heap?pid={}", std::process::id()));
    assert_eq!(untraced.status, 404, "a process not named: {}", untraced.text());
    assert!(
        untraced.text().contains("alloc_trace_comms"),
        "the 404 should say how to trace it: {}",
        untraced.text()
    );
    assert_eq!(
        daemon.get("/debug/pprof/heap").status,
        404,
        "no pid: the 404 scrapers get"
    );
}
