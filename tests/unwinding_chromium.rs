//! A very large real binary under the unwinder (issue 11): the installed
//! Chromium, headless, rendering a generated page for a few seconds. Its
//! tables (its own and its ~110 libraries') are built and loaded within the
//! memory limit; with the limit below what they need, the daemon evicts,
//! counts, keeps sampling, and another workload's stacks stay whole.
//!
//! Debian's chromium is a mixed binary: frame pointers in nearly all of its
//! 236 MB of code and unwind tables (`.eh_frame`) for only ~8,900 functions;
//! its libraries have tables and no frame pointers. Whole stacks need both.

use std::time::{Duration, Instant};

use profilerd_tests::{
    Workload,
    chromium::{BINARY, Chromium, fde_count, starts_at_an_entry, write_page},
    cpu::{CpuMeter, Expected},
    daemon::Daemon,
    hostile::metric_sum,
    parse_folded, serial,
    stacks::{Stacks, percent},
    unwind::{Bar, daemon_stacks, warm_up},
};

/// Rows of the page: ~5 s of rendering on this VM.
const PAGE_ROWS: usize = 60_000;
/// Chromium is killed after this, whatever it is doing.
const CHROMIUM_LIMIT: Duration = Duration::from_secs(60);
/// Below what Chromium and its libraries need (their .eh_frame describe
/// ~670k rows before merging: ~5 MiB at 8 bytes a row).
const SMALL_LIMIT_MB: u64 = 1;

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("profilerd-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// A metric that must exist: the sum of its series.
fn required(metrics: &str, name: &str) -> f64 {
    metric_sum(metrics, name).unwrap_or_else(|| {
        let ours: String = metrics
            .lines()
            .filter(|line| line.contains("unwind"))
            .map(|line| format!("  {line}\n"))
            .collect();
        panic!("/metrics has no {name}; its unwind series:\n{ours}")
    })
}

/// Total table compile time: a histogram's `_sum` or a counter.
fn compile_seconds(metrics: &str) -> f64 {
    let name = "profilerd_unwind_table_compile_seconds";
    metric_sum(metrics, &format!("{name}_sum"))
        .or_else(|| metric_sum(metrics, &format!("{name}_total")))
        .unwrap_or_else(|| required(metrics, name))
}

/// What /metrics said while Chromium ran: the peaks of the table gauges.
/// Series missing here are reported by the checks after the run, so that
/// the stacks are checked first.
#[derive(Default, Debug)]
struct Peaks {
    rows: f64,
    bytes: f64,
    /// Every (bytes, bytes_max) seen over the limit.
    over_limit: Vec<(f64, f64)>,
}

impl Peaks {
    fn look(&mut self, daemon: &Daemon) {
        let metrics = daemon.get("/metrics").text();
        let gauge = |name: &str| metric_sum(&metrics, name);
        if let Some(rows) = gauge("profilerd_unwind_table_rows") {
            self.rows = self.rows.max(rows);
        }
        if let Some(bytes) = gauge("profilerd_unwind_table_bytes") {
            self.bytes = self.bytes.max(bytes);
            if let Some(max) = gauge("profilerd_unwind_table_bytes_max")
                && bytes > max
            {
                self.over_limit.push((bytes, max));
            }
        }
    }
}

/// Runs Chromium on a generated page under `daemon`; returns its stacks in
/// the daemon (all its processes, its whole life), the CPU it was seen to
/// run, and the gauges' peaks meanwhile.
fn run_chromium(daemon: &Daemon, name: &str) -> (Stacks, Duration, Peaks) {
    let dir = scratch(name);
    let page = write_page(&dir, PAGE_ROWS);
    let mut peaks = Peaks::default();
    peaks.look(daemon);
    let started = Instant::now();
    let mut chromium = Chromium::dump_dom(&page, &dir);
    let exited = chromium.wait(CHROMIUM_LIMIT, || peaks.look(daemon));
    eprintln!(
        "chromium: {} after {:.1} s, {} processes, {:.2} s of CPU seen",
        if exited { "exited" } else { "killed" },
        started.elapsed().as_secs_f64(),
        chromium.pids().len(),
        chromium.cpu_seen().as_secs_f64()
    );
    // Its last samples drained and symbolized (each /folded drains first).
    peaks.look(daemon);
    let window = started.elapsed().as_secs() + 2;
    let mut stacks = Stacks::default();
    for pid in chromium.pids() {
        let response = daemon.get(&format!("/folded?pid={pid}&seconds={window}"));
        // 404: a helper process that exited before it was ever sampled.
        if response.status == 200 {
            stacks
                .0
                .extend(Stacks::from_folded(&parse_folded(&response.text())).0);
        }
    }
    (stacks, chromium.cpu_seen(), peaks)
}

#[test]
fn chromium_tables_load_within_the_default_limit_and_its_stacks_are_whole() {
    let _serial = serial();
    let fdes = fde_count(BINARY).unwrap_or_else(|| panic!("{BINARY} has no .eh_frame_hdr"));
    let daemon = Daemon::start(&[]);
    let before = daemon.get("/metrics").text();
    let (stacks, cpu, peaks) = run_chromium(&daemon, "chromium-default");
    let after = daemon.get("/metrics").text();

    // A lower bound: the CPU seen misses each process's last 100 ms.
    let expected = Expected::new(cpu, 99).samples();
    assert!(
        stacks.total() as f64 >= 0.5 * expected && expected >= 100.0,
        "chromium ran {:.2} s of CPU ({expected:.0} samples at 99 Hz); the daemon has {}",
        cpu.as_secs_f64(),
        stacks.total()
    );
    let with_user_stack = stacks.filter(|stack| !stack.frames.is_empty());
    let whole = with_user_stack.share(|stack| starts_at_an_entry(&stack.frames));
    // Chromium forks its helpers (zygote): a child's first samples come
    // before the daemon has read its mappings, and are walked with frame
    // pointers (counted as table_not_loaded when those stop short). Those,
    // and only those, are excused.
    let series = "profilerd_unwind_walks_total{end=\"table_not_loaded\"}";
    let not_loaded = metric_sum(&after, series).unwrap_or(0.0) - metric_sum(&before, series).unwrap_or(0.0);
    let excused = (100.0 * not_loaded / with_user_stack.total().max(1) as f64).min(5.0);
    eprintln!(
        "chromium: {whole:.1}% of {} samples with a user stack start at an entry \
         ({} without one); {not_loaded} walks (all processes) stopped before their tables were \
         loaded: {excused:.1} points excused",
        with_user_stack.total(),
        stacks.total() - with_user_stack.total()
    );
    assert!(
        whole + excused >= 95.0,
        "expected >= 95% of chromium's user stacks to start at a program or thread entry \
         (_start, __libc_start_call_main, start_thread, clone3, ...), got {whole:.1}%; \
         the most frequent others:\n{}",
        with_user_stack.offending(|stack| starts_at_an_entry(&stack.frames), 10)
    );

    let loaded = required(&after, "profilerd_unwind_tables_loaded_total")
        - metric_sum(&before, "profilerd_unwind_tables_loaded_total").unwrap_or(0.0);
    let compile = compile_seconds(&after) - compile_seconds(&before);
    let rows_before = required(&before, "profilerd_unwind_table_rows");
    required(&after, "profilerd_unwind_table_bytes");
    eprintln!(
        "tables: {loaded} loaded while chromium ran, compile time {compile:.3} s, rows {rows_before} \
         before and {} at the peak, bytes {} at the peak of {} allowed; chromium has {fdes} FDEs",
        peaks.rows,
        peaks.bytes,
        required(&after, "profilerd_unwind_table_bytes_max")
    );
    assert!(
        loaded >= 1.0,
        "chromium's tables should have been loaded: {loaded} loads"
    );
    assert!(
        compile > 0.0,
        "compiling its tables should take measured time: {compile} s"
    );
    // Each FDE gives at least one row; half of them allows for merging.
    assert!(
        peaks.rows - rows_before >= fdes as f64 / 2.0,
        "chromium's {fdes} FDEs should have added at least {} rows: {rows_before} before, {} at the peak",
        fdes / 2,
        peaks.rows
    );
    assert!(
        peaks.over_limit.is_empty(),
        "table bytes must stay within the limit: {:?}",
        peaks.over_limit
    );
    let evictions = required(&after, "profilerd_unwind_table_evictions_total")
        - metric_sum(&before, "profilerd_unwind_table_evictions_total").unwrap_or(0.0);
    eprintln!("evictions under the default limit: {evictions}");
    walk_ends(&after);
}

/// Prints how the walks ended (each reason a series), and checks that the
/// reasons the issue names are all exported.
fn walk_ends(metrics: &str) {
    let ends = [
        "complete",
        "no_mapping",
        "no_frame_pointer",
        "unsupported_rule",
        "read_fault",
        "depth_limit",
        "table_not_loaded",
    ];
    let counts: Vec<String> = ends
        .iter()
        .map(|end| {
            let series = format!("profilerd_unwind_walks_total{{end=\"{end}\"}}");
            format!("{end}={}", required(metrics, &series))
        })
        .collect();
    eprintln!("walks: {}", counts.join(" "));
}

#[test]
fn chromium_over_a_small_limit_evicts_and_other_stacks_stay_whole() {
    let _serial = serial();
    let limit = SMALL_LIMIT_MB.to_string();
    let daemon = Daemon::start(&["--unwind-table-memory-mb", &limit]);
    let cxx = Workload::spawn(env!("WORKLOAD_CXX_SORT"), &["600"]);
    warm_up(&[cxx.pid()]);
    let before = daemon.get("/metrics").text();
    let started = Instant::now();
    let meter = CpuMeter::start(&[cxx.pid()]);
    let (chromium_stacks, _, peaks) = run_chromium(&daemon, "chromium-small");
    // The C++ workload's window goes on a little after Chromium: what the
    // evictions left behind shows too.
    std::thread::sleep(Duration::from_secs(2));
    let cpu = meter.stop();
    let window = started.elapsed().as_secs();
    let cxx_stacks = daemon_stacks(&daemon, cxx.pid(), window);
    let after = daemon.get("/metrics").text();

    let max = required(&after, "profilerd_unwind_table_bytes_max");
    required(&after, "profilerd_unwind_table_bytes");
    assert_eq!(
        max,
        (SMALL_LIMIT_MB << 20) as f64,
        "--unwind-table-memory-mb {SMALL_LIMIT_MB} should be the bytes limit"
    );
    assert!(
        peaks.over_limit.is_empty(),
        "table bytes must stay within {max}: {:?}",
        peaks.over_limit
    );
    let evictions = required(&after, "profilerd_unwind_table_evictions_total")
        - metric_sum(&before, "profilerd_unwind_table_evictions_total").unwrap_or(0.0);
    assert!(
        evictions >= 1.0,
        "with {SMALL_LIMIT_MB} MiB for tables chromium's cannot all fit: evictions should be \
         counted, got {evictions} (peak bytes {})",
        peaks.bytes
    );
    let lost = metric_sum(&after, "profilerd_samples_lost_total").unwrap_or(0.0)
        - metric_sum(&before, "profilerd_samples_lost_total").unwrap_or(0.0);
    assert!(
        lost == 0.0,
        "no sample may be lost while tables churn: {lost} lost"
    );
    assert!(
        chromium_stacks.total() > 0,
        "the daemon kept sampling: chromium's samples are missing"
    );
    eprintln!(
        "evictions {evictions}, peak bytes {} of {max}, chromium {} samples ({:.1}% whole)",
        peaks.bytes,
        chromium_stacks.total(),
        percent(
            chromium_stacks.count(|stack| starts_at_an_entry(&stack.frames)),
            chromium_stacks.total()
        )
    );
    Expected::new(cpu, 99).check(
        &format!("cxx_sort (pid {}) over {window} s", cxx.pid()),
        cxx_stacks.total(),
        0.8,
        150,
    );
    Bar {
        what: "samples of cxx_sort while chromium's tables churn",
        among: &|_| true,
        chain: &["main", "level_one", "level_two", "level_three"],
        min_percent: 99.0,
    }
    .check_daemon(&cxx_stacks);
}
