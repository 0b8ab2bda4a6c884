//! Whole user stacks without frame pointers (issue 11): workloads built the
//! way distributions and release builds are, sampled by the daemon with its
//! default settings and, at the same time, by `perf record --call-graph
//! dwarf` (the oracle). Each test first checks that perf sees the expected
//! stacks (else the workload is wrong), then that the daemon does.

use std::time::Duration;

use profilerd_tests::{
    Workload,
    daemon::Daemon,
    hostile::metric_sum,
    serial,
    stacks::{Stack, Stacks, disagreements, side_by_side},
    unwind::{Bar, Window, assert_frame_pointers, daemon_stacks, warm_up},
};

/// The daemon's default frequency.
const DAEMON_HZ: u64 = 99;
/// Seconds each window lasts: ~600 samples of a busy workload at 99 Hz.
const WINDOW: u64 = 6;
/// Long enough to outlive any test however slow the machine; killed on drop.
const FOREVER: &str = "600";

fn everything(_: &Stack) -> bool {
    true
}

/// Starts `binary`, lets it warm up, samples it with the daemon and perf,
/// and checks `bar` against both.
fn check_workload(binary: &str, name: &str, bar: &Bar) {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    let workload = Workload::spawn(binary, &[FOREVER]);
    warm_up(&[workload.pid()]);
    let window = Window::observe(&daemon, &[workload.pid()], WINDOW, true);
    let perf = window.perf_of(workload.pid(), name);
    bar.check_oracle(&perf);
    let daemon_stacks = window.daemon_of(workload.pid(), name, DAEMON_HZ);
    bar.check_daemon(daemon_stacks);
}

#[test]
fn cxx_without_frame_pointers_reaches_main_through_every_named_function() {
    let binary = env!("WORKLOAD_CXX_SORT");
    assert_frame_pointers(binary, &["main", "level_one", "level_two", "level_three"], false);
    // All its time is under level_three (std::sort and the refill before it).
    check_workload(
        binary,
        "cxx_sort",
        &Bar {
            what: "samples of cxx_sort",
            among: &everything,
            chain: &["main", "level_one", "level_two", "level_three"],
            min_percent: 99.0,
        },
    );
}

#[test]
fn rust_release_build_without_frame_pointers_reaches_main() {
    // All its time is under rust_hot_path: its loop around it only reads
    // the clock once per call.
    check_workload(
        env!("WORKLOAD_RUST_NOFP"),
        "rust_nofp",
        &Bar {
            what: "samples of rust_nofp",
            among: &everything,
            chain: &[
                "main",
                "rust_nofp::rust_stage_one",
                "rust_nofp::rust_stage_two",
                "rust_nofp::rust_hot_path",
            ],
            min_percent: 99.0,
        },
    );
}

#[test]
fn signal_handler_stacks_cross_the_signal_frame() {
    let binary = env!("WORKLOAD_SIGALRM");
    assert_frame_pointers(
        binary,
        &["main", "interrupted_loop", "alarm_handler", "hot_in_handler"],
        false,
    );
    // The kernel's signal frame (__restore_rt) sits between the handler and
    // the function it interrupted; not named in the chain, as perf names it
    // [unknown] (it looks the return address up one byte early).
    check_workload(
        binary,
        "sigalrm",
        &Bar {
            what: "samples in hot_in_handler",
            among: &|stack: &Stack| stack.leaf() == Some("hot_in_handler"),
            chain: &["main", "interrupted_loop", "alarm_handler", "hot_in_handler"],
            min_percent: 95.0,
        },
    );
}

#[test]
fn frame_pointer_binary_through_a_library_without_them_and_back() {
    let binary = env!("WORKLOAD_FP_CALLBACK");
    assert_frame_pointers(binary, &["main", "fp_caller", "fp_callback"], true);
    assert_frame_pointers(env!("WORKLOAD_NOFP_CALLBACK"), &["lib_walk", "lib_inner"], false);
    check_workload(
        binary,
        "fp_callback",
        &Bar {
            what: "samples in fp_callback",
            among: &|stack: &Stack| stack.leaf() == Some("fp_callback"),
            chain: &["main", "fp_caller", "lib_walk", "lib_inner", "fp_callback"],
            min_percent: 99.0,
        },
    );
}

/// Functions compared by inclusive share: the first 10 of these workloads
/// are their root chains, ~100% in any whole stack, so the next ten (std's
/// sorting, hashing, formatting) are where unwinding differences show.
const TOP: usize = 20;
/// Percentage points.
const AGREEMENT: f64 = 3.0;

#[test]
fn top_functions_agree_with_perf_dwarf_unwinding() {
    let _serial = serial();
    // 999 Hz: at 99 Hz a 10 s window holds ~700 samples of each workload,
    // whose sampling error alone (~1.7 points on a 30% share) would make a
    // 3-point agreement a coin toss; at 999 Hz it is ~0.6.
    let daemon = Daemon::start(&["--frequency", "999"]);
    let cxx = Workload::spawn(env!("WORKLOAD_CXX_SORT"), &[FOREVER]);
    let rust = Workload::spawn(env!("WORKLOAD_RUST_NOFP"), &[FOREVER]);
    warm_up(&[cxx.pid(), rust.pid()]);
    let window = Window::observe(&daemon, &[cxx.pid(), rust.pid()], 10, true);
    let mut failures = String::new();
    for (workload, name) in [(&cxx, "cxx_sort"), (&rust, "rust_nofp")] {
        let perf = window.perf_of(workload.pid(), name).inclusive();
        let ours = window.daemon_of(workload.pid(), name, 999).inclusive();
        let table = side_by_side(&ours, &perf, TOP);
        eprintln!("{name}: inclusive %, profilerd then perf:\n{table}");
        let differ = disagreements(&ours, &perf, TOP, AGREEMENT);
        if !differ.is_empty() {
            failures.push_str(&format!(
                "{name}: these differ by more than {AGREEMENT} points (function, profilerd %, perf %): \
                 {differ:?}\nthe top {TOP} of each, profilerd then perf:\n{table}\n"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "the top {TOP} functions by inclusive share should agree with perf's dwarf unwinding within \
         {AGREEMENT} points:\n{failures}"
    );
}

/// `split` (built with frame pointers, tests/build.rs) in the daemon run with
/// `args`: every sample of it reaches main through middle.
fn frame_pointer_workload_reaches_main_always(args: &[&str]) {
    let _serial = serial();
    let daemon = Daemon::start(args);
    let split = Workload::spawn(env!("WORKLOAD_SPLIT"), &[FOREVER]);
    warm_up(&[split.pid()]);
    let window = Window::observe(&daemon, &[split.pid()], WINDOW, false);
    let stacks: &Stacks = window.daemon_of(split.pid(), "split", DAEMON_HZ);
    Bar {
        what: "samples of split (frame pointers everywhere)",
        among: &everything,
        chain: &["main", "middle"],
        min_percent: 100.0,
    }
    .check_daemon(stacks);
}

#[test]
fn frame_pointer_workload_still_reaches_main_in_every_sample() {
    frame_pointer_workload_reaches_main_always(&[]);
}

#[test]
fn frame_pointers_mode_still_starts_and_walks_frame_pointers() {
    frame_pointer_workload_reaches_main_always(&["--unwind", "frame-pointers"]);
}

#[test]
fn frame_pointers_mode_does_not_unwind_code_without_frame_pointers() {
    // The contrast that shows the flag is obeyed: without tables the C++
    // workload's stacks end where its frame pointers would have been.
    let _serial = serial();
    let daemon = Daemon::start(&["--unwind", "frame-pointers"]);
    let cxx = Workload::spawn(env!("WORKLOAD_CXX_SORT"), &[FOREVER]);
    warm_up(&[cxx.pid()]);
    // A window that holds enough of its CPU time however busy the machine.
    let window = Window::observe(&daemon, &[cxx.pid()], WINDOW, false);
    let stacks = &window.daemon[&cxx.pid()];
    let whole = stacks.share(|stack| stack.has_chain(&["main", "level_one", "level_two", "level_three"]));
    assert!(
        stacks.total() >= 100 && whole < 50.0,
        "with --unwind frame-pointers, cxx_sort (no frame pointers) cannot be walked whole; \
         {whole:.1}% of {} samples were:\n{}",
        stacks.total(),
        stacks.offending(|_| false, 5)
    );
}

#[test]
fn a_stack_deeper_than_the_limit_is_kept_with_the_frames_found() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    let workload = Workload::spawn(env!("WORKLOAD_DEEP_RECURSION"), &[FOREVER]);
    warm_up(&[workload.pid()]);
    let before = daemon.get("/metrics").text();
    std::thread::sleep(Duration::from_secs(WINDOW));
    let after = daemon.get("/metrics").text();
    let stacks = daemon_stacks(&daemon, workload.pid(), WINDOW);
    assert!(
        stacks.total() >= 50,
        "expected deep_recursion to be sampled, got {} samples",
        stacks.total()
    );
    // 254 frames kept (MAX_USER_DEPTH: the 127 past the kernel's limit in
    // the tails map): the leaf (or a clock read under it) and ~253 descend.
    let deep = |stack: &Stack| {
        let descents = stack.frames.iter().filter(|frame| *frame == "descend").count();
        (247..=254).contains(&descents) && stack.frames.len() <= 254
    };
    let share = stacks.share(deep);
    assert!(
        share >= 95.0,
        "expected >= 95% of deep_recursion's stacks to hold the deepest 254 frames (247+ descend), \
         got {share:.1}%:\n{}",
        stacks.offending(deep, 5)
    );
    assert_eq!(
        stacks.reaching_main(),
        0.0,
        "main is 300 frames down: no stack can reach it"
    );
    let series = "profilerd_unwind_walks_total{end=\"depth_limit\"}";
    let grown = metric_sum(&after, series).unwrap_or(0.0) - metric_sum(&before, series).unwrap_or(0.0);
    assert!(
        grown >= stacks.total() as f64 * 0.8,
        "each truncated walk should be counted under {series}: +{grown} for {} samples",
        stacks.total()
    );
}
