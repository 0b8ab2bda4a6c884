//! The symbolizer worker as the daemon runs it: the real `profilerd` binary
//! in worker mode, sandboxed, fed real descriptors; and its supervision when
//! a worker process crashes or hangs.

use std::{
    fs::File,
    os::fd::OwnedFd,
    os::unix::fs::MetadataExt,
    path::PathBuf,
    time::{Duration, Instant},
};

use profilerd::symbolize::worker::{FileIdentity, WorkerClient, WorkerConfig, WorkerError};

#[inline(never)]
fn marker_function_for_the_worker_test(x: u64) -> u64 {
    std::hint::black_box(x.wrapping_mul(31).rotate_left(7))
}

fn real_worker() -> WorkerConfig {
    WorkerConfig {
        program: PathBuf::from(env!("CARGO_BIN_EXE_profilerd")),
        ..WorkerConfig::this_binary(256 << 20, Duration::from_secs(10))
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
    let file = File::open(&exe).expect("opening our own binary");
    let meta = file.metadata().expect("fstat");
    let identity = FileIdentity {
        dev: meta.dev(),
        inode: meta.ino(),
        size: meta.size(),
        mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
    };
    (file.into(), identity, offset)
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
        program: PathBuf::from("/bin/sh"),
        args: vec!["-c".into(), script.into()],
        memory_bytes: 256 << 20,
        deadline,
        table_deadline: deadline,
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
