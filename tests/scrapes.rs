//! Issue 15, shared scrape work: concurrent identical scrapes get one answer
//! computed once, distinct ones past the queue are refused with a clean 503,
//! an unprivileged user never gets an answer computed for root, and the
//! daemon's memory stays within its budget through all of it.

use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, Barrier},
    thread,
    time::{Duration, Instant},
};

use profilerd_tests::{
    Workload,
    attacker::attacker,
    daemon::{Daemon, Response},
    rss_kib, serial,
};

const SPLIT: &str = env!("WORKLOAD_SPLIT");
const ROOT_SECRET: &str = env!("WORKLOAD_ROOT_SECRET");

/// The daemon's bounds in these tests: one computation at a time, two
/// waiting, and a 16 MiB budget; a drain serves requests for a second.
const DAEMON_ARGS: [&str; 12] = [
    "--frequency",
    "999",
    "--scrape-concurrency",
    "1",
    "--scrape-queue",
    "2",
    "--scrape-memory-mb",
    "16",
    "--scrape-share-ms",
    "1000",
    "--store-max-mb",
    "16",
];
const QUEUE: usize = 2;
const SCRAPE_MEMORY_MIB: u64 = 16;
const STORE_MIB: u64 = 16;
/// Allocator slack, thread stacks and the connections of a burst: what the
/// daemon may grow by beyond its two bounds.
const SLACK_MIB: u64 = 24;

/// A counter of /metrics by its full name with labels, e.g.
/// `profilerd_scrape_answers_total{source="computed"}`.
fn metric(daemon: &Daemon, name: &str) -> u64 {
    let text = daemon.get("/metrics").text();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("/metrics has no {name}:\n{text}"))
}

fn answers(daemon: &Daemon) -> [u64; 3] {
    ["computed", "joined", "cached"].map(|source| {
        metric(
            daemon,
            &format!("profilerd_scrape_answers_total{{source=\"{source}\"}}"),
        )
    })
}

/// GETs every path at once (one thread each, released together).
fn burst(daemon: &Arc<Daemon>, paths: Vec<String>) -> Vec<(String, Response)> {
    let barrier = Arc::new(Barrier::new(paths.len()));
    let threads: Vec<_> = paths
        .into_iter()
        .map(|path| {
            let (daemon, barrier) = (daemon.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let response = daemon.get_on_new_connection(&path);
                (path, response)
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|thread| thread.join().expect("a request thread"))
        .collect()
}

/// Waits (at most 30 s) until `pid` has samples.
fn wait_sampled(daemon: &Daemon, pid: u32) {
    let started = Instant::now();
    while !daemon
        .get(&format!("/threads?pid={pid}&seconds=5"))
        .text()
        .contains("\"samples\"")
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "pid {pid} should be sampled within 30 s"
        );
        thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn identical_scrapes_share_one_answer_and_past_the_queue_refusals_are_clean() {
    let _serial = serial();
    let busy = [Workload::spawn(SPLIT, &["60"]), Workload::spawn(SPLIT, &["60"])];
    let daemon = Arc::new(Daemon::start(&DAEMON_ARGS));
    wait_sampled(&daemon, busy[0].pid());
    // Some history for the windows to hold.
    thread::sleep(Duration::from_secs(3));
    let rss_before = rss_kib(daemon.pid()).expect("the daemon's RSS");

    // Identical: one drain, one window, one key: one computation.
    const IDENTICAL: usize = 24;
    let before = answers(&daemon);
    let responses = burst(&daemon, vec!["/pprof?seconds=30".to_owned(); IDENTICAL]);
    let after = answers(&daemon);
    let mut bodies: HashMap<&[u8], usize> = HashMap::new();
    for (path, response) in &responses {
        assert_eq!(response.status, 200, "GET {path}: {}", response.text());
        *bodies.entry(&response.body).or_default() += 1;
    }
    let computed = after[0] - before[0];
    let shared = (after[1] - before[1]) + (after[2] - before[2]);
    eprintln!(
        "{IDENTICAL} identical scrapes: {computed} computed, {shared} joined or cached, {} distinct bodies",
        bodies.len()
    );
    assert_eq!(
        computed + shared,
        IDENTICAL as u64,
        "every scrape is counted as computed, joined or cached"
    );
    // They arrive within the second a drain serves, so all but a straggler
    // behind a drain boundary share; each computation is one distinct body.
    assert!(
        computed <= 2,
        "{IDENTICAL} identical scrapes arriving together should be computed once (at most twice), not {computed} times"
    );
    assert_eq!(
        bodies.len() as u64,
        computed,
        "the scrapes sharing a computation must get byte-identical answers: {:?}",
        bodies.values().collect::<Vec<_>>()
    );

    // Distinct windows cannot share: one computes, QUEUE wait, the rest are
    // refused at once, each a clean 503.
    const DISTINCT: usize = 30;
    let refused_before = metric(&daemon, "profilerd_scrape_refused_total{reason=\"queue_full\"}");
    let paths = (0..DISTINCT)
        .map(|i| format!("/pprof?seconds={}", 60 - i))
        .collect();
    let responses = burst(&daemon, paths);
    let refused_after = metric(&daemon, "profilerd_scrape_refused_total{reason=\"queue_full\"}");
    let mut answered = 0;
    let mut refused = 0;
    for (path, response) in &responses {
        match response.status {
            200 => answered += 1,
            503 => {
                refused += 1;
                let text = response.text();
                assert!(
                    response.header("content-type").starts_with("text/plain")
                        && response.header("x-go-pprof") == "1"
                        && response
                            .header("retry-after")
                            .parse::<u64>()
                            .is_ok_and(|s| s >= 1)
                        && text.ends_with('\n')
                        && text.lines().count() == 1
                        && text.contains("busy"),
                    "GET {path}: a refusal must be one line of text with Retry-After and X-Go-Pprof: {:?} {text:?}",
                    response.headers
                );
            }
            other => panic!("GET {path}: {other}: {}", response.text()),
        }
    }
    eprintln!("{DISTINCT} distinct scrapes: {answered} answered, {refused} refused");
    assert!(
        answered > QUEUE,
        "the running computation and the {QUEUE} queued ones are answered: {answered}"
    );
    assert!(
        refused > 0,
        "{DISTINCT} distinct scrapes released together, past 1 running + {QUEUE} queued, must see refusals"
    );
    assert_eq!(
        refused_after - refused_before,
        refused,
        "every refusal is counted in profilerd_scrape_refused_total{{reason=\"queue_full\"}}"
    );

    // Whatever the clients did, the daemon stayed within its bounds.
    let peak = daemon_peak_kib(daemon.pid());
    let bound = rss_before + (SCRAPE_MEMORY_MIB + STORE_MIB + SLACK_MIB) * 1024;
    eprintln!(
        "daemon RSS: {} MiB before the bursts, peak {} MiB, bound {} MiB",
        rss_before / 1024,
        peak / 1024,
        bound / 1024
    );
    assert!(
        peak <= bound,
        "the daemon's peak RSS {peak} KiB passed {rss_before} KiB before the bursts + scrape_memory_mb \
         {SCRAPE_MEMORY_MIB} MiB + store_max_mb {STORE_MIB} MiB + {SLACK_MIB} MiB of slack"
    );
    drop(busy);
}

fn daemon_peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the daemon's status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in the daemon's status")
}

/// GET as the unprivileged user, with curl: (status, body).
fn spawn_user_get(url: String) -> thread::JoinHandle<(u16, String)> {
    thread::spawn(move || {
        let output = attacker()
            .command("curl")
            .args(["-sS", "--max-time", "60", "-o", "-", "-w", "%{http_code}", &url])
            .output()
            .expect("running curl as the unprivileged user");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let (body, status) = text.split_at(text.len().saturating_sub(3));
        (status.parse().unwrap_or(0), body.to_owned())
    })
}

/// A folded line of a process named `comm`.
fn has_comm(folded: &str, comm: &str) -> bool {
    folded
        .lines()
        .any(|line| line.strip_prefix(comm).is_some_and(|rest| rest.starts_with(';')))
}

#[test]
fn a_user_never_gets_an_answer_computed_for_root() {
    let _serial = serial();
    let user = attacker();
    let (dir, own) = user.run_own_copy(Path::new(SPLIT), "scrapes", "user_split", &["60"]);
    let root = Workload::spawn(ROOT_SECRET, &["60"]);
    let daemon = Arc::new(Daemon::start(&DAEMON_ARGS));
    wait_sampled(&daemon, root.pid());
    wait_sampled(&daemon, own.0.id());

    // Root and the user ask for the same thing at the same moment, several
    // times each, so that they see the same drain and the same window.
    const EACH: usize = 4;
    const PATH: &str = "/folded?seconds=20";
    let before = answers(&daemon);
    let users: Vec<_> = (0..EACH).map(|_| spawn_user_get(daemon.url(PATH))).collect();
    let roots = burst(&daemon, vec![PATH.to_owned(); EACH]);
    let users: Vec<_> = users
        .into_iter()
        .map(|user| user.join().expect("a user's request"))
        .collect();
    let after = answers(&daemon);

    for (path, response) in &roots {
        let text = response.text();
        assert_eq!(response.status, 200, "root's GET {path}: {text}");
        // By comm: on a busy machine either may have few samples in the window.
        assert!(
            has_comm(&text, "root_secret") && has_comm(&text, "user_split"),
            "root sees both workloads in {path}:\n{text}"
        );
    }
    for (status, text) in &users {
        assert_eq!(*status, 200, "the user's GET {PATH}: {text}");
        assert!(
            !text.contains("root_only_") && !text.contains("root_secret"),
            "the user got an answer that shows root's workload:\n{text}"
        );
        assert!(
            has_comm(text, "user_split"),
            "the user sees their own workload:\n{text}"
        );
    }
    // Two scopes, two computations at least, however many shared each.
    let computed = after[0] - before[0];
    assert!(
        computed >= 2,
        "root's and the user's answers are computed apart: {computed} computed"
    );
    assert_eq!(
        after.iter().sum::<u64>() - before.iter().sum::<u64>(),
        (2 * EACH) as u64,
        "every request is counted once"
    );
    drop(root);
    drop(own);
    let _ = std::fs::remove_dir_all(&dir);
}
