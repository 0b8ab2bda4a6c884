//! Issue 14's file-based attacks, each run as an unprivileged local user
//! against the running daemon. Every test checks the outcome through
//! [`Watched::during_attack`] (same daemon, scrapes of a root workload on
//! time and symbolized, a process started meanwhile symbolized, descriptors
//! and RSS bounded), then what the attack-specific outcome is, then that
//! /metrics counted what the daemon refused.

use std::{path::Path, process::Command, time::Duration};

use profilerd_tests::{
    attacker::{Attacker, attacker},
    elf,
    hostile::{Attack, Scratch, Watched, file_references, metric_sum},
    serial,
};

#[path = "hostile_files/collision.rs"]
mod collision;

const SPLIT: &str = env!("WORKLOAD_SPLIT");
/// Longer than any watch: an attack that ends first fails the test.
const ATTACK_SECONDS: &str = "120";

/// `bytes` as the attacker's own executable file `dir/name`.
fn own_file(attacker: &Attacker, dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let staging = std::env::temp_dir().join(format!("profilerd-hostile-{}-{name}", std::process::id()));
    std::fs::write(&staging, bytes).unwrap_or_else(|err| panic!("writing {}: {err}", staging.display()));
    let owned = attacker.own_copy(&staging, dir, name);
    let _ = std::fs::remove_file(&staging);
    owned
}

fn command(attacker: &Attacker, program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Command {
    let mut command = attacker.command(program);
    command.args(args);
    command
}

/// Asserts that the sum of `series` in /metrics is at least 1.
fn assert_counted(metrics: &str, series: &[&str], what: &str) {
    let total: f64 = series.iter().filter_map(|name| metric_sum(metrics, name)).sum();
    assert!(
        total >= 1.0,
        "{what}: expected {series:?} to count it (sum {total}); the daemon's symbolizer and file metrics:\n{}",
        metrics
            .lines()
            .filter(|line| line.starts_with("profilerd_symbol") || line.starts_with("profilerd_mapped"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn a_corrupted_line_table_is_built_as_intended() {
    let mut image = std::fs::read(SPLIT).expect("reading the split workload");
    assert!(
        elf::truncate_line_file_tables(&mut image) >= 1,
        "the workload should have a DWARF 5 line table to cut"
    );
    let dir = std::env::temp_dir().join(format!("profilerd-dwarf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let binary = dir.join("split");
    std::fs::write(&binary, &image).expect("writing the corrupted copy");
    let dump = Command::new("readelf")
        .arg("--debug-dump=rawline")
        .arg(&binary)
        .output()
        .expect("running readelf");
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert!(
        dump.contains("The File Name Table") && dump.contains("lines 1,"),
        "the copy's file table should hold one entry:\n{dump}"
    );
    assert!(
        dump.contains("Set File Name to entry 2"),
        "and its rows still refer to file 2 (and, before that, to the default file 1):\n{dump}"
    );
    std::fs::set_permissions(&binary, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let status = Command::new(&binary)
        .arg("0.2")
        .status()
        .expect("running the copy");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "the corrupted copy must still run: {status}");
}

/// Issue 14: 2 bytes of .debug_line made blazesym panic on a missing file
/// index; the symbolize thread died, scrapes got 503 for ever.
#[test]
fn a_corrupted_line_table_costs_at_most_its_own_symbols() {
    let _serial = serial();
    let attacker = attacker();
    let scratch = Scratch::mount("dwarf", "1777");
    let dir = attacker.workdir(scratch.path(), "dwarf");
    let mut image = std::fs::read(SPLIT).expect("reading the split workload");
    assert!(
        elf::truncate_line_file_tables(&mut image) >= 1,
        "a line table to cut"
    );
    let binary = own_file(attacker, &dir, "split", &image);

    let mut watched = Watched::start(&[]);
    let mut attack = Attack::spawn("corrupted DWARF", command(attacker, &binary, &[ATTACK_SECONDS]));
    watched.during_attack(&mut attack, Duration::from_secs(10));
    assert!(
        watched.samples_of(attack.pid(), 30) > 0,
        "the attacker's process was sampled"
    );
    let metrics = watched.metrics();
    assert_counted(
        &metrics,
        &["profilerd_symbolizer_worker_restarts_total{reason=\"crashed\"}"],
        "the worker that parsed the corrupted file crashed",
    );
    assert_counted(
        &metrics,
        &["profilerd_symbolizer_files_quarantined_total"],
        "a file that crashes the worker again and again is quarantined",
    );
}

/// Issue 14: running code from one's own 8 MB ELF while cutting and restoring
/// its tail killed the daemon with SIGBUS (the file was mmapped to parse it).
#[test]
fn a_file_truncated_under_the_symbolizer_does_not_bring_it_down() {
    let _serial = serial();
    let attacker = attacker();
    let scratch = Scratch::mount("truncate", "1777");
    let dir = attacker.workdir(scratch.path(), "truncate");
    let library = attacker.own_copy(Path::new(env!("WORKLOAD_BIG_LIBRARY")), &dir, "libbig.so");
    let size = std::fs::metadata(&library).expect("the library").len();
    assert!(size >= 7 << 20, "the attack wants a ~8 MB ELF, got {size} bytes");

    let mut watched = Watched::start(&[]);
    let library = library.to_str().expect("utf-8 path");
    let mut attack = Attack::spawn(
        "truncating loop",
        command(
            attacker,
            env!("WORKLOAD_LIB_CHURN"),
            &["truncate", library, ATTACK_SECONDS],
        ),
    );
    watched.during_attack(&mut attack, Duration::from_secs(14));
    assert!(
        watched.samples_of(attack.pid(), 30) > 0,
        "the attacker's process was sampled"
    );
    // A SIGBUS costs a worker (restarted, counted; twice and the file is
    // quarantined); a file found cut short while its headers are read is a
    // file that could not be read.
    assert_counted(
        &watched.metrics(),
        &[
            "profilerd_symbolizer_worker_restarts_total",
            "profilerd_symbolizer_files_quarantined_total",
            "profilerd_symbol_source_errors_total",
        ],
        "the worker hit by the truncated file",
    );
}

/// `.gnu_debuglink` content naming `target`: the name, NUL, padding to 4
/// bytes, and a CRC (any: the reader blocks in open() long before it checks).
fn debug_link_section(target: &Path) -> Vec<u8> {
    let mut data = target.to_str().expect("utf-8 path").as_bytes().to_vec();
    data.push(0);
    data.resize(data.len().div_ceil(4) * 4, 0);
    data.extend_from_slice(&0x1234_5678u32.to_le_bytes());
    data
}

/// Issue 14: a debug link naming a FIFO of the user's blocked the symbolizer
/// in open() until someone opened a writer.
#[test]
fn a_debug_link_to_a_fifo_is_not_followed() {
    let _serial = serial();
    let attacker = attacker();
    let scratch = Scratch::mount("debuglink", "1777");
    let dir = attacker.workdir(scratch.path(), "debuglink");
    let fifo = dir.join("debug.fifo");
    let status = command(attacker, "mkfifo", &[fifo.to_str().expect("utf-8 path")])
        .status()
        .expect("running mkfifo");
    assert!(status.success(), "the attacker's mkfifo: {status}");
    let section = std::env::temp_dir().join(format!("profilerd-debuglink-{}", std::process::id()));
    std::fs::write(&section, debug_link_section(&fifo)).expect("writing the section");
    let linked = std::env::temp_dir().join(format!("profilerd-linked-{}", std::process::id()));
    let status = Command::new("objcopy")
        .arg(format!("--add-section=.gnu_debuglink={}", section.display()))
        .arg(SPLIT)
        .arg(&linked)
        .status()
        .expect("running objcopy");
    assert!(status.success(), "objcopy --add-section: {status}");
    let binary = attacker.own_copy(&linked, &dir, "split");
    let _ = std::fs::remove_file(&section);
    let _ = std::fs::remove_file(&linked);
    let sections = elf::sections(&std::fs::read(&binary).expect("the linked binary"));
    assert!(
        sections.iter().any(|s| s.name == ".gnu_debuglink"),
        "the attacker's binary carries the link"
    );

    let mut watched = Watched::start(&[]);
    let mut attack = Attack::spawn("FIFO debug link", command(attacker, &binary, &[ATTACK_SECONDS]));
    watched.during_attack(&mut attack, Duration::from_secs(10));
    assert!(
        watched.samples_of(attack.pid(), 30) > 0,
        "the attacker's process was sampled"
    );
    assert_counted(
        &watched.metrics(),
        &["profilerd_debug_links_refused_total"],
        "the debug link naming a path",
    );
}

/// Issue 14: 30,000 file mappings in one process pinned the daemon at its
/// descriptor limit within 5 s; every new process went unsymbolized.
#[test]
fn thirty_thousand_file_mappings_do_not_exhaust_the_daemon() {
    let _serial = serial();
    let attacker = attacker();
    let scratch = Scratch::mount("mappings", "1777");
    let dir = attacker.workdir(scratch.path(), "mappings");

    let mut watched = Watched::start(&[]);
    let mut attack = Attack::spawn(
        "30,000 file mappings",
        command(
            attacker,
            env!("WORKLOAD_MANY_MAPPINGS"),
            &[dir.to_str().expect("utf-8"), "30000", ATTACK_SECONDS],
        ),
    );
    attack.wait_for("mapped 30000 files", Duration::from_secs(60));
    watched.during_attack(&mut attack, Duration::from_secs(14));
    assert!(
        watched.samples_of(attack.pid(), 30) > 0,
        "the attacker's process was sampled"
    );
    let metrics = watched.metrics();
    let open = metric_sum(&metrics, "profilerd_mapped_files_open");
    let max = metric_sum(&metrics, "profilerd_mapped_files_open_max");
    assert!(
        matches!((open, max), (Some(open), Some(max)) if open <= max),
        "open mapped files ({open:?}) within their bound ({max:?})"
    );
    assert_counted(
        &metrics,
        &[
            "profilerd_mapped_files_evicted_total",
            "profilerd_mapped_files_refused_total{reason=\"per_process_limit\"}",
        ],
        "30,000 files against a bounded set of descriptors",
    );
}

/// Descriptors (or mappings) of one file the daemon may hold: one to read
/// it, one a worker was handed, two mappings of it there.
const MAX_REFERENCES: usize = 4;

/// Issue 14: re-touching one's own mapped ELF every 0.5 s added a
/// descriptor, a mapping and ~2 MB to the daemon per second.
#[test]
fn a_retouched_elf_replaces_its_cache_entries() {
    let _serial = serial();
    let attacker = attacker();
    let scratch = Scratch::mount("retouch", "1777");
    let dir = attacker.workdir(scratch.path(), "retouch");
    let library = attacker.own_copy(Path::new(env!("WORKLOAD_BIG_LIBRARY")), &dir, "libbig.so");

    let mut watched = Watched::start(&[]);
    let mut attack = Attack::spawn(
        "re-touched ELF",
        command(
            attacker,
            env!("WORKLOAD_LIB_CHURN"),
            &["retouch", library.to_str().expect("utf-8 path"), ATTACK_SECONDS],
        ),
    );
    // 20 versions of the file in each 10 s: each may replace the last, not
    // add to it. (The daemon's own counts vary with what else runs.)
    watched.during_attack(&mut attack, Duration::from_secs(10));
    let first = file_references(watched.daemon.pid(), &library);
    watched.during_attack(&mut attack, Duration::from_secs(10));
    let second = file_references(watched.daemon.pid(), &library);
    assert!(
        watched.samples_of(attack.pid(), 30) > 0,
        "the attacker's process was sampled"
    );
    assert!(
        [first.0, first.1, second.0, second.1]
            .iter()
            .all(|&n| n <= MAX_REFERENCES),
        "the daemon's (descriptors, mappings) of the re-touched file: {first:?} after 10 s, \
         {second:?} after 20 s (at most {MAX_REFERENCES} each)"
    );
}
