//! A real Parca server for the fleet tests: built once per machine from its
//! Go module (the version pinned in scripts/toolchain.env) into
//! /var/cache/profilerd-tests, started on loopback by each test, and read
//! back through its own query API (gRPC, with its own client: the HTTP
//! gateway it registers answers 404 under /api in this version).

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
    let _lock = FileLock::acquire(&cache.with_file_name(format!("parca-{version}.lock")));
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
    let tree = cache.with_file_name(format!("parca-{version}.src"));
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
}

impl Parca {
    /// Starts Parca with `scrape_configs` (YAML, indented as a list under
    /// the key; empty for none), its data in a fresh directory, persisted so
    /// that a restart keeps what it stored.
    pub fn start(name: &str, scrape_configs: &str) -> Self {
        Self::start_on(name, free_port(), scrape_configs)
    }

    /// As [`Parca::start`], on a given port.
    pub fn start_on(name: &str, port: u16, scrape_configs: &str) -> Self {
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
        let mut parca = Parca {
            child: None,
            port,
            dir,
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
            if self.ready() {
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

    fn ready(&self) -> bool {
        std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            && Command::new(query_tool())
                .args(["-addr", &self.addr(), "labels", "0", "1"])
                .output()
                .is_ok_and(|output| output.status.success())
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Runs the query tool once with `args`.
    fn ask(&self, args: &[&str]) -> std::process::Output {
        Command::new(query_tool())
            .args(["-addr", &self.addr()])
            .args(args)
            .output()
            .expect("running parca_query")
    }

    /// Whether Parca holds a profile `query` selects in [start_ms, end_ms]
    /// yet, asked once: Ok(false) for none, Err with the query's complaint
    /// if it failed (as it does while Parca holds nothing at all).
    pub fn holds_profiles(&self, query: &str, start_ms: u64, end_ms: u64) -> Result<bool, String> {
        let output = self.ask(&["range", query, &start_ms.to_string(), &end_ms.to_string()]);
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).into_owned());
        }
        serde_json::from_slice::<serde_json::Value>(&output.stdout)
            .map(|json| json.as_array().is_some_and(|points| !points.is_empty()))
            .map_err(|err| format!("parca_query's answer: {err}"))
    }

    /// Asks Parca; "not found" is asked again for up to 15 s, since what
    /// Parca accepted becomes queryable a moment later (later still on a
    /// busy machine).
    fn query(&self, args: &[&str]) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(15);
        let output = loop {
            let output = self.ask(args);
            let not_found = String::from_utf8_lossy(&output.stderr).contains("code = NotFound");
            if output.status.success() || !not_found || Instant::now() >= deadline {
                break output;
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        assert!(
            output.status.success(),
            "parca_query {args:?} failed: {}\nParca's log:\n{}",
            String::from_utf8_lossy(&output.stderr),
            self.log()
        );
        serde_json::from_slice(&output.stdout).unwrap_or_else(|err| panic!("parca_query {args:?}: {err}"))
    }

    /// Flat samples per function name of the profiles `query` selects in
    /// [start_ms, end_ms], merged: Parca's own top table.
    pub fn top(&self, query: &str, start_ms: u64, end_ms: u64) -> HashMap<String, i64> {
        let json = self.query(&["top", query, &start_ms.to_string(), &end_ms.to_string()]);
        json["flat"]
            .as_object()
            .map(|flat| {
                flat.iter()
                    .map(|(name, value)| (name.clone(), value.as_i64().unwrap_or(0)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Cumulative values per function name (what the stacks through it
    /// add up to) of the profiles `query` selects in [start_ms, end_ms],
    /// merged.
    pub fn cumulative(&self, query: &str, start_ms: u64, end_ms: u64) -> HashMap<String, i64> {
        let json = self.query(&["top", query, &start_ms.to_string(), &end_ms.to_string()]);
        json["cum"]
            .as_object()
            .map(|cum| {
                cum.iter()
                    .map(|(name, value)| (name.clone(), value.as_i64().unwrap_or(0)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every profile `query` selects in [start_ms, end_ms], as (its start
    /// in Unix ms, its duration in ms, its value summed over series),
    /// oldest first.
    pub fn profiles(&self, query: &str, start_ms: u64, end_ms: u64) -> Vec<(u64, u64, i64)> {
        let json = self.query(&["range", query, &start_ms.to_string(), &end_ms.to_string()]);
        json.as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|point| {
                (
                    point["time_ms"].as_u64().unwrap_or(0),
                    point["duration_ms"].as_u64().unwrap_or(0),
                    point["value"].as_i64().unwrap_or(0),
                )
            })
            .collect()
    }

    /// The profile types Parca holds, as its queries name them
    /// (`name:sample:unit:period:unit`, `:delta` for delta profiles).
    pub fn profile_types(&self) -> Vec<String> {
        let json = self.query(&["types"]);
        json.as_array()
            .map(|types| {
                types
                    .iter()
                    .filter_map(|name| name.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Label names Parca knows in [start_ms, end_ms].
    pub fn label_names(&self, start_ms: u64, end_ms: u64) -> Vec<String> {
        let json = self.query(&["labels", &start_ms.to_string(), &end_ms.to_string()]);
        json.as_array()
            .map(|names| {
                names
                    .iter()
                    .filter_map(|name| name.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// tests/tools/parca_query, built with Parca's own generated gRPC client
/// (the same module version as the server): Parca's query API as its UI
/// and CLI use it. Built once per test process (Go caches the build).
pub fn query_tool() -> PathBuf {
    static TOOL: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    TOOL.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/parca_query");
        let out = std::env::temp_dir().join(format!("profilerd-parca-query-{}", std::process::id()));
        let build = Command::new("go")
            .args(["build", "-o"])
            .arg(&out)
            .arg(".")
            .current_dir(&source)
            .output()
            .expect("running go build");
        assert!(
            build.status.success(),
            "building tests/tools/parca_query failed:\n{}",
            String::from_utf8_lossy(&build.stderr)
        );
        out
    })
    .clone()
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
