//! A real Parca server for the fleet tests: built once per machine from its
//! Go module (the version pinned in scripts/toolchain.env) into
//! /var/cache/profilerd-tests, started on loopback by each test, and read
//! back through its own query API (the HTTP gateway under /api).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{daemon::free_port, rootfs::FileLock};

/// The Parca version, as scripts/toolchain.env pins it.
pub fn version() -> String {
    let env = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/toolchain.env");
    let text = std::fs::read_to_string(&env).unwrap_or_else(|err| panic!("reading {}: {err}", env.display()));
    text.lines()
        .find_map(|line| line.strip_prefix("PARCA_VERSION="))
        .map(|version| version.trim().trim_matches('"').to_owned())
        .unwrap_or_else(|| panic!("expected PARCA_VERSION=... in {}", env.display()))
}

/// The cached Parca binary, built on first use (about 5 to 10 minutes):
/// the module comes from the Go module proxy and builds in a copy of its
/// own tree, so its go.mod (replace directives included) applies. With Go
/// 1.23 and later it links only with -checklinkname=0 (an old parquet-go
/// dependency reaches into the runtime with a linkname).
pub fn binary() -> PathBuf {
    let version = version();
    let cache = Path::new(crate::rootfs::CACHE).join(format!("parca-{version}"));
    let binary = cache.join("parca");
    if binary.exists() {
        return binary;
    }
    let _lock = FileLock::acquire(&cache.with_extension("lock"));
    if binary.exists() {
        return binary;
    }
    let module = format!("github.com/parca-dev/parca@{version}");
    eprintln!(
        "building Parca {version} from the Go module proxy into {} (once)",
        cache.display()
    );
    let download = Command::new("go")
        .args(["mod", "download", "-json", &module])
        .current_dir(std::env::temp_dir())
        .output()
        .expect("running go (scripts/setup.sh installs it)");
    assert!(
        download.status.success(),
        "go mod download {module} failed:\n{}{}",
        String::from_utf8_lossy(&download.stdout),
        String::from_utf8_lossy(&download.stderr)
    );
    let info: serde_json::Value =
        serde_json::from_slice(&download.stdout).expect("go mod download -json output");
    let source = info["Dir"]
        .as_str()
        .expect("the module's directory in go mod download's output");
    let tree = cache.with_extension("src");
    let _ = std::fs::remove_dir_all(&tree);
    let copied = Command::new("cp")
        .arg("-r")
        .arg(source)
        .arg(&tree)
        .status()
        .expect("cp");
    assert!(copied.success(), "copying {source} to {}", tree.display());
    // The module cache is read-only; the build writes nothing in the tree,
    // but go wants to be able to.
    let _ = Command::new("chmod").args(["-R", "u+w"]).arg(&tree).status();
    std::fs::create_dir_all(&cache).expect("creating the Parca cache directory");
    let partial = cache.join("parca.partial");
    let build = Command::new("go")
        .args(["build", "-ldflags=-checklinkname=0", "-o"])
        .arg(&partial)
        .arg("./cmd/parca")
        .current_dir(&tree)
        .output()
        .expect("running go build");
    assert!(
        build.status.success(),
        "building Parca {version} failed:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );
    std::fs::rename(&partial, &binary).expect("moving the Parca binary into place");
    let _ = std::fs::remove_dir_all(&tree);
    binary
}

/// A Parca server on a loopback port; killed on drop.
pub struct Parca {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    agent: ureq::Agent,
}

impl Parca {
    /// Starts Parca with `scrape_configs` (YAML, indented as a list under
    /// the key; empty for none), its data in a fresh directory, persisted so
    /// that a restart keeps what it stored.
    pub fn start(name: &str, scrape_configs: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("profilerd-parca-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating Parca's directory");
        let config = format!(
            "object_storage:\n  bucket:\n    type: \"FILESYSTEM\"\n    config:\n      directory: \"{}\"\nscrape_configs:{}\n",
            dir.join("blocks").display(),
            if scrape_configs.is_empty() {
                " []".to_owned()
            } else {
                format!("\n{scrape_configs}")
            }
        );
        std::fs::write(dir.join("parca.yaml"), config).expect("writing parca.yaml");
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        let mut parca = Parca {
            child: None,
            port: free_port(),
            dir,
            agent,
        };
        parca.launch();
        parca
    }

    fn launch(&mut self) {
        let log = std::fs::File::create(self.dir.join("parca.log")).expect("creating parca.log");
        let child = Command::new(binary())
            .arg(format!("--config-path={}", self.dir.join("parca.yaml").display()))
            .arg(format!("--http-address=127.0.0.1:{}", self.port))
            .arg(format!("--storage-path={}", self.dir.join("data").display()))
            .arg("--enable-persistence")
            .arg("--log-level=warn")
            // No symbolization from the network: profilerd's profiles come symbolized.
            .arg("--debuginfod-upstream-servers=")
            .arg(format!("--debuginfo-cache-dir={}", self.dir.display()))
            .current_dir(&self.dir)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting parca");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("parca exited at start ({status}):\n{}", self.log());
            }
            if self.get("/api/profiles/types").0 == 200 {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("parca did not answer within 60 s:\n{}", self.log());
    }

    /// Stops the server (SIGTERM), keeping its data for [`Parca::restart`].
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and data.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    pub fn log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("parca.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn get(&self, path_and_query: &str) -> (u16, String) {
        match self
            .agent
            .get(&format!("http://127.0.0.1:{}{path_and_query}", self.port))
            .call()
        {
            Ok(mut response) => (
                response.status().as_u16(),
                response.body_mut().read_to_string().unwrap_or_default(),
            ),
            Err(err) => (0, err.to_string()),
        }
    }

    fn query_json(&self, path: &str, params: &[(&str, String)]) -> serde_json::Value {
        let query: Vec<String> = params
            .iter()
            .map(|(name, value)| format!("{name}={}", percent_encode(value)))
            .collect();
        let (status, body) = self.get(&format!("{path}?{}", query.join("&")));
        assert_eq!(
            status,
            200,
            "Parca {path} {params:?} answered {status}: {body}\nlog:\n{}",
            self.log()
        );
        serde_json::from_str(&body).unwrap_or_else(|err| panic!("Parca {path}: {err}: {body}"))
    }

    /// Flat samples per function name of the profiles `query` selects in
    /// [start_ms, end_ms], merged (Parca's own top table).
    pub fn top(&self, query: &str, start_ms: u64, end_ms: u64) -> HashMap<String, i64> {
        let json = self.query_json(
            "/api/profiles/query",
            &[
                ("mode", "MODE_MERGE".into()),
                ("merge.query", query.into()),
                ("merge.start", rfc3339(start_ms)),
                ("merge.end", rfc3339(end_ms)),
                ("reportType", "REPORT_TYPE_TOP".into()),
            ],
        );
        let mut flat: HashMap<String, i64> = HashMap::new();
        for node in json["top"]["list"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let name = node["meta"]["function"]["name"]
                .as_str()
                .unwrap_or("?")
                .to_owned();
            *flat.entry(name).or_default() += int(&node["flat"]);
        }
        flat
    }

    /// Every profile `query` selects in [start_ms, end_ms], as
    /// (its start in Unix ms, its duration in ms, its total value), summed
    /// over series per profile time, oldest first.
    pub fn profiles(&self, query: &str, start_ms: u64, end_ms: u64) -> Vec<(u64, u64, i64)> {
        let json = self.query_json(
            "/api/profiles/query_range",
            &[
                ("query", query.into()),
                ("start", rfc3339(start_ms)),
                ("end", rfc3339(end_ms)),
                ("step", "1s".into()),
            ],
        );
        let mut by_time: std::collections::BTreeMap<u64, (u64, i64)> = Default::default();
        for series in json["series"].as_array().map(Vec::as_slice).unwrap_or_default() {
            for sample in series["samples"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
            {
                let time = sample["timestamp"]
                    .as_str()
                    .map(parse_rfc3339)
                    .expect("a sample timestamp");
                let duration_ms = u64::try_from(int(&sample["duration"])).unwrap_or(0) / 1_000_000;
                let entry = by_time.entry(time).or_default();
                entry.0 = entry.0.max(duration_ms);
                entry.1 += int(&sample["value"]);
            }
        }
        by_time
            .into_iter()
            .map(|(time, (duration, value))| (time, duration, value))
            .collect()
    }

    /// Label names Parca knows in [start_ms, end_ms].
    pub fn label_names(&self, start_ms: u64, end_ms: u64) -> Vec<String> {
        let json = self.query_json(
            "/api/profiles/labels",
            &[("start", rfc3339(start_ms)), ("end", rfc3339(end_ms))],
        );
        json["labelNames"]
            .as_array()
            .map(|names| {
                names
                    .iter()
                    .filter_map(|name| name.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Parca {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// JSON int64s come as strings from the gateway.
fn int(value: &serde_json::Value) -> i64 {
    match value {
        serde_json::Value::String(text) => text.parse().unwrap_or(0),
        serde_json::Value::Number(number) => number.as_i64().unwrap_or(0),
        _ => 0,
    }
}

fn percent_encode(value: &str) -> String {
    value
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (byte as char).to_string(),
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// Unix milliseconds as RFC 3339 (UTC, milliseconds).
pub fn rfc3339(ms: u64) -> String {
    let (days, rest) = (ms / 86_400_000, ms % 86_400_000);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3_600_000,
        rest / 60_000 % 60,
        rest / 1000 % 60,
        rest % 1000
    )
}

/// RFC 3339 (UTC, as the gateway writes it) to Unix milliseconds.
pub fn parse_rfc3339(text: &str) -> u64 {
    let parse = |range: std::ops::Range<usize>| -> i64 {
        text.get(range)
            .and_then(|part| part.parse().ok())
            .unwrap_or_else(|| panic!("a timestamp: {text}"))
    };
    let days = days_from_civil(parse(0..4), parse(5..7), parse(8..10));
    let seconds = days * 86_400 + parse(11..13) * 3600 + parse(14..16) * 60 + parse(17..19);
    let fraction = text[19..].trim_end_matches('Z');
    let millis = fraction
        .strip_prefix('.')
        .map(|digits| format!("{digits:0<3}")[..3].parse::<i64>().unwrap_or(0))
        .unwrap_or(0);
    u64::try_from(seconds * 1000 + millis).expect("a timestamp after 1970")
}

// Howard Hinnant's days <-> civil date algorithms (proleptic Gregorian).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip() {
        for ms in [0, 1_700_000_000_123, 1_795_000_000_999, 951_782_400_000] {
            assert_eq!(parse_rfc3339(&rfc3339(ms)), ms, "{}", rfc3339(ms));
        }
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(parse_rfc3339("2023-11-14T22:13:20Z"), 1_700_000_000_000);
    }
}
