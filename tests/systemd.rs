//! deploy/ under a real systemd: a Debian bookworm system (debootstrap, built
//! once into /var/cache/profilerd-tests/rootfs) boots in systemd-nspawn,
//! deploy/install.sh installs the unit, and the service is checked from the
//! host: notify readiness, /pprof on the default address with a host
//! workload's hot function and named kernel frames, the unit's user and
//! capabilities, a stop that leaves no BPF program behind and exits 0 within
//! 5 s even with requests in flight, restart, a config with an unknown key
//! (start fails, key named in the journal), and uninstall.
//!
//! The container shares the host's network (so 127.0.0.1:7040 inside is
//! 127.0.0.1:7040 here) but not its pid namespace, while BPF reports host
//! pids. The config says where the host's /proc is in the container
//! (`proc_root = "/run/host-proc"`), as for a daemon in any container: the
//! host workloads' pids, names and units come through it. Everything else
//! is the shipped unit. See ../shared/notes/systemd-testing.md for the
//! set-up facts.

use std::{
    collections::BTreeSet,
    io::Write,
    net::TcpStream,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use profilerd_tests::{
    Workload,
    cgroup::TestCgroup,
    container::{ADDRESS, Container, Http, assert_ok, assert_port_free},
    daemon::go_pprof,
    faulty::fault_injection_bin,
    profilerd_bin,
    rootfs::{CACHE, FileLock, cached_rootfs},
    serial,
};
/// Our BPF programs, as `bpftool prog show` names them.
const PROGRAMS: [&str; 4] = ["sample", "on_exec", "on_exit", "kernel_names"];
/// The capabilities the unit grants (CapEff of the service's process).
const UNIT_CAPS: [u32; 5] = [
    2,  // CAP_DAC_READ_SEARCH
    19, // CAP_SYS_PTRACE
    38, // CAP_PERFMON
    39, // CAP_BPF
    40, // CAP_CHECKPOINT_RESTORE
];

#[test]
fn the_unit_runs_under_a_real_systemd() {
    let _serial = serial();
    // One run of this test per machine at a time: they would fight over 7040.
    let _machine_lock = FileLock::acquire(&Path::new(CACHE).join("systemd-test.lock"));
    assert_port_free();
    let rootfs = cached_rootfs();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository root");
    let ct = Container::boot(&rootfs, repo, &profilerd_bin());

    // The daemon runs in the container's pid namespace but BPF reports host
    // pids: it reads the host's /proc where the container has it, as a
    // daemon in any container would (`proc_root`; install.sh keeps a
    // config that is there).
    ct.sh("mkdir -p /etc/profilerd && printf 'proc_root = \"/run/host-proc\"\\n' > /etc/profilerd/profilerd.toml");

    // install.sh: files in place, daemon-reload, enable, start.
    let installed = ct.run(&["/opt/profilerd/deploy/install.sh"]);
    assert_ok(&installed, "deploy/install.sh inside the container");
    // Type=notify: the start job (which install.sh waited for) finishes only
    // at READY=1, sent after the attach and the bind: the first request works.
    assert_eq!(ct.output(&["systemctl", "is-active", "profilerd"]), "active");
    assert_eq!(ct.output(&["systemctl", "is-enabled", "profilerd"]), "enabled");
    let http = Http::new(Duration::from_secs(30));
    let metrics = http
        .get("/metrics")
        .unwrap_or_else(|err| panic!("GET /metrics right after the start job: {err}"));
    assert_eq!(metrics.0, 200, "/metrics: {}", metrics.1);

    // Who it runs as: a dynamic user with exactly the unit's capabilities.
    let host_pid = ct.service_host_pid();
    let status = std::fs::read_to_string(format!("/proc/{host_pid}/status")).expect("the service's status");
    let uid = status_field(&status, "Uid:");
    assert!(
        !uid.starts_with("0\t") && !uid.is_empty(),
        "the service must not run as root: Uid {uid}"
    );
    let cap_eff = u64::from_str_radix(&status_field(&status, "CapEff:"), 16).expect("CapEff in hex");
    let expected = UNIT_CAPS.iter().fold(0u64, |caps, bit| caps | 1 << bit);
    assert_eq!(cap_eff, expected, "CapEff {cap_eff:#x}, expected {expected:#x}");

    let _split = assert_serves_hot_function(&ct, &http, "systemd-split.pb.gz", "after install");
    assert_names_a_host_unit(&ct, &http);

    // Kernel frames named, not [unknown], without CAP_SYSLOG or /proc/kallsyms:
    // the kernel names them (the kernel_names program). The zero reader
    // spends its time in read(2), so the window has kernel frames whatever
    // else the machine does (a quiet one could give none in 3 s).
    let _reader = Workload::spawn(env!("WORKLOAD_ZERO_READER"), &["5"]);
    std::thread::sleep(Duration::from_secs(1));
    let (kernel, unknown) = kernel_locations(&http);
    assert!(
        kernel > 0 && unknown * 20 <= kernel,
        "kernel frames: {unknown} of {kernel} locations unresolved"
    );

    // Journald has the logs: a few lines, no per-sample lines, no colour codes.
    let journal = ct.output(&["journalctl", "-b", "-u", "profilerd", "-o", "cat", "--no-pager"]);
    assert!(journal.contains("sampler attached"), "journal:\n{journal}");
    assert!(
        !journal.contains('\u{1b}'),
        "no ANSI escapes in the journal:\n{journal}"
    );
    assert!(
        journal.lines().count() < 30,
        "a quiet daemon logs a few lines, not one per sample:\n{journal}"
    );

    // systemctl stop with a blocking profile request and a stalled client in
    // flight: exit 0 within 5 s, and every program of ours unloaded.
    let ours = program_ids(host_pid);
    let names: BTreeSet<String> = ours.iter().filter_map(|id| program_name(*id)).collect();
    assert_eq!(
        names,
        PROGRAMS.iter().map(|name| (*name).to_owned()).collect(),
        "program ids {ours:?}"
    );
    let blocking = std::thread::spawn(|| {
        let started = Instant::now();
        let result = Http::new(Duration::from_secs(15)).get("/debug/pprof/profile?seconds=30");
        (result, started.elapsed())
    });
    let mut stalled = TcpStream::connect(ADDRESS).expect("connecting a stalled client");
    stalled
        .write_all(b"GET /pprof?seconds=1 HTTP/1.1\r\nHost: test\r\n")
        .expect("half a request");
    std::thread::sleep(Duration::from_millis(500));
    let stopping = Instant::now();
    assert_ok(&ct.run(&["systemctl", "stop", "profilerd"]), "systemctl stop");
    let stop_took = stopping.elapsed();
    let (result, took) = blocking.join().expect("the blocking request's thread");
    match result {
        Ok((status, body)) => assert_eq!(status, 200, "the in-flight profile: {body}"),
        Err(err) => panic!("the in-flight /debug/pprof/profile failed: {err}"),
    }
    assert!(
        took < Duration::from_secs(5),
        "the in-flight profile took {took:?}"
    );
    assert!(
        stop_took < Duration::from_secs(5),
        "systemctl stop took {stop_took:?}"
    );
    let show = ct.output(&[
        "systemctl",
        "show",
        "profilerd",
        "-p",
        "Result",
        "-p",
        "ExecMainStatus",
    ]);
    assert!(
        show.contains("Result=success") && show.contains("ExecMainStatus=0"),
        "a clean exit on SIGTERM:\n{show}"
    );
    drop(stalled);
    let left = wait_unloaded(&ours, Duration::from_secs(5));
    assert!(left.is_empty(), "BPF programs still loaded after stop: {left:?}");

    // restart: active again, a new process, and it samples.
    assert_ok(&ct.run(&["systemctl", "start", "profilerd"]), "systemctl start");
    let before = ct.service_host_pid();
    let before_ids = program_ids(before);
    assert_ok(
        &ct.run(&["systemctl", "restart", "profilerd"]),
        "systemctl restart",
    );
    assert_eq!(ct.output(&["systemctl", "is-active", "profilerd"]), "active");
    let after = ct.service_host_pid();
    assert_ne!(before, after, "restart starts a new process");
    let unloaded = wait_unloaded(&before_ids, Duration::from_secs(5));
    assert!(
        unloaded.is_empty(),
        "restart left programs of the old process: {unloaded:?}"
    );
    let after_ids = program_ids(after);
    drop(assert_serves_hot_function(
        &ct,
        &http,
        "systemd-restart.pb.gz",
        "after restart",
    ));

    // A config with an unknown key: the start fails (once: exit 78 is not
    // restarted), and the journal names the key.
    ct.sh("cp /etc/profilerd/profilerd.toml /root/profilerd.toml.good && printf 'frequency = 99\\nsampling_hz = 5\\n' > /etc/profilerd/profilerd.toml");
    let restart = ct.run(&["systemctl", "restart", "profilerd"]);
    assert!(
        !restart.status.success(),
        "the start must fail with an unknown key"
    );
    let show = ct.output(&[
        "systemctl",
        "show",
        "profilerd",
        "-p",
        "ExecMainStatus",
        "-p",
        "NRestarts",
    ]);
    assert!(
        show.contains("ExecMainStatus=78") && show.contains("NRestarts=0"),
        "exit 78 (EX_CONFIG), not restarted:\n{show}"
    );
    assert_eq!(ct.output(&["systemctl", "is-active", "profilerd"]), "failed");
    let journal = ct.output(&["journalctl", "-b", "-u", "profilerd", "-o", "cat", "--no-pager"]);
    assert!(
        journal.contains("/etc/profilerd/profilerd.toml:2: unknown field `sampling_hz`"),
        "the journal should name the key and its line:\n{journal}"
    );
    let left = wait_unloaded(&after_ids, Duration::from_secs(5));
    assert!(
        left.is_empty(),
        "programs left after the failed restart: {left:?}"
    );

    // Uninstall: stopped, disabled, binary and unit gone, the edited config kept.
    ct.sh("cp /root/profilerd.toml.good /etc/profilerd/profilerd.toml");
    assert_ok(
        &ct.run(&["/opt/profilerd/deploy/install.sh", "--uninstall"]),
        "install.sh --uninstall",
    );
    ct.sh("test ! -e /usr/local/bin/profilerd && test ! -e /etc/systemd/system/profilerd.service && test -e /etc/profilerd/profilerd.toml");
    assert_ne!(ct.output(&["systemctl", "is-enabled", "profilerd"]), "enabled");
}

/// Starts a host workload and checks that its hot function is in /pprof,
/// symbolized by the daemon itself (-symbolize=none: go tool pprof would
/// otherwise fill in names from the binary on this host and hide a failure).
/// The workload keeps running until the returned handle is dropped.
fn assert_serves_hot_function(ct: &Container, http: &Http, artifact: &str, when: &str) -> Workload {
    let split = Workload::spawn(env!("WORKLOAD_SPLIT"), &["30"]);
    std::thread::sleep(Duration::from_secs(4));
    let top = top_of(http, &format!("/pprof?pid={}&seconds=3", split.pid()), artifact);
    assert!(
        top.contains(" hot_a\n"),
        "{when}: the hot function of the host workload (pid {}) should be named:\n{top}\n{}",
        split.pid(),
        diagnostics(ct, http)
    );
    split
}

/// A host workload in a cgroup named like a service: the daemon in the
/// container names its unit through the host's /proc and cgroup hierarchy.
/// In the container's cgroup namespace the host's cgroup paths are not
/// readable from /proc/PID/cgroup (they start with `/..`): the hierarchy's
/// walk names the new cgroup, at most 5 s after its first samples, so the
/// unit's samples are asked for until they are there.
fn assert_names_a_host_unit(ct: &Container, http: &Http) {
    let unit = format!("probe-{}.service", std::process::id());
    let cgroup = TestCgroup::create(&unit);
    let _workload = cgroup.spawn(env!("WORKLOAD_SPLIT"), &["30"]);
    let path = format!("/pprof?unit={unit}&seconds=3");
    let started = Instant::now();
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let status = http.get(&path).map(|(status, _)| status);
        if status.as_ref().is_ok_and(|&status| status == 200) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no samples of unit {unit} within 20 s ({status:?}):\n{}",
            diagnostics(ct, http)
        );
    }
    // Three whole seconds of it, named.
    std::thread::sleep(Duration::from_secs(3));
    let top = top_of(http, &path, "systemd-unit.pb.gz");
    assert!(
        top.contains(" hot_a\n"),
        "the host workload of unit {unit} should be selected by its unit:\n{top}\n{}",
        diagnostics(ct, http)
    );
}

/// What the daemon says about its symbolization, and its journal.
fn diagnostics(ct: &Container, http: &Http) -> String {
    let metrics = http.get("/metrics").map(|(_, text)| text).unwrap_or_default();
    let counters: Vec<&str> = metrics
        .lines()
        .filter(|line| {
            ["profilerd_symbol", "profilerd_process", "profilerd_cgroup"]
                .iter()
                .any(|prefix| line.starts_with(prefix))
        })
        .collect();
    let journal = ct.output(&["journalctl", "-b", "-u", "profilerd", "-o", "cat", "--no-pager"]);
    format!("metrics:\n{}\njournal:\n{journal}", counters.join("\n"))
}

/// `go tool pprof -top` of a profile, with the daemon's symbols only.
fn top_of(http: &Http, path: &str, name: &str) -> String {
    let file = http.pprof(path, name);
    go_pprof(&["-symbolize=none", "-top", "-nodecount=20", &file])
}

/// (kernel locations, unresolved ones) in a whole-system profile.
fn kernel_locations(http: &Http) -> (usize, usize) {
    let file = http.pprof("/pprof?seconds=3", "systemd-system.pb.gz");
    let raw = go_pprof(&["-symbolize=none", "-raw", &file]);
    let kernel: Vec<&str> = raw
        .lines()
        .skip_while(|line| *line != "Locations")
        .take_while(|line| *line != "Mappings")
        .filter(|line| {
            line.trim_start()
                .split_once(": ")
                .is_some_and(|(_, rest)| rest.starts_with("0xffffffff"))
        })
        .collect();
    let unknown = kernel.iter().filter(|line| line.contains("[unknown]")).count();
    (kernel.len(), unknown)
}

/// The BPF programs a process holds, from its descriptors' fdinfo.
fn program_ids(pid: u32) -> BTreeSet<u32> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap_or_else(|err| panic!("reading /proc/{pid}/fdinfo: {err}"));
    fds.filter_map(Result::ok)
        .filter_map(|entry| std::fs::read_to_string(entry.path()).ok())
        .flat_map(|info| {
            info.lines()
                .filter_map(|line| line.strip_prefix("prog_id:")?.trim().parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

fn program_name(id: u32) -> Option<String> {
    let output = Command::new("bpftool")
        .args(["prog", "show", "id", &id.to_string()])
        .output()
        .expect("running bpftool (scripts/setup.sh installs it)");
    let text = String::from_utf8_lossy(&output.stdout);
    let mut words = text.split_whitespace();
    words.find(|word| *word == "name")?;
    words.next().map(str::to_owned)
}

/// The ids still loaded once `timeout` has passed (the kernel frees
/// programs shortly after their last descriptor closes).
fn wait_unloaded(ids: &BTreeSet<u32>, timeout: Duration) -> Vec<u32> {
    let started = Instant::now();
    loop {
        let left: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|id| program_name(*id).is_some())
            .collect();
        if left.is_empty() || started.elapsed() > timeout {
            return left;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn status_field(status: &str, name: &str) -> String {
    status
        .lines()
        .find_map(|line| line.strip_prefix(name))
        .map(|value| value.trim().to_owned())
        .unwrap_or_default()
}

/// Issue 15: a stage that dies ends the daemon loudly (status 70), and the
/// unit's `Restart=on-failure` brings it back, serving again. The binary is
/// the test-only fault-injection build, told by the environment to panic in
/// its symbolize stage 6 s after each start.
#[test]
fn a_stage_that_panics_is_restarted_by_systemd_and_serves_again() {
    let _serial = serial();
    let _machine_lock = FileLock::acquire(&Path::new(CACHE).join("systemd-test.lock"));
    assert_port_free();
    let rootfs = cached_rootfs();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository root");
    let ct = Container::boot(&rootfs, repo, &fault_injection_bin());
    ct.sh("mkdir -p /etc/profilerd && printf 'proc_root = \"/run/host-proc\"\\n' > /etc/profilerd/profilerd.toml");
    ct.sh("mkdir -p /etc/systemd/system/profilerd.service.d && printf '[Service]\\nEnvironment=PROFILERD_FAULT=panic:symbolize:6\\n' > /etc/systemd/system/profilerd.service.d/50-test-fault.conf");
    assert_ok(
        &ct.run(&["/opt/profilerd/deploy/install.sh"]),
        "deploy/install.sh inside the container",
    );
    let first = ct.service_host_pid();
    let http = Http::new(Duration::from_secs(30));
    let (status, body) = http
        .get("/metrics")
        .unwrap_or_else(|err| panic!("GET /metrics after the start: {err}"));
    assert_eq!(status, 200, "/metrics: {body}");

    // The panic at 6 s, the exit, RestartSec=2s, a new start: within 30 s.
    let deadline = Instant::now() + Duration::from_secs(30);
    let restarted = loop {
        let show = ct.output(&[
            "systemctl",
            "show",
            "profilerd",
            "-p",
            "NRestarts",
            "-p",
            "ActiveState",
        ]);
        if !show.contains("NRestarts=0") && show.contains("ActiveState=active") {
            let pid = ct.service_host_pid();
            if pid != first {
                break pid;
            }
        }
        assert!(
            Instant::now() < deadline,
            "systemd should have restarted the daemon within 30 s of its start:\n{show}\n{}",
            ct.output(&["journalctl", "-b", "-u", "profilerd", "-o", "cat", "--no-pager"])
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let journal = ct.output(&["journalctl", "-b", "-u", "profilerd", "--no-pager"]);
    assert!(
        journal.contains("status=70"),
        "the dead stage must end the daemon with status 70:\n{journal}"
    );
    assert!(
        journal.contains("symbolize") && journal.contains("injected"),
        "the journal should name the stage and the panic:\n{journal}"
    );
    // The new process serves (before its own injected panic).
    let (status, body) = http
        .get("/metrics")
        .unwrap_or_else(|err| panic!("GET /metrics from the restarted daemon (pid {restarted}): {err}"));
    assert_eq!(status, 200, "/metrics after the restart: {body}");
    assert_ok(&ct.run(&["systemctl", "stop", "profilerd"]), "systemctl stop");
    assert_ok(
        &ct.run(&["/opt/profilerd/deploy/install.sh", "--uninstall"]),
        "install.sh --uninstall",
    );
}
