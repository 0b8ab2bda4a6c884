//! The sampling core against the real kernel: known workloads, known answers.

use std::time::{Duration, Instant};

use profilerd_tests::{FoldedLine, Workload, count, record_while, rss_kib, serial};

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

#[test]
fn split_workload_by_pid_gives_known_shares_and_full_stacks() {
    let _serial = serial();
    let split = Workload::spawn(env!("WORKLOAD_SPLIT"), &["7"]);
    let pid = split.pid().to_string();
    // Something else busy on the other CPU: it must not leak into the recording.
    let _other = Workload::spawn(env!("CARGO_BIN_EXE_rust_workload"), &["7"]);
    let recording = record_while(&["--pid", &pid, "--seconds", "5"], |_| {});
    let lines = recording.folded();
    let total = count(&lines, |_| true);
    assert!(
        total >= 400,
        "expected ~495 samples of pid {pid} in 5 s at 99 Hz, got {total}:\n{}",
        recording.output
    );
    let strangers: Vec<&FoldedLine> = lines.iter().filter(|line| line.comm != "split").collect();
    assert!(
        strangers.is_empty(),
        "only pid {pid} (split) was asked for, got {strangers:?}"
    );

    let hot_a = share(count(&lines, |line| line.has_frame("hot_a")), total);
    let hot_b = share(count(&lines, |line| line.has_frame("hot_b")), total);
    assert!(
        (70.0..=80.0).contains(&hot_a),
        "hot_a should be 75±5% of samples, got {hot_a:.1}%"
    );
    assert!(
        (20.0..=30.0).contains(&hot_b),
        "hot_b should be 25±5% of samples, got {hot_b:.1}%"
    );
    let reaching_main = share(
        count(&lines, |line| line.has_frame("main") && line.has_frame("middle")),
        total,
    );
    assert!(
        reaching_main >= 95.0,
        "≥95% of samples should have a user stack main -> middle, got {reaching_main:.1}%:\n{}",
        recording.output
    );
}

/// `path::to::fn::h0123456789abcdef`: the hash a legacy-mangled Rust name carries.
fn has_rust_hash(frame: &str) -> bool {
    frame.match_indices("::h").any(|(at, _)| {
        let hash = &frame[at + 3..];
        hash.len() >= 16 && hash[..16].chars().all(|c| c.is_ascii_hexdigit())
    })
}

#[test]
fn rust_names_come_out_demangled() {
    let _serial = serial();
    let workload = Workload::spawn(env!("CARGO_BIN_EXE_rust_workload"), &["5"]);
    let pid = workload.pid().to_string();
    let recording = record_while(&["--pid", &pid, "--seconds", "3"], |_| {});
    let lines = recording.folded();
    let total = count(&lines, |_| true);
    let hot = count(&lines, |line| line.has_frame("rust_workload::hot::spin_rust_hot"));
    assert!(
        share(hot, total) >= 80.0,
        "expected most samples in rust_workload::hot::spin_rust_hot (demangled, no hash), got {hot}/{total}:\n{}",
        recording.output
    );
    let mangled: Vec<&FoldedLine> = lines
        .iter()
        .filter(|line| {
            line.frames
                .iter()
                .any(|frame| frame.starts_with("_ZN") || has_rust_hash(frame))
        })
        .collect();
    assert!(
        mangled.is_empty(),
        "Rust frames should be demangled without hashes: {mangled:?}"
    );
}

#[test]
fn syscall_heavy_workload_has_kernel_frames_under_user_frames() {
    let _serial = serial();
    let workload = Workload::spawn(env!("WORKLOAD_ZERO_READER"), &["5"]);
    let pid = workload.pid().to_string();
    let recording = record_while(&["--pid", &pid, "--seconds", "3"], |_| {});
    let lines = recording.folded();
    let total = count(&lines, |_| true);
    let kernel = count(&lines, |line| {
        line.frames.iter().any(|frame| frame.ends_with("_[k]"))
    });
    assert!(
        share(kernel, total) >= 50.0,
        "reading /dev/zero should spend most samples in the kernel, got {kernel}/{total}:\n{}",
        recording.output
    );
    for line in lines
        .iter()
        .filter(|line| line.frames.iter().any(|frame| frame.ends_with("_[k]")))
    {
        let first_kernel = line
            .frames
            .iter()
            .position(|frame| frame.ends_with("_[k]"))
            .unwrap_or(0);
        assert!(
            line.frames[first_kernel..]
                .iter()
                .all(|frame| frame.ends_with("_[k]")),
            "kernel frames must all sit below (after) the user frames: {line:?}"
        );
    }
    let under_read_zeros = count(&lines, |line| {
        line.has_frame("read_zeros") && line.frames.iter().any(|frame| frame.ends_with("_[k]"))
    });
    assert!(
        share(under_read_zeros, kernel) >= 90.0,
        "kernel samples should sit under the user function read_zeros: {under_read_zeros}/{kernel}:\n{}",
        recording.output
    );
    assert!(
        lines.iter().any(|line| line.has_frame_containing("read")
            && line.frames.last().is_some_and(|f| f.ends_with("_[k]"))),
        "expected a kernel read path (e.g. read_zero/vfs_read) in:\n{}",
        recording.output
    );
}

#[test]
fn short_lived_processes_are_symbolized() {
    let _serial = serial();
    const PROCESSES: usize = 50;
    let recording = record_while(&["--seconds", "20"], |_| {
        let started = Instant::now();
        // Two at a time, one per CPU; each burns ~200 ms of CPU and exits.
        for _ in 0..PROCESSES / 2 {
            let a = Workload::spawn(env!("WORKLOAD_SHORT_LIVED"), &["200"]);
            let b = Workload::spawn(env!("WORKLOAD_SHORT_LIVED"), &["200"]);
            a.wait();
            b.wait();
        }
        assert!(
            started.elapsed() < Duration::from_secs(19),
            "the 50 processes should finish inside the recording"
        );
    });
    let lines = recording.folded();
    let theirs: Vec<FoldedLine> = lines
        .into_iter()
        .filter(|line| line.comm == "short_lived")
        .collect();
    let total = count(&theirs, |_| true);
    // 50 × 0.2 s × 99 Hz ≈ 990 samples.
    assert!(
        total >= 700,
        "expected ~990 samples of the short-lived processes, got {total}"
    );
    let symbolized = count(&theirs, |line| line.has_frame("short_lived_work"));
    assert!(
        share(symbolized, total) >= 90.0,
        "≥90% of short-lived samples should symbolize to short_lived_work, got {symbolized}/{total}:\n{}",
        theirs
            .iter()
            .map(|line| format!("{line:?}\n"))
            .collect::<String>()
    );
}

#[test]
fn an_hour_of_load_in_a_minute_fills_no_map_and_keeps_memory_flat() {
    let _serial = serial();
    let _a = Workload::spawn(env!("WORKLOAD_SPLIT"), &["70"]);
    let _b = Workload::spawn(env!("WORKLOAD_ZERO_READER"), &["70"]);
    let mut rss = Vec::new();
    // By pid: what other processes happen to run on the machine (a compiler,
    // say) must not change the daemon's memory; BPF still samples every CPU.
    let (a_pid, b_pid) = (_a.pid().to_string(), _b.pid().to_string());
    let recording = record_while(
        &[
            "--frequency",
            "999",
            "--seconds",
            "60",
            "--pid",
            &a_pid,
            "--pid",
            &b_pid,
        ],
        |run| {
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(59) {
                if let Some(kib) = rss_kib(run.pid()) {
                    rss.push((started.elapsed().as_secs(), kib));
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        },
    );
    let lost: Vec<String> = recording
        .counters
        .iter()
        // Collisions are not losses: those samples go whole through the spill
        // ring (`spilled`); `spill_lost` and every *_full / *_error / *_lost are.
        .filter(|(name, value)| {
            **value > 0 && (name.ends_with("_full") || name.ends_with("_error") || name.ends_with("_lost"))
        })
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    assert!(
        recording.counter("samples") > 100_000,
        "expected ~120k samples at 999 Hz × 2 CPUs × 60 s:\n{}",
        recording.stderr
    );
    assert!(
        lost.is_empty(),
        "no BPF error counter may be non-zero: {lost:?}\n{}",
        recording.stderr
    );
    assert_eq!(recording.counter("errors"), 0, "{}", recording.stderr);

    let peak = |from: u64, to: u64| {
        rss.iter()
            .filter(|(s, _)| (from..to).contains(s))
            .map(|(_, kib)| *kib)
            .max()
            .unwrap_or(0)
    };
    let warm = peak(10, 20);
    let late = peak(45, 60);
    assert!(warm > 0 && late > 0, "RSS samples missing: {rss:?}");
    assert!(
        late <= warm + 4096,
        "daemon memory should be flat after warm-up: peak {warm} KiB in 10-20 s, {late} KiB in 45-60 s ({rss:?})"
    );
    eprintln!(
        "999 Hz for 60 s: {} samples, peak RSS {} KiB, CPU {:.2} s",
        recording.counter("samples"),
        recording.max_rss_kib,
        recording.cpu_seconds
    );
}
