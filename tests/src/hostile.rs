//! Common ground of the hostile-input tests: a daemon profiling a known root
//! workload ([`Watched`]), a tmpfs for the attacker's files ([`Scratch`]),
//! the attack process ([`Attack`]), and [`Watched::during_attack`], which
//! watches the daemon while an attack runs and panics, with what it saw, at
//! the first sign that the daemon went down, stalled, stopped symbolizing
//! new processes or outgrew its bounds.
//!
//! ```ignore
//! let mut watched = Watched::start(&[]);
//! let mut attack = Attack::spawn("what", attacker().command(program));
//! watched.during_attack(&mut attack, Duration::from_secs(15));
//! let metrics = watched.metrics();
//! assert!(metric_sum(&metrics, "profilerd_debug_links_refused_total").unwrap_or(0.0) >= 1.0);
//! ```

mod attack;

use std::time::{Duration, Instant};

pub use attack::{Attack, Scratch};

use crate::{Workload, daemon::Daemon, parse_folded, rss_kib};

/// Bounds the daemon (with its symbolizer worker) must stay within whatever
/// an attack does, from its documented defaults (README, "Hostile input"):
/// descriptors: max_open_files (1024) + http_max_connections (512) + the
/// worker's 32 cached files and its debug files + BPF maps, sockets and
/// the like (128); memory: far below the unit's MemoryMax (2 GiB), at the
/// store's bound (64 MiB) plus caches and the worker's parsed files.
pub const MAX_DAEMON_FDS: usize = 1024 + 512 + 64 + 128;
pub const MAX_DAEMON_RSS_KIB: u64 = 512 * 1024;
/// How much slower than usual a scrape may answer while an attack runs.
pub const SCRAPE_SLACK: Duration = Duration::from_secs(1);

/// The root workload every attack must not blind the daemon to, and the
/// function it spends its time in.
const WORKLOAD: &str = env!("WORKLOAD_SPLIT");
pub const WORKLOAD_HOT: &str = "hot_a";
/// Started midway through each attack: a process the daemon has never seen
/// must be symbolized too (its binary is a file to open then).
const FRESH: &str = env!("WORKLOAD_ZERO_READER");
const FRESH_HOT: &str = "read_zeros";
/// The scrapes' window: holds the last drains' samples, so a daemon that
/// stopped sampling or symbolizing shows in it.
const WINDOW_SECONDS: u32 = 2;
const BASELINE_SCRAPES: usize = 5;

/// A daemon and a root workload it profiles, with the usual latency of a
/// scrape of that workload measured before any attack.
pub struct Watched {
    pub daemon: Daemon,
    pub workload: Workload,
    /// The slowest of the baseline scrapes.
    pub baseline: Duration,
    /// Times out at `baseline + SCRAPE_SLACK`.
    agent: ureq::Agent,
}

/// What [`Watched::during_attack`] saw of the daemon.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    pub scrapes: u32,
    pub slowest_scrape: Duration,
    /// Open descriptors, mappings and RSS (KiB) of the daemon and its
    /// descendants at the start and end, and the maxima.
    pub fds: (usize, usize),
    pub maps: (usize, usize),
    pub rss_kib: (u64, u64),
    pub max_fds: usize,
    pub max_rss_kib: u64,
}

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .into()
}

/// GET `path`: the body of a 200, else what went wrong; and how long it took.
fn timed_get(agent: &ureq::Agent, daemon: &Daemon, path: &str) -> (Duration, Result<String, String>) {
    let started = Instant::now();
    let result = match agent.get(&daemon.url(path)).call() {
        Ok(mut response) => {
            let status = response.status().as_u16();
            let body = response
                .body_mut()
                .read_to_string()
                .map_err(|err| err.to_string());
            match (status, body) {
                (200, Ok(body)) => Ok(body),
                (status, body) => Err(format!("status {status}: {}", body.unwrap_or_default().trim())),
            }
        }
        Err(err) => Err(err.to_string()),
    };
    (started.elapsed(), result)
}

fn folded_path(pid: u32) -> String {
    format!("/folded?pid={pid}&seconds={WINDOW_SECONDS}")
}

fn has_frame(folded: &str, function: &str) -> bool {
    parse_folded(folded).iter().any(|line| line.has_frame(function))
}

fn count_entries(dir: &str) -> usize {
    std::fs::read_dir(dir).map_or(0, Iterator::count)
}

fn count_lines(file: &str) -> usize {
    std::fs::read_to_string(file).map_or(0, |text| text.lines().count())
}

/// `pid` and its descendants: a helper process the daemon runs (say, a
/// symbolizer worker) is part of what the daemon costs.
fn process_tree(pid: u32) -> Vec<u32> {
    let mut tree = vec![pid];
    let mut next = 0;
    while next < tree.len() && tree.len() < 64 {
        let parent = tree[next];
        next += 1;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
            continue;
        };
        for task in tasks.filter_map(Result::ok) {
            let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            tree.extend(
                children
                    .split_whitespace()
                    .filter_map(|child| child.parse::<u32>().ok()),
            );
        }
    }
    tree
}

/// Descriptors, mappings and RSS (KiB) of the daemon and its descendants.
fn resources(pid: u32) -> (usize, usize, u64) {
    process_tree(pid)
        .iter()
        .fold((0, 0, 0), |(fds, maps, rss), &pid| {
            (
                fds + count_entries(&format!("/proc/{pid}/fd")),
                maps + count_lines(&format!("/proc/{pid}/maps")),
                rss + rss_kib(pid).unwrap_or(0),
            )
        })
}

/// How many descriptors and mappings of `file` the daemon (`pid`) and its
/// descendants hold.
pub fn file_references(pid: u32, file: &std::path::Path) -> (usize, usize) {
    let Some(name) = file.to_str() else {
        return (0, 0);
    };
    process_tree(pid).iter().fold((0, 0), |(fds, maps), &pid| {
        let held = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |entries| {
            entries
                .filter_map(Result::ok)
                .filter(|entry| std::fs::read_link(entry.path()).is_ok_and(|target| target == file))
                .count()
        });
        let mapped = std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .map_or(0, |text| text.lines().filter(|line| line.ends_with(name)).count());
        (fds + held, maps + mapped)
    })
}

/// `name:state:wchan` of every thread of `pid`.
fn thread_states(pid: u32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(Result::ok)
        .map(|task| {
            let read = |file: &str| std::fs::read_to_string(task.path().join(file)).unwrap_or_default();
            let stat = read("stat");
            let state = stat.rsplit_once(") ").map_or("?", |(_, rest)| &rest[..1]);
            format!("{}:{state}:{}", read("comm").trim(), read("wchan"))
        })
        .collect()
}

impl Watched {
    /// Starts the daemon with `args` and the root workload, and measures
    /// how long a scrape of the workload usually takes, with a second busy
    /// process standing in for the attacker's CPU use.
    pub fn start(args: &[&str]) -> Self {
        let daemon = Daemon::start(args);
        let workload = Workload::spawn(WORKLOAD, &["600"]);
        let _load = Workload::spawn(WORKLOAD, &["600"]);
        std::thread::sleep(Duration::from_secs(3));
        let patient = agent(Duration::from_secs(30));
        let mut baseline = Duration::ZERO;
        for _ in 0..BASELINE_SCRAPES {
            let (took, result) = timed_get(&patient, &daemon, &folded_path(workload.pid()));
            let folded = result.unwrap_or_else(|err| panic!("a scrape before any attack failed: {err}"));
            assert!(
                has_frame(&folded, WORKLOAD_HOT),
                "before any attack, the workload's {WORKLOAD_HOT} should be in its profile:\n{folded}"
            );
            baseline = baseline.max(took);
            std::thread::sleep(Duration::from_millis(200));
        }
        eprintln!("baseline: the slowest of {BASELINE_SCRAPES} scrapes took {baseline:?}");
        Self {
            daemon,
            workload,
            baseline,
            agent: agent(baseline + SCRAPE_SLACK),
        }
    }

    /// Watches the daemon for `duration` (at least 8 s) while `attack`
    /// runs; `attack` must outlast it. Panics, saying what it saw, when the
    /// daemon exits, a scrape of the workload fails, is slower than
    /// `baseline + SCRAPE_SLACK` or lacks the workload's hot function, a
    /// process started midway is not symbolized, or the descriptors or RSS
    /// of the daemon and its descendants pass the bounds above.
    pub fn during_attack(&mut self, attack: &mut Attack, duration: Duration) -> Observed {
        assert!(
            duration >= Duration::from_secs(8),
            "too short to check a fresh process"
        );
        let started = Instant::now();
        let mut seen = Observed::default();
        let mut fresh: Option<(Workload, Instant)> = None;
        let mut fresh_checked = false;
        let mut first = true;
        while started.elapsed() < duration {
            attack.assert_running();
            self.check_resources(&mut seen, first);
            first = false;
            self.check_scrape(&mut seen, self.workload.pid(), WORKLOAD_HOT, attack);
            if !fresh_checked && fresh.is_none() && started.elapsed() >= duration / 3 {
                fresh = Some((Workload::spawn(FRESH, &["10"]), Instant::now()));
            }
            if let Some((process, since)) = &fresh
                && since.elapsed() >= Duration::from_secs(3)
            {
                self.check_scrape(&mut seen, process.pid(), FRESH_HOT, attack);
                fresh = None;
                fresh_checked = true;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        self.check_resources(&mut seen, false);
        assert!(fresh_checked, "the fresh process was never checked");
        eprintln!("during the attack ({}): {seen:?}", attack.name);
        seen
    }

    fn check_resources(&mut self, seen: &mut Observed, first: bool) {
        if let Some(status) = self.daemon.try_wait() {
            self.fail(&format!("the daemon exited: {status}"));
        }
        let (fds, maps, rss) = resources(self.daemon.pid());
        if first {
            (seen.fds.0, seen.maps.0, seen.rss_kib.0) = (fds, maps, rss);
        }
        (seen.fds.1, seen.maps.1, seen.rss_kib.1) = (fds, maps, rss);
        seen.max_fds = seen.max_fds.max(fds);
        seen.max_rss_kib = seen.max_rss_kib.max(rss);
        if fds > MAX_DAEMON_FDS {
            self.fail(&format!(
                "the daemon's processes hold {fds} descriptors (bound {MAX_DAEMON_FDS})"
            ));
        }
        if rss > MAX_DAEMON_RSS_KIB {
            self.fail(&format!(
                "the daemon's processes have {rss} KiB resident (bound {MAX_DAEMON_RSS_KIB} KiB)"
            ));
        }
    }

    fn check_scrape(&mut self, seen: &mut Observed, pid: u32, hot: &str, attack: &Attack) {
        let limit = self.baseline + SCRAPE_SLACK;
        let (took, result) = timed_get(&self.agent, &self.daemon, &folded_path(pid));
        seen.scrapes += 1;
        seen.slowest_scrape = seen.slowest_scrape.max(took);
        let problem = match result {
            Err(err) => format!("a scrape of pid {pid} failed after {took:?}: {err}"),
            Ok(_) if took > limit => format!("a scrape of pid {pid} took {took:?} (limit {limit:?})"),
            Ok(folded) if !has_frame(&folded, hot) => format!(
                "the last {WINDOW_SECONDS} s of pid {pid} lack its hot function {hot}:\n{}",
                folded.lines().take(10).collect::<Vec<_>>().join("\n")
            ),
            Ok(_) => return,
        };
        self.fail(&format!("{problem}\nattack: {}", attack.output()));
    }

    /// Panics with `problem` and the daemon's state: how it exited, or what
    /// each of its threads is doing and its liveness metrics.
    fn fail(&mut self, problem: &str) -> ! {
        if let Some(status) = self.daemon.try_wait() {
            panic!("{problem}\nthe daemon exited: {status}");
        }
        let pid = self.daemon.pid();
        let threads: Vec<String> = process_tree(pid)
            .iter()
            .map(|&pid| format!("pid {pid}: {}", thread_states(pid).join(" ")))
            .collect();
        let (fds, maps, rss) = resources(pid);
        let (_, metrics) = timed_get(&agent(Duration::from_secs(3)), &self.daemon, "/metrics");
        let liveness: Vec<String> = metrics
            .unwrap_or_else(|err| format!("(/metrics: {err})"))
            .lines()
            .filter(|line| {
                [
                    "profilerd_symbol",
                    "profilerd_mapped",
                    "profilerd_last",
                    "profilerd_debug",
                    "(/metrics",
                ]
                .iter()
                .any(|prefix| line.starts_with(prefix))
            })
            .map(str::to_owned)
            .collect();
        panic!(
            "{problem}\nthe daemon is alive; its processes' threads (name:state:wchan):\n{}\n\
             descriptors {fds}, mappings {maps}, RSS {rss} KiB\n{}",
            threads.join("\n"),
            liveness.join("\n")
        );
    }

    /// The daemon's /metrics text.
    pub fn metrics(&self) -> String {
        let (_, result) = timed_get(&agent(Duration::from_secs(10)), &self.daemon, "/metrics");
        result.unwrap_or_else(|err| panic!("GET /metrics: {err}"))
    }

    /// Samples of `pid` in the last `seconds`, as /folded counts them.
    pub fn samples_of(&self, pid: u32, seconds: u32) -> u64 {
        let path = format!("/folded?pid={pid}&seconds={seconds}");
        let (_, result) = timed_get(&agent(Duration::from_secs(10)), &self.daemon, &path);
        result.map_or(0, |folded| {
            parse_folded(&folded).iter().map(|line| line.count).sum()
        })
    }
}

/// The sum of every series of metric `name` (`name{label="value"}` picks one
/// series); None if there is none.
pub fn metric_sum(metrics: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let matches = if name.contains('{') {
                series == name
            } else {
                series == name
                    || series
                        .strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with('{'))
            };
            matches.then(|| value.parse().ok()).flatten()
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::metric_sum;

    #[test]
    fn sums_series_of_one_metric() {
        let text = "# TYPE a_total counter\na_total{reason=\"x\"} 2\na_total{reason=\"y\"} 3\na_total_other 7\nb 1.5\n";
        assert_eq!(metric_sum(text, "a_total"), Some(5.0));
        assert_eq!(metric_sum(text, "a_total{reason=\"y\"}"), Some(3.0));
        assert_eq!(metric_sum(text, "b"), Some(1.5));
        assert_eq!(metric_sum(text, "a"), None);
        assert_eq!(metric_sum(text, "c"), None);
    }
}
