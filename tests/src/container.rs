//! A real systemd booted in systemd-nspawn, for testing deploy/ under it.
//! See ../shared/notes/systemd-testing.md for the facts this rests on: the
//! seccomp exception for bpf/perf_event_open, `--register=no --keep-unit`
//! (no system bus here), nsenter to reach the container's systemd, and the
//! empty cgroups nspawn leaves behind.

use std::{
    fs::File,
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use crate::artifacts_dir;

/// The unit's default address, reachable from the host (shared network).
pub const ADDRESS: &str = "127.0.0.1:7040";

/// A booted systemd-nspawn container, powered off (and its cgroups removed)
/// when dropped, whatever happened meanwhile.
pub struct Container {
    nspawn: Child,
    pid1: u32,
    /// Our own cgroup in each hierarchy: nspawn (--keep-unit) puts the
    /// container's `payload/` and `supervisor/` under it, so two containers
    /// never share them and tear-down knows what to remove.
    cgroups: Vec<PathBuf>,
    log: PathBuf,
}

impl Container {
    pub fn boot(rootfs: &Path, repo: &Path, binary: &Path) -> Self {
        let name = format!("profilerd-test-{}", std::process::id());
        let cgroups = cgroup_hierarchies()
            .into_iter()
            .map(|hierarchy| hierarchy.join(&name))
            .collect::<Vec<_>>();
        assert!(!cgroups.is_empty(), "no cgroup hierarchy under /sys/fs/cgroup");
        for cgroup in &cgroups {
            std::fs::create_dir_all(cgroup)
                .unwrap_or_else(|err| panic!("creating {}: {err}", cgroup.display()));
        }
        let log = artifacts_dir().join("systemd-nspawn.log");
        let log_file = File::create(&log).expect("creating the nspawn log");
        let procs: Vec<String> = cgroups
            .iter()
            .map(|cgroup| cgroup.join("cgroup.procs").display().to_string())
            .collect();
        // The shell moves itself into our cgroups, then becomes nspawn.
        let script = "for procs in $PROFILERD_CGROUPS; do echo $$ > \"$procs\" || exit 1; done; exec systemd-nspawn \"$@\"";
        let nspawn = Command::new("sh")
            .args(["-c", script, "sh"])
            .env("PROFILERD_CGROUPS", procs.join(" "))
            .arg("--directory")
            .arg(rootfs)
            // Every change is made in a tmpfs overlay: the cache stays pristine.
            .args([
                "--volatile=overlay",
                "--boot",
                "--register=no",
                "--keep-unit",
                "--console=pipe",
            ])
            .arg(format!("--machine={name}"))
            // nspawn's seccomp filter refuses these, even with every capability.
            .arg("--system-call-filter=bpf perf_event_open")
            // nspawn's default bounding set has no CAP_BPF, CAP_PERFMON,
            // CAP_SYSLOG or CAP_CHECKPOINT_RESTORE: give the container what a
            // host's PID 1 has, so the unit's own limits are what is tested.
            .arg("--capability=all")
            .arg("--bind-ro=/proc:/run/host-proc")
            .arg(format!(
                "--bind-ro={}:/opt/profilerd/deploy",
                repo.join("deploy").display()
            ))
            .arg(format!(
                "--bind-ro={}:/opt/profilerd/target/release/profilerd",
                binary.display()
            ))
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("the nspawn log"))
            .stderr(log_file)
            .spawn()
            .expect("starting systemd-nspawn (package systemd-container; scripts/setup.sh installs it)");
        let mut container = Self {
            nspawn,
            pid1: 0,
            cgroups,
            log,
        };
        container.pid1 = container.wait_for_systemd();
        let state = container.wait_for_boot();
        if state != "running" {
            let failed = container.output(&["systemctl", "--failed", "--no-legend"]);
            assert!(
                state == "degraded",
                "the container's systemd did not finish booting: {state:?}; failed units: {failed}\n{}",
                container.log_tail()
            );
            eprintln!("container degraded; failed units:\n{failed}");
        }
        container
    }

    /// The container's PID 1 (nspawn's child) once it runs systemd.
    fn wait_for_systemd(&mut self) -> u32 {
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.nspawn.try_wait() {
                panic!(
                    "systemd-nspawn exited before systemd booted ({status}); is this machine able to run it? \
                     See ../shared/notes/systemd-testing.md.\n{}",
                    self.log_tail()
                );
            }
            let nspawn = self.nspawn.id();
            let child = std::fs::read_to_string(format!("/proc/{nspawn}/task/{nspawn}/children"))
                .ok()
                .and_then(|children| children.split_whitespace().next()?.parse::<u32>().ok());
            if let Some(child) = child
                && std::fs::read_to_string(format!("/proc/{child}/comm"))
                    .is_ok_and(|comm| comm.trim() == "systemd")
            {
                return child;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no systemd in the container after 30 s\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `systemctl is-system-running --wait`, retried while systemd's own
    /// socket is not up yet (it then fails at once, printing nothing).
    fn wait_for_boot(&self) -> String {
        let started = Instant::now();
        loop {
            let output = self.run(&["systemctl", "is-system-running", "--wait"]);
            let state = String::from_utf8_lossy(&output.stdout).trim().to_owned();
            if !state.is_empty() && state != "offline" {
                return state;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the container's systemd did not answer within 60 s: {}\n{}",
                String::from_utf8_lossy(&output.stderr),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The container's root directory, as seen from the host.
    pub fn root(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.pid1))
    }

    /// Runs a command inside (every namespace of PID 1), at most 60 s.
    pub fn run(&self, command: &[&str]) -> Output {
        Command::new("timeout")
            .args(["60", "nsenter", "-t", &self.pid1.to_string(), "-a"])
            .args(command)
            .output()
            .unwrap_or_else(|err| panic!("running nsenter {command:?}: {err}"))
    }

    /// A command inside (every namespace of PID 1), not started yet: for a
    /// process that runs alongside the test. nsenter forks into the
    /// container's pid namespace, so the command runs as the child of the
    /// process spawned, and nsenter exits with its status.
    pub fn command(&self, command: &[&str]) -> Command {
        let mut nsenter = Command::new("nsenter");
        nsenter.args(["-t", &self.pid1.to_string(), "-a"]).args(command);
        nsenter
    }

    /// Standard output of a command inside, trimmed (whatever its status).
    pub fn output(&self, command: &[&str]) -> String {
        String::from_utf8_lossy(&self.run(command).stdout)
            .trim()
            .to_owned()
    }

    /// A shell script inside, which must succeed.
    pub fn sh(&self, script: &str) {
        assert_ok(&self.run(&["sh", "-euc", script]), script);
    }

    /// The host pid of the service's main process (found through our cgroup).
    pub fn service_host_pid(&self) -> u32 {
        self.cgroups
            .iter()
            .map(|cgroup| cgroup.join("payload/system.slice/profilerd.service/cgroup.procs"))
            .filter_map(|procs| std::fs::read_to_string(procs).ok())
            .flat_map(|procs| {
                procs
                    .lines()
                    .filter_map(|pid| pid.trim().parse::<u32>().ok())
                    .collect::<Vec<_>>()
            })
            .find(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| comm.trim() == "profilerd")
            })
            .unwrap_or_else(|| {
                panic!(
                    "no profilerd process in the service's cgroup; status:\n{}",
                    self.output(&["systemctl", "status", "profilerd", "--no-pager"])
                )
            })
    }

    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "last lines of {}:\n{}",
            self.log.display(),
            lines[lines.len().saturating_sub(30)..].join("\n")
        )
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if self.pid1 != 0 {
            let _ = Command::new("timeout")
                .args([
                    "20",
                    "nsenter",
                    "-t",
                    &self.pid1.to_string(),
                    "-a",
                    "systemctl",
                    "poweroff",
                ])
                .output();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.nspawn.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.nspawn.kill();
        let _ = self.nspawn.wait();
        // Whatever still runs in our cgroups (only after a failed poweroff),
        // then the empty cgroups nspawn leaves, deepest first.
        for cgroup in &self.cgroups {
            for dir in cgroup_dirs_deepest_first(cgroup) {
                if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                    for pid in procs.lines().filter_map(|pid| pid.trim().parse::<i32>().ok()) {
                        // SAFETY: kill(2) on a process of our own container.
                        unsafe { kill(pid, 9) };
                    }
                }
            }
            for _ in 0..50 {
                let dirs = cgroup_dirs_deepest_first(cgroup);
                if dirs.is_empty() {
                    break;
                }
                for dir in dirs {
                    let _ = std::fs::remove_dir(dir);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if cgroup.exists() {
                eprintln!("warning: could not remove {}", cgroup.display());
            }
        }
    }
}

fn cgroup_dirs_deepest_first(root: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            stack.extend(
                entries
                    .filter_map(Result::ok)
                    .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
                    .map(|entry| entry.path()),
            );
            dirs.push(dir);
        }
    }
    dirs.sort_by_key(|dir| std::cmp::Reverse(dir.components().count()));
    dirs
}

/// The cgroup hierarchies nspawn uses: the v2 one (/sys/fs/cgroup itself, or
/// /sys/fs/cgroup/unified on a hybrid host) and systemd's named v1 one.
fn cgroup_hierarchies() -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() {
        return vec![root.to_owned()];
    }
    ["unified", "systemd"]
        .iter()
        .map(|name| root.join(name))
        .filter(|dir| dir.join("cgroup.procs").exists())
        .collect()
}

/// Someone else's daemon on 7040 would answer in place of the one under test.
pub fn assert_port_free() {
    if TcpStream::connect(ADDRESS).is_ok() {
        let who = Command::new("ss")
            .args(["-ltnp", "sport = :7040"])
            .output()
            .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
            .unwrap_or_default();
        panic!(
            "{ADDRESS} is already in use, and the unit under test listens there (its default address, \
             reached from the host through the container's shared network). Stop that process and \
             run again:\n{who}"
        );
    }
}

pub struct Http {
    agent: ureq::Agent,
}

impl Http {
    pub fn new(timeout: Duration) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .build()
            .into();
        Self { agent }
    }

    /// (status, body as text, lossy) or the transport error.
    pub fn get(&self, path: &str) -> Result<(u16, String), ureq::Error> {
        let (status, body) = self.get_bytes(path)?;
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    pub fn get_bytes(&self, path: &str) -> Result<(u16, Vec<u8>), ureq::Error> {
        let mut response = self.agent.get(format!("http://{ADDRESS}{path}")).call()?;
        let status = response.status().as_u16();
        let body = response.body_mut().with_config().limit(256 << 20).read_to_vec()?;
        Ok((status, body))
    }

    /// A profile saved under tests/artifacts.
    pub fn pprof(&self, path: &str, name: &str) -> String {
        let (status, body) = self
            .get_bytes(path)
            .unwrap_or_else(|err| panic!("GET {path}: {err}"));
        assert_eq!(status, 200, "GET {path}: {}", String::from_utf8_lossy(&body));
        let file = artifacts_dir().join(name);
        std::fs::write(&file, body).expect("saving the profile");
        file.display().to_string()
    }
}

/// Panics with the command's output unless it succeeded.
pub fn assert_ok(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what} failed ({}):\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

unsafe extern "C" {
    fn kill(pid: i32, signal: i32) -> i32;
}
