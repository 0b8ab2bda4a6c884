//! The symbolizer worker as the daemon runs it: the real `profilerd` binary
//! in worker mode, sandboxed, fed real descriptors; and its supervision when
//! a worker process crashes or hangs.

mod readelf_frames;

use std::{
    fs::File,
    os::fd::OwnedFd,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use profiler_common::CfaRule;
use profilerd::symbolize::worker::{
    FileIdentity, FileUnwindTable, UnwindTableError, WorkerClient, WorkerConfig, WorkerError, WorkerProgram,
    WorkerRole,
};

#[inline(never)]
fn marker_function_for_the_worker_test(x: u64) -> u64 {
    std::hint::black_box(x.wrapping_mul(31).rotate_left(7))
}

/// The built `profilerd`, opened here as root: the worker, once `nobody`,
/// need not reach the build's directory (a clone under /root is 0700).
fn real_worker() -> WorkerConfig {
    WorkerConfig {
        program: WorkerProgram::open(env!("CARGO_BIN_EXE_profilerd")).expect("opening the built profilerd"),
        ..WorkerConfig::this_binary(WorkerRole::Symbols, 256 << 20, Duration::from_secs(10))
    }
}

/// This test binary, opened, and the file offset of `address` in it.
fn own_binary_and_offset(address: u64) -> (OwnedFd, FileIdentity, u64) {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("our own maps");
    let exe = std::fs::read_link("/proc/self/exe").expect("our own exe");
    let offset = maps
        .lines()
        .filter_map(profilerd::collect::parse_maps_line)
        .find(|line| (line.start..line.end).contains(&address) && line.path == exe.to_string_lossy())
        .map(|line| address - line.start + line.offset)
        .expect("the marker function is mapped from our binary");
    let (fd, identity) = open_with_identity(&exe);
    (fd, identity, offset)
}

fn open_with_identity(path: &Path) -> (OwnedFd, FileIdentity) {
    let file = File::open(path).unwrap_or_else(|err| panic!("opening {}: {err}", path.display()));
    let meta = file.metadata().expect("fstat");
    let identity = FileIdentity {
        dev: meta.dev(),
        inode: meta.ino(),
        size: meta.size(),
        mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
    };
    (file.into(), identity)
}

#[test]
fn a_sandboxed_worker_resolves_a_known_function() {
    assert_eq!(marker_function_for_the_worker_test(0), 0);
    let address = marker_function_for_the_worker_test as fn(u64) -> u64 as usize as u64;
    let (fd, identity, offset) = own_binary_and_offset(address);
    let mut client = WorkerClient::new(real_worker());
    let response = client
        .symbolize(&fd, identity, &[offset, u64::MAX - 1])
        .expect("the worker answers");
    assert!(response.error.is_empty(), "the worker failed: {}", response.error);
    assert_eq!(response.symbols.len(), 2, "one answer per offset");
    let names: Vec<&str> = response.symbols[0]
        .lines
        .iter()
        .map(|line| line.name.as_str())
        .collect();
    assert!(
        names
            .iter()
            .any(|name| name.contains("marker_function_for_the_worker_test")),
        "expected the marker function at offset {offset:#x}, got {names:?}"
    );
    assert!(
        response.symbols[1].lines.is_empty(),
        "an offset outside every segment is unknown"
    );
    assert!(!response.build_id.is_empty(), "rustc links a GNU build id");

    // What the worker may do: nothing the test (root) may.
    let pid = client.worker_pid().expect("a worker runs");
    // What `ps` shows of it: its role, not `exe` or a descriptor's number
    // (it was executed through one).
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).expect("the worker's comm");
    assert_eq!(comm.trim_end(), "profilerd-sym");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("the worker's command line");
    assert_eq!(cmdline, b"profilerd\0symbolize-worker\0symbols\0");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the worker's status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(|value| value.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|| panic!("{name} missing from the worker's status"))
    };
    assert_eq!(
        field("CapEff:"),
        "0000000000000000",
        "the worker must hold no capability"
    );
    assert_eq!(
        field("CapPrm:"),
        "0000000000000000",
        "the worker must hold no capability"
    );
    assert_eq!(
        field("CapAmb:"),
        "0000000000000000",
        "the worker must hold no capability"
    );
    assert_eq!(
        field("NoNewPrivs:"),
        "1",
        "the worker must not gain privileges by exec"
    );
    if nix_is_root() {
        assert_eq!(
            field("Uid:"),
            "65534 65534 65534 65534",
            "a root daemon's worker runs as nobody"
        );
    }
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("the worker's limits");
    assert!(
        limits
            .lines()
            .any(|line| line.starts_with("Max data size") && line.contains(&(256u64 << 20).to_string())),
        "the worker's data limit should be 256 MiB:\n{limits}"
    );
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .map(str::to_owned)
        })
        .is_some_and(|uids| uids.split_whitespace().next() == Some("0"))
}

/// A worker process that dies on its first request (SIGSEGV), or hangs.
fn failing_worker(script: &str, deadline: Duration) -> WorkerConfig {
    WorkerConfig {
        program: WorkerProgram::Path(PathBuf::from("/bin/sh")),
        args: vec!["-c".into(), script.into()],
        memory_bytes: 256 << 20,
        deadline,
        table_deadline: deadline,
        debug_file_lines: false,
    }
}

#[test]
fn a_file_that_crashes_the_worker_twice_is_quarantined() {
    let address = marker_function_for_the_worker_test as fn(u64) -> u64 as usize as u64;
    let (fd, identity, offset) = own_binary_and_offset(address);
    let mut client = WorkerClient::new(failing_worker(
        "head -c 1 >/dev/null; kill -SEGV $$",
        Duration::from_secs(10),
    ));
    for attempt in 1..=2 {
        let result = client.symbolize(&fd, identity, &[offset]);
        assert!(
            matches!(result, Err(WorkerError::Crashed)),
            "attempt {attempt}: expected the worker to be seen crashing, got {result:?}"
        );
    }
    let result = client.symbolize(&fd, identity, &[offset]);
    assert!(
        matches!(result, Err(WorkerError::Quarantined)),
        "after two crashes the file should be quarantined, got {result:?}"
    );
    assert_eq!(client.stats.restarts_crashed, 2);
    assert_eq!(client.stats.quarantined, 1);
    assert_eq!(client.stats.quarantine_skips, 1);
}

#[test]
fn a_worker_that_hangs_is_killed_at_its_deadline() {
    let address = marker_function_for_the_worker_test as fn(u64) -> u64 as usize as u64;
    let (fd, identity, offset) = own_binary_and_offset(address);
    let deadline = Duration::from_millis(300);
    let mut client = WorkerClient::new(failing_worker("exec sleep 60", deadline));
    let started = Instant::now();
    let result = client.symbolize(&fd, identity, &[offset]);
    let took = started.elapsed();
    assert!(
        matches!(result, Err(WorkerError::Deadline(_))),
        "expected a missed deadline, got {result:?}"
    );
    assert!(
        took < deadline + Duration::from_secs(2),
        "the request should end at its deadline ({deadline:?}), took {took:?}"
    );
    assert_eq!(client.worker_pid(), None, "the hung worker must be gone");
    assert_eq!(client.stats.restarts_deadline, 1);
}

#[test]
fn a_file_that_crashes_the_worker_during_a_table_request_is_quarantined() {
    let (fd, identity) = open_with_identity(Path::new(LIBC));
    let mut client = WorkerClient::new(failing_worker(
        "head -c 1 >/dev/null; kill -SEGV $$",
        Duration::from_secs(10),
    ));
    for attempt in 1..=2 {
        let result = client.unwind_table(&fd, identity);
        assert!(
            matches!(result, Err(UnwindTableError::Worker(WorkerError::Crashed))),
            "attempt {attempt}: expected the worker to be seen crashing, got {result:?}"
        );
    }
    let result = client.unwind_table(&fd, identity);
    assert!(
        matches!(result, Err(UnwindTableError::Worker(WorkerError::Quarantined))),
        "after two crashes the file should be quarantined, got {result:?}"
    );
    assert_eq!(client.stats.restarts_crashed, 2);
}

const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
const LIBSTDCXX: &str = "/usr/lib/x86_64-linux-gnu/libstdc++.so.6";

fn python3() -> PathBuf {
    std::fs::canonicalize("/usr/bin/python3").expect("python3 is installed")
}

/// Asks the real sandboxed worker for the table of `path`.
fn table_of(client: &mut WorkerClient, path: &Path) -> FileUnwindTable {
    let (fd, identity) = open_with_identity(path);
    let table = client
        .unwind_table(&fd, identity)
        .unwrap_or_else(|err| panic!("no table for {}: {err}", path.display()));
    eprintln!(
        "{}: {} rows ({} before merging), {} FDEs ({} skipped), {} unsupported, from {}, in {:?}",
        path.display(),
        table.rows.len(),
        table.rows_before_merge,
        table.fdes,
        table.fdes_skipped,
        table.unsupported_rows,
        table.source,
        table.compile_time
    );
    table
}

fn table_worker() -> WorkerClient {
    WorkerClient::new(real_worker())
}

#[test]
fn system_libraries_tables_agree_with_readelf() {
    let mut client = table_worker();
    for (path, rows_before_merge) in [
        (PathBuf::from(LIBC), 15_000..40_000),
        (PathBuf::from(LIBSTDCXX), 20_000..60_000),
        (python3(), 30_000..150_000),
    ] {
        let table = table_of(&mut client, &path);
        assert!(
            rows_before_merge.contains(&table.rows_before_merge),
            "{}: {} rows before merging, expected {rows_before_merge:?} (readelf's row count and the gaps)",
            path.display(),
            table.rows_before_merge
        );
        assert!(
            table.rows.len() < table.rows_before_merge as usize,
            "merging equal neighbours should shrink the table"
        );
        assert_eq!(table.source, ".eh_frame", "{}", path.display());
        assert!(!table.build_id.is_empty(), "{} has a build id", path.display());
        assert!(
            table.segments.iter().any(|segment| segment.file_size > 0),
            "{} has load segments",
            path.display()
        );
        let seen = readelf_frames::compare(&path, &table.rows, 4096);
        if path == Path::new(LIBC) {
            assert!(
                seen[CfaRule::Signal as usize] > 0,
                "libc's __restore_rt should be a Signal row"
            );
        }
        assert!(
            seen[CfaRule::Plt as usize] > 0,
            "{}: PLT rows should be Plt",
            path.display()
        );
    }
}

#[test]
fn an_executable_entry_point_ends_the_stack() {
    let path = python3();
    let table = table_of(&mut table_worker(), &path);
    let entry = readelf_frames::entry_point(&path);
    let row = readelf_frames::row_at(&table.rows, entry);
    assert_eq!(
        row.cfa_rule(),
        CfaRule::End as u8,
        "_start ({entry:#x}) has an undefined return address: {row:?}"
    );
}

#[test]
fn a_binary_without_unwind_tables_is_read_from_debug_frame() {
    let dir = std::env::temp_dir().join(format!("profilerd-debug-frame-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let source = dir.join("work.c");
    std::fs::write(
        &source,
        "#include <stdlib.h>\n\
         __attribute__((noinline)) static long work(long *v, int n) {\n\
           long s = 0; for (int i = 0; i < n; i++) s += v[i] * rand(); return s; }\n\
         int main(int c, char **a) { long v[64] = {c}; return (int)work(v, 64 + (int)(long)a[0][0]); }\n",
    )
    .expect("writing the C source");
    let binary = dir.join("work");
    let status = std::process::Command::new("cc")
        .args([
            "-O1",
            "-g",
            "-fno-asynchronous-unwind-tables",
            "-fno-omit-frame-pointer",
        ])
        .arg("-Wl,--compress-debug-sections=zlib")
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .status()
        .expect("running cc");
    assert!(status.success(), "cc failed");
    let table = table_of(&mut table_worker(), &binary);
    assert_eq!(
        table.source, ".eh_frame+.debug_frame",
        "the C runtime's FDEs are in .eh_frame, the program's only in its compressed .debug_frame"
    );
    let fdes = readelf_frames::frames(&binary);
    assert!(
        fdes.iter().any(|fde| fde.section == ".debug_frame"),
        "readelf should see a .debug_frame: {fdes:?}"
    );
    let seen = readelf_frames::compare(&binary, &table.rows, 256);
    assert!(seen[CfaRule::Rbp as usize] > 0, "the program's frames use rbp");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn files_without_a_table_say_why() {
    let mut client = table_worker();
    let (fd, identity) = open_with_identity(Path::new("/etc/os-release"));
    let result = client.unwind_table(&fd, identity);
    assert!(
        matches!(&result, Err(UnwindTableError::NoTable(why)) if why.contains("ELF")),
        "a text file has no table: {result:?}"
    );
    assert_eq!(
        client.stats.restarts_crashed, 0,
        "no file should bring the worker down"
    );
}

#[test]
fn chromium_table_is_compiled_within_the_worker_bounds() {
    let path = Path::new("/usr/lib/chromium/chromium");
    let mut client = table_worker();
    let table = table_of(&mut client, path);
    let pid = client.worker_pid().expect("a worker runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the worker's status");
    let peak = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .map(str::trim)
        .expect("VmHWM in the worker's status");
    eprintln!("{}: worker peak RSS {peak}", path.display());
    assert!(
        table.fdes > 1000,
        "chromium has thousands of FDEs, got {}",
        table.fdes
    );
    assert_eq!(table.fdes_skipped, 0, "every FDE of chromium should be usable");
    let seen = readelf_frames::compare(path, &table.rows, 8192);
    assert!(
        seen[CfaRule::DerefRsp as usize] + seen[CfaRule::Plt as usize] > 0,
        "chromium's realigned frames should be DerefRsp: {seen:?}"
    );
}
