//! A profilerd daemon under test, an HTTP client for it, and `go tool pprof`
//! as the independent reader of what it serves.

use std::{
    collections::HashMap,
    net::TcpListener,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::profilerd_bin;

/// A running `profilerd` on a free loopback port; stopped (SIGTERM) on drop.
pub struct Daemon {
    child: Option<Child>,
    pub addr: String,
    agent: ureq::Agent,
    /// Keeps no connection between requests.
    unpooled: ureq::Agent,
}

pub struct Response {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map_or("", String::as_str)
    }
}

/// GETs `url` on a thread of its own, with a fresh connection (no global
/// timeout: for requests that block, like `/debug/pprof/profile`); the
/// status, or the transport error.
pub fn get_in_background(url: String) -> std::thread::JoinHandle<Result<u16, ureq::Error>> {
    std::thread::spawn(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        agent.get(&url).call().map(|response| response.status().as_u16())
    })
}

/// A loopback port free now, below the kernel's ephemeral range: a port
/// the kernel hands out (bind to :0) may be taken as the source port of an
/// outgoing connection before the server given it binds, and the tests
/// that open thousands of connections make that likely. Random, so that
/// test binaries running at once rarely pick the same one (and a bind
/// checks that none holds it now).
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, RandomState};
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    const LOWEST: u16 = 10_000;
    if ephemeral_low > LOWEST + 1000 {
        let random = RandomState::new();
        for attempt in 0..200u32 {
            let pick = random.hash_one((std::process::id(), attempt));
            let port = LOWEST + (pick % u64::from(ephemeral_low - LOWEST)) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free loopback port")
}

impl Daemon {
    /// Starts the daemon with `args` and waits until it answers HTTP.
    pub fn start(args: &[&str]) -> Self {
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new(profilerd_bin())
            .args(["--listen", &addr])
            .args(args)
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting the profilerd daemon");
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .into();
        let unpooled = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .max_idle_connections(0)
            .build()
            .into();
        let mut daemon = Self {
            child: Some(child),
            addr,
            agent,
            unpooled,
        };
        let started = Instant::now();
        loop {
            if std::net::TcpStream::connect(&daemon.addr).is_ok() {
                break;
            }
            if let Some(status) = daemon
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten())
            {
                panic!(
                    "profilerd exited before listening on {}: {status} (it needs root)",
                    daemon.addr
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "profilerd did not listen on {} within 20 s",
                daemon.addr
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // The listener is bound before the BPF programs load; the first answer
        // comes once the sampler is attached.
        let ready = daemon.get("/metrics");
        assert_eq!(
            ready.status,
            200,
            "profilerd on {} did not become ready: {}",
            daemon.addr,
            ready.text()
        );
        daemon
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// How the daemon ended, if it has: it is reaped then, and [`Self::pid`]
    /// is 0 from then on (its pid may be reused).
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok().flatten()?;
        self.child = None;
        Some(status)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn get(&self, path: &str) -> Response {
        self.get_with(&self.agent, path)
    }

    /// GET on a connection of its own, closed after the answer: what a
    /// scraper does when the daemon may have closed its idle connections.
    pub fn get_on_new_connection(&self, path: &str) -> Response {
        self.get_with(&self.unpooled, path)
    }

    fn get_with(&self, agent: &ureq::Agent, path: &str) -> Response {
        let url = self.url(path);
        let mut response = agent
            .get(&url)
            .call()
            .unwrap_or_else(|err| panic!("GET {url}: {err}"));
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_ascii_lowercase(),
                    value.to_str().unwrap_or("").to_owned(),
                )
            })
            .collect();
        let body = response
            .body_mut()
            .with_config()
            .limit(256 << 20)
            .read_to_vec()
            .unwrap_or_else(|err| panic!("reading the body of {url}: {err}"));
        Response {
            status,
            headers,
            body,
        }
    }

    /// GETs a profile, asserting the success conventions, and saves it to `file`.
    pub fn fetch_pprof(&self, path: &str, file: &Path) -> Response {
        let response = self.get(path);
        assert_eq!(response.status, 200, "GET {path}: {}", response.text());
        assert!(
            response
                .header("content-type")
                .starts_with("application/octet-stream"),
            "GET {path}: content-type {}",
            response.header("content-type")
        );
        assert!(
            response.body.starts_with(&[0x1f, 0x8b]),
            "GET {path}: the body must be gzip"
        );
        std::fs::write(file, &response.body).expect("saving the profile");
        response
    }

    /// SIGTERM, then the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        self.terminate().expect("the daemon was running")
    }

    fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc_kill(child.id() as i32, 15) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        child.wait().ok()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.terminate();
    }
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, signal: i32) -> i32;
}

/// The value of an (unlabelled or labelled) sample in /metrics output.
pub fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|line| {
            line.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .unwrap_or_else(|| panic!("series {series} missing from /metrics:\n{text}")) as u64
}

/// Runs `go tool pprof ARGS` and returns its standard output.
pub fn go_pprof(args: &[&str]) -> String {
    let output = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .env("PPROF_TMPDIR", std::env::temp_dir())
        .output()
        .expect("running go tool pprof (Go is installed by scripts/setup.sh)");
    assert!(
        output.status.success(),
        "go tool pprof {args:?} failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// One sample as `go tool pprof -raw` prints it.
#[derive(Clone, Debug, Default)]
pub struct RawSample {
    pub values: Vec<i64>,
    pub labels: HashMap<String, String>,
    /// Function names of its locations, leaf first, inlined ones included.
    pub functions: Vec<String>,
}

impl RawSample {
    pub fn label(&self, key: &str) -> &str {
        self.labels.get(key).map_or("", String::as_str)
    }
}

/// Parses `go tool pprof -raw` output.
pub fn parse_raw(text: &str) -> Vec<RawSample> {
    let mut samples: Vec<(RawSample, Vec<u64>)> = Vec::new();
    let mut locations: HashMap<u64, Vec<String>> = HashMap::new();
    let mut section = "";
    let mut current_location = None;
    for line in text.lines() {
        match line {
            "Samples:" | "Locations" | "Mappings" => {
                section = line;
                continue;
            }
            _ => {}
        }
        match section {
            "Samples:" => {
                if let Some((values, ids)) = line.split_once(':')
                    && let Ok(values) = values
                        .split_whitespace()
                        .map(str::parse)
                        .collect::<Result<Vec<i64>, _>>()
                    && !values.is_empty()
                {
                    let ids = ids.split_whitespace().filter_map(|id| id.parse().ok()).collect();
                    samples.push((
                        RawSample {
                            values,
                            ..RawSample::default()
                        },
                        ids,
                    ));
                } else if line.contains(":[")
                    && let Some((sample, _)) = samples.last_mut()
                {
                    sample.labels.extend(parse_labels(line.trim()));
                }
            }
            "Locations" => {
                let trimmed = line.trim_start();
                let (id, rest) = match trimmed.split_once(": 0x") {
                    Some((id, rest)) if id.chars().all(|c| c.is_ascii_digit()) => {
                        let id: u64 = id.parse().unwrap_or(0);
                        current_location = Some(id);
                        // Skip the address and the M=N mapping reference.
                        let rest = rest.split_once(' ').map_or("", |(_, rest)| rest);
                        let rest = rest
                            .strip_prefix("M=")
                            .map_or(rest, |r| r.split_once(' ').map_or("", |(_, rest)| rest));
                        (id, rest)
                    }
                    _ => match current_location {
                        Some(id) => (id, trimmed),
                        None => continue,
                    },
                };
                if let Some(name) = function_name(rest) {
                    locations.entry(id).or_default().push(name);
                }
            }
            _ => {}
        }
    }
    samples
        .into_iter()
        .map(|(mut sample, ids)| {
            sample.functions = ids
                .iter()
                .flat_map(|id| locations.get(id).cloned().unwrap_or_default())
                .collect();
            sample
        })
        .collect()
}

/// `key:[value] key:[value]` (values may hold spaces).
fn parse_labels(line: &str) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    let mut rest = line;
    while let Some((key, after)) = rest.split_once(":[") {
        let Some(end) = after.find("] ").or_else(|| after.strip_suffix(']').map(str::len)) else {
            break;
        };
        labels.push((key.trim().to_owned(), after[..end].to_owned()));
        rest = after.get(end + 1..).unwrap_or("");
    }
    labels
}

/// `name file:line:col s=N[(system name)]` -> name.
fn function_name(line: &str) -> Option<String> {
    let before_start = &line[..line.rfind(" s=")?];
    let (rest, _col) = before_start.rsplit_once(':')?;
    let (rest, _line) = rest.rsplit_once(':')?;
    // `rest` is "NAME FILE", and both may hold spaces: names such as
    // "[unknown] libx.so+0x10" or C++ operators, files under a checkout such
    // as "/root/my checkouts". No file leaves the space before it; a file is
    // otherwise an absolute path, from the first " /" on (the names that
    // hold a path are unknown frames, which have no file).
    let name = if let Some(name) = rest.strip_suffix(' ') {
        name
    } else if let Some(file) = rest.find(" /") {
        &rest[..file]
    } else {
        rest.rfind(' ').map_or(rest, |space| &rest[..space])
    };
    Some(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_raw_output() {
        let text = "PeriodType: cpu nanoseconds\nPeriod: 10101010\nSamples:\nsamples/count cpu/nanoseconds\n          3   30303030: 1 2 3 \n                comm:[my app] pid:[42] thread_id:[43] thread_name:[worker 1]\nLocations\n     1: 0x1136 M=1 hot_a /src/a.c:10:0 s=0\n             inlined_b /src/a.c:3:0 s=0\n     2: 0x1180 M=1 [unknown] libx.so+0x10 :0:0 s=0\n     3: 0x1190 M=1 operator new /root/my checkouts/a.cc:7:0 s=0\nMappings\n1: 0x0/0x0/0x0 /bin/a  [FN]\n";
        let samples = parse_raw(text);
        assert_eq!(samples.len(), 1);
        let sample = &samples[0];
        assert_eq!(sample.values, vec![3, 30303030]);
        assert_eq!(sample.label("comm"), "my app");
        assert_eq!(sample.label("thread_name"), "worker 1");
        assert_eq!(sample.label("pid"), "42");
        assert_eq!(
            sample.functions,
            vec!["hot_a", "inlined_b", "[unknown] libx.so+0x10", "operator new"]
        );
    }
}
