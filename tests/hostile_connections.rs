//! A local user against the daemon's HTTP front door (issue 14): 20,000 idle
//! connections, silent and trickling clients, the connection limit's policy
//! and running out of descriptors. Checked from outside: the daemon's pid,
//! scrapes of a root workload (latency and hot function), its descriptors,
//! its RSS and /metrics.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use profilerd_tests::{
    Workload, artifacts_dir,
    attacker::attacker,
    count,
    daemon::{Daemon, RawSample, go_pprof, metric, parse_raw},
    parse_folded, serial,
};

/// The default `http_max_connections` (the test checks /metrics agrees).
const MAX_CONNECTIONS: usize = 512;
const ATTACK_CONNECTIONS: usize = 20_000;
/// HTTP sockets beyond the limit: the listener and the connection being
/// admitted while the longest-idle one closes (README, "Connections").
const SOCKET_MARGIN: usize = 2;
/// The unwind rows' groups at the default unwind_table_memory_mb (64 MiB,
/// a group per MiB).
const UNWIND_GROUPS: usize = 64;
/// RSS the attack may add, MiB: README, "Connections".
const RSS_MARGIN_MIB: u64 = 32;
/// The history store's bound in this test, MiB (both daemons').
const STORE_MAX_MIB: u64 = 16;

#[test]
fn twenty_thousand_idle_connections_neither_exhaust_the_daemon_nor_block_scrapes() {
    let _serial = serial();
    let attacker = attacker();
    let store_max_mb = STORE_MAX_MIB.to_string();
    let daemon = Daemon::start(&["--store-max-mb", &store_max_mb]);
    let pid = daemon.pid();
    // The same daemon, never attacked: what the attacked one may weigh
    // anyway. A daemon samples and symbolizes the whole machine (the other
    // test lane's processes too), its history fills towards its bound, and
    // its heap's high-water mark moves with what malloc kept: measured
    // alone, the attacked daemon went from 25.6 to 47.5 MB while this one,
    // never attacked, sat at 36.9 MB.
    let control = Daemon::start(&["--store-max-mb", &store_max_mb]);
    let split = Workload::spawn(env!("WORKLOAD_SPLIT"), &["150"]);
    std::thread::sleep(Duration::from_secs(3));
    let metrics = daemon.get_on_new_connection("/metrics").text();
    assert_eq!(
        metric(&metrics, "profilerd_http_connections_max"),
        MAX_CONNECTIONS as u64
    );

    // A first, small run: the daemon symbolizes the attacker's binary now,
    // so that its cost is in the baseline, not charged to the connections.
    let dir = attacker.workdir(&std::env::temp_dir(), "connections");
    let tool = attacker.own_copy(
        env!("CARGO_BIN_EXE_hold_connections").as_ref(),
        &dir,
        "hold_connections",
    );
    let warm_up = attacker
        .command(&tool)
        .args([&daemon.addr, "16", "2", "0"])
        .output()
        .expect("running the attacker's tool");
    let report = String::from_utf8_lossy(&warm_up.stdout);
    assert!(
        warm_up.status.success() && report.starts_with("opened 16 "),
        "the attacker's tool: {}\n{report}{}",
        warm_up.status,
        String::from_utf8_lossy(&warm_up.stderr)
    );

    let mut usual = Duration::ZERO;
    for round in 0..5 {
        usual = usual.max(scrape_hot_function(
            &daemon,
            split.pid(),
            &format!("before-{round}"),
            true,
        ));
        // The control answers the same scrapes before the attack: the
        // memory a scrape takes is in both baselines.
        scrape_hot_function(&control, split.pid(), &format!("control-{round}"), false);
    }
    let before = Resources::of(pid);
    eprintln!(
        "before the attack: scrape latency up to {usual:?}, {before:?}; the control's RSS {} KiB",
        Resources::of(control.pid()).rss_kib
    );

    // As many processes as the descriptor limit they inherit requires.
    let processes = ATTACK_CONNECTIONS.div_ceil(fd_hard_limit().saturating_sub(100).max(1000));
    let per_process = ATTACK_CONNECTIONS.div_ceil(processes);
    let (send, lines) = mpsc::channel();
    let attack: Vec<Attack> = (0..processes)
        .map(|index| {
            let count = per_process.min(ATTACK_CONNECTIONS - index * per_process);
            let mut child = attacker
                .command(&tool)
                .args([
                    &daemon.addr,
                    &count.to_string(),
                    "120",
                    &(200 / processes).to_string(),
                ])
                .stdout(Stdio::piped())
                .spawn()
                .expect("starting the attacker");
            forward_lines(&mut child, send.clone());
            Attack(child)
        })
        .collect();

    let started = Instant::now();
    let (mut opened, mut reported, mut opened_at, mut last_report) = (0, 0, None, String::new());
    let (mut peak, mut slowest, mut scrapes) = (Resources::default(), Duration::ZERO, 0);
    // RSS above the larger of its own before the attack and the control's
    // now: the margin is for what the connections cost.
    let (mut peak_excess_kib, mut control_at_peak) = (0, 0);
    // Scrape from the first connects until 15 s after all 20,000 are open.
    while opened_at.is_none_or(|at: Instant| at.elapsed() < Duration::from_secs(15)) {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the attacker did not open its connections within 90 s (last report: {last_report:?})"
        );
        for line in lines.try_iter() {
            eprintln!("attacker: {line}");
            if let Some(rest) = line.strip_prefix("opened ") {
                opened += rest
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
                reported += 1;
                if reported == processes {
                    opened_at = Some(Instant::now());
                }
            }
            last_report = line;
        }
        let now = Resources::of(pid);
        peak = peak.max(&now);
        let control_now = Resources::of(control.pid()).rss_kib;
        let excess = now.rss_kib.saturating_sub(before.rss_kib.max(control_now));
        if excess > peak_excess_kib {
            (peak_excess_kib, control_at_peak) = (excess, control_now);
        }
        assert!(
            now.sockets <= before.sockets + MAX_CONNECTIONS + SOCKET_MARGIN,
            "the daemon holds {} sockets under attack (limit {MAX_CONNECTIONS} + {SOCKET_MARGIN} + {} before)",
            now.sockets,
            before.sockets
        );
        // Files held for symbolization are bounded on their own (and the
        // daemon samples every process on the machine, not only the test's),
        // and so are the unwind rows' groups, created as the tables of the
        // attacker's processes load (a map each, per MiB of tables, at most
        // the default unwind_table_memory_mb's 64): all other descriptors
        // may grow by the connections only.
        assert!(
            now.bpf_maps <= before.bpf_maps + UNWIND_GROUPS,
            "the daemon holds {} BPF maps under attack, {} before: {now:?}",
            now.bpf_maps,
            before.bpf_maps
        );
        let others = |resources: &Resources| resources.fds - resources.files - resources.bpf_maps;
        assert!(
            others(&now) <= others(&before) + MAX_CONNECTIONS + SOCKET_MARGIN,
            "the daemon holds {} descriptors other than files and BPF maps under attack, {} before: {now:?}",
            others(&now),
            others(&before)
        );
        let latency = scrape_hot_function(
            &daemon,
            split.pid(),
            &format!("during-{scrapes}"),
            scrapes % 5 == 0,
        );
        scrapes += 1;
        slowest = slowest.max(latency);
        assert!(
            latency <= usual + Duration::from_secs(1),
            "a scrape under attack took {latency:?}, usually {usual:?} (attacker: {last_report:?})"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let metrics = daemon.get_on_new_connection("/metrics").text();
    let closed = |reason: &str| {
        metric(
            &metrics,
            &format!("profilerd_http_connections_closed_total{{reason=\"{reason}\"}}"),
        )
    };
    let closed_total: u64 = ["header_timeout", "idle_timeout", "evicted", "refused"]
        .map(closed)
        .iter()
        .sum();
    eprintln!(
        "during the attack ({opened} opened; {last_report}): {scrapes} scrapes, slowest {slowest:?}; peak {peak:?}; \
         RSS at most {peak_excess_kib} KiB above the larger of its own before and the control's (then {control_at_peak} KiB); \
         closed: evicted {} header_timeout {} idle_timeout {} refused {}",
        closed("evicted"),
        closed("header_timeout"),
        closed("idle_timeout"),
        closed("refused")
    );
    assert!(
        opened >= ATTACK_CONNECTIONS as u64 * 9 / 10,
        "the attack should have opened most of its {ATTACK_CONNECTIONS} connections: {opened}"
    );
    assert!(closed("evicted") > 0, "idle connections were evicted:\n{metrics}");
    assert!(
        closed_total + MAX_CONNECTIONS as u64 >= opened,
        "each of the {opened} connections beyond the first {MAX_CONNECTIONS} displaced one or was refused:\n{metrics}"
    );
    assert!(metric(&metrics, "profilerd_http_connections") <= MAX_CONNECTIONS as u64);
    assert!(
        peak_excess_kib <= RSS_MARGIN_MIB << 10,
        "RSS under attack rose {peak_excess_kib} KiB above the larger of its own before the attack \
         ({} KiB) and the unattacked control's ({control_at_peak} KiB then), past the margin of \
         {RSS_MARGIN_MIB} MiB; highest RSS {} KiB",
        before.rss_kib,
        peak.rss_kib
    );

    drop(attack);
    let released = Instant::now();
    loop {
        let open = metric(
            &daemon.get_on_new_connection("/metrics").text(),
            "profilerd_http_connections",
        );
        // The /metrics request itself holds one.
        if open <= 1 {
            break;
        }
        assert!(
            released.elapsed() < Duration::from_secs(10),
            "{open} connections still open 10 s after the attacker exited"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let latency = scrape_hot_function(&daemon, split.pid(), "after", true);
    assert!(
        latency <= usual + Duration::from_secs(1),
        "after the attack: {latency:?}"
    );
    let after = Resources::of(pid);
    eprintln!("after the attack: {after:?}");
    assert!(
        after.sockets <= before.sockets + 1,
        "sockets released: {after:?} vs {before:?}"
    );
}

/// `/pprof?pid=` of the split workload, timed, on a new connection; its
/// hot function must dominate the profile (read by `go tool pprof` when
/// `read_pprof`, else in `/folded` of the same window: each `go` run is a
/// new process for the daemon to symbolize).
fn scrape_hot_function(daemon: &Daemon, pid: u32, name: &str, read_pprof: bool) -> Duration {
    let path = format!("/pprof?pid={pid}&seconds=2");
    let started = Instant::now();
    let response = daemon.get_on_new_connection(&path);
    let latency = started.elapsed();
    assert_eq!(response.status, 200, "GET {path}: {}", response.text());
    assert!(response.body.starts_with(&[0x1f, 0x8b]), "GET {path}: gzip");
    let (hot, total) = if read_pprof {
        let file = artifacts_dir().join(format!("hostile-connections-{name}.pb.gz"));
        std::fs::write(&file, &response.body).expect("saving the profile");
        let raw = parse_raw(&go_pprof(&["-raw", &file.display().to_string()]));
        let sum = |keep: &dyn Fn(&RawSample) -> bool| -> i64 {
            raw.iter().filter(|s| keep(s)).map(|s| s.values[0]).sum()
        };
        (sum(&|s| s.functions.iter().any(|f| f == "hot_a")), sum(&|_| true))
    } else {
        let folded = daemon.get_on_new_connection(&format!("/folded?pid={pid}&seconds=2"));
        let lines = parse_folded(&folded.text());
        let hot = count(&lines, |line| line.has_frame("hot_a"));
        (hot as i64, count(&lines, |_| true) as i64)
    };
    // ~75% expected; a majority whatever CPU the workload got meanwhile.
    assert!(
        total >= 10 && hot * 2 > total,
        "{name}: hot_a should hold most of the workload's samples: {hot} of {total}"
    );
    latency
}

/// A snapshot of the daemon from /proc.
#[derive(Clone, Copy, Debug, Default)]
struct Resources {
    fds: usize,
    sockets: usize,
    /// Regular files (the mapped files of sampled processes).
    files: usize,
    /// BPF maps (the unwind rows' groups among them, created as tables load).
    bpf_maps: usize,
    rss_kib: u64,
    /// The heap's share of it (the rest is mostly files mapped to symbolize).
    rss_anon_kib: u64,
}

impl Resources {
    fn of(pid: u32) -> Self {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_else(|err| panic!("the daemon (pid {pid}) is gone: {err}"));
        let state = status.lines().find_map(|line| line.strip_prefix("State:"));
        assert!(
            state.is_some_and(|state| !state.contains('Z')),
            "the daemon (pid {pid}) died: {state:?}"
        );
        let entries: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap_or_else(|err| panic!("listing the daemon's descriptors: {err}"))
            .filter_map(Result::ok)
            .collect();
        let targets: Vec<String> = entries
            .iter()
            .filter_map(|entry| std::fs::read_link(entry.path()).ok())
            .map(|target| target.to_string_lossy().into_owned())
            .collect();
        let sockets = targets
            .iter()
            .filter(|target| target.starts_with("socket:"))
            .count();
        let files = targets.iter().filter(|target| target.starts_with('/')).count();
        let bpf_maps = targets
            .iter()
            .filter(|target| *target == "anon_inode:bpf-map")
            .count();
        let kib = |field: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(field))
                .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(0)
        };
        Self {
            fds: entries.len(),
            sockets,
            files,
            bpf_maps,
            rss_kib: kib("VmRSS:"),
            rss_anon_kib: kib("RssAnon:"),
        }
    }

    fn max(&self, other: &Self) -> Self {
        Self {
            fds: self.fds.max(other.fds),
            sockets: self.sockets.max(other.sockets),
            files: self.files.max(other.files),
            bpf_maps: self.bpf_maps.max(other.bpf_maps),
            rss_kib: self.rss_kib.max(other.rss_kib),
            rss_anon_kib: self.rss_anon_kib.max(other.rss_anon_kib),
        }
    }
}

/// The attacker's process, killed when the test is done with it (or fails).
struct Attack(Child);

impl Drop for Attack {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn forward_lines(child: &mut Child, send: mpsc::Sender<String>) {
    let stdout = child.stdout.take().expect("the attacker's stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                break;
            }
        }
    });
}

/// The hard RLIMIT_NOFILE the attacker inherits (it raises its soft limit
/// to it; raising the hard one needs CAP_SYS_RESOURCE, which a test
/// machine may lack, so the attack is spread over processes instead).
fn fd_hard_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
    usize::try_from(limit.rlim_max).unwrap_or(usize::MAX)
}

#[path = "hostile_connections/bounds.rs"]
mod bounds;
