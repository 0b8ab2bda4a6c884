//! Issue 13 under a real systemd (the container of tests/systemd.rs): profiles
//! by unit, cgroup and pid namespace. The daemon is the installed unit; the
//! workloads are transient units started inside with `systemd-run`, each of
//! two processes spinning in a function of their own (workloads/unit_pair.c),
//! and the profiles are decoded with `go tool pprof -raw`.

use std::{
    collections::BTreeSet,
    path::Path,
    time::{Duration, Instant},
};

use profilerd_tests::{
    artifacts_dir,
    container::{Container, Http, assert_ok, assert_port_free},
    daemon::{RawSample, go_pprof, parse_raw},
    profilerd_bin,
    rootfs::{CACHE, FileLock, cached_rootfs},
    serial,
};

/// Where the workload is copied inside the container.
const WORKLOAD: &str = "/usr/local/bin/unit_pair";

#[test]
fn profiles_by_unit_cgroup_and_pid_namespace_under_a_real_systemd() {
    let _serial = serial();
    let _machine_lock = FileLock::acquire(&Path::new(CACHE).join("systemd-test.lock"));
    assert_port_free();
    let rootfs = cached_rootfs();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository root");
    let ct = Container::boot(&rootfs, repo, &profilerd_bin());
    ct.sh("mkdir -p /etc/systemd/system/profilerd.service.d && printf '[Service]\\nBindReadOnlyPaths=/run/host-proc:/proc\\n' > /etc/systemd/system/profilerd.service.d/50-test-host-proc.conf");
    assert_ok(
        &ct.run(&["/opt/profilerd/deploy/install.sh"]),
        "deploy/install.sh inside the container",
    );
    std::fs::copy(
        env!("WORKLOAD_UNIT_PAIR"),
        ct.root().join(WORKLOAD.trim_start_matches('/')),
    )
    .expect("copying the workload into the container");
    let http = Http::new(Duration::from_secs(30));

    // Two services, two processes each; a service whose processes end after
    // 0.3 s of CPU and are restarted; a service in a pid namespace of its own.
    for (unit, function, seconds) in [("unit-alpha", "alpha", "60"), ("unit-beta", "beta", "60")] {
        start_service(&ct, unit, &[WORKLOAD, function, seconds], &[]);
    }
    start_service(
        &ct,
        "unit-restart",
        &[WORKLOAD, "gamma", "0.3"],
        &["-p", "Restart=always", "-p", "RestartSec=100ms"],
    );
    start_service(
        &ct,
        "unit-ns",
        &["unshare", "--pid", "--fork", WORKLOAD, "epsilon", "60"],
        &[],
    );
    std::thread::sleep(Duration::from_secs(5));

    // unit=A: exactly A's processes (as its cgroup lists them) and function.
    let alpha_pids = container_pids(&ct, "unit-alpha.service");
    assert_eq!(
        alpha_pids.len(),
        2,
        "unit-alpha runs two processes: {alpha_pids:?}"
    );
    let alpha = profile(
        &http,
        "/pprof?unit=unit-alpha.service&seconds=4",
        "units-alpha.pb.gz",
    );
    assert_only(&alpha, "unit-alpha.service", "spin_alpha");
    assert_eq!(
        labels(&alpha, "ns_pid"),
        alpha_pids,
        "unit=unit-alpha.service: the processes of its cgroup (container pids, ns_pid labels)"
    );
    let control_group = ct.output(&["systemctl", "show", "-P", "ControlGroup", "unit-alpha.service"]);
    let cgroups = labels(&alpha, "cgroup");
    assert!(
        cgroups.len() == 1 && cgroups.iter().all(|cgroup| cgroup.ends_with(&control_group)),
        "cgroup label of unit-alpha: {cgroups:?}, systemd says {control_group}"
    );

    // unit=A,B: both, and nothing else.
    let both = profile(
        &http,
        "/pprof?unit=unit-alpha.service,unit-beta.service&seconds=4",
        "units-both.pb.gz",
    );
    assert_eq!(
        labels(&both, "unit"),
        set(&["unit-alpha.service", "unit-beta.service"]),
        "unit=A,B"
    );
    for function in ["spin_alpha", "spin_beta"] {
        assert!(
            both.iter()
                .any(|sample| sample.functions.iter().any(|f| f == function)),
            "unit=A,B: {function} missing"
        );
    }
    assert_eq!(labels(&both, "ns_pid").len(), 4, "unit=A,B: four processes");

    // A unit that never ran: 404, one line.
    let (status, body) = http
        .get("/pprof?unit=never-ran.service&seconds=4")
        .unwrap_or_else(|err| panic!("GET unit=never-ran.service: {err}"));
    assert_eq!(status, 404, "unit=never-ran.service: {body}");
    assert_eq!(body.trim_end().lines().count(), 1, "a one-line error: {body}");
    assert!(
        body.contains("never-ran.service"),
        "the error names the unit: {body}"
    );

    // The restarting unit: one profile under its name across its pids.
    let deadline = Instant::now() + Duration::from_secs(60);
    let restarts = loop {
        let restarts: u32 = ct
            .output(&["systemctl", "show", "-P", "NRestarts", "unit-restart.service"])
            .parse()
            .unwrap_or(0);
        if restarts >= 2 {
            break restarts;
        }
        assert!(
            Instant::now() < deadline,
            "unit-restart should have been restarted twice within 60 s: {restarts} restarts"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let restarted = profile(
        &http,
        "/pprof?unit=unit-restart.service&seconds=60",
        "units-restart.pb.gz",
    );
    assert_only(&restarted, "unit-restart.service", "spin_gamma");
    let pids = labels(&restarted, "pid");
    assert!(
        pids.len() >= 4,
        "unit-restart ({restarts} restarts, two processes per run): the pids of at least two runs under one unit: {pids:?}"
    );

    // A scope of ~200 ms of CPU, gone before the query, still named.
    let scope = ct.run(&[
        "systemd-run",
        "--scope",
        "--unit",
        "unit-brief",
        WORKLOAD,
        "delta",
        "0.2",
    ]);
    assert_ok(&scope, "systemd-run --scope unit-brief");
    // systemd stops a scope once it learns its cgroup is empty, a moment
    // after its last process exits: `systemd-run` may return before.
    let gone_by = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let state = loop {
        let state = ct.output(&["systemctl", "is-active", "unit-brief.scope"]);
        if state != "active" || std::time::Instant::now() > gone_by {
            break state;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_ne!(
        state, "active",
        "the scope should be gone within 10 s of its process"
    );
    let brief = profile(
        &http,
        "/pprof?unit=unit-brief.scope&seconds=10",
        "units-brief.pb.gz",
    );
    assert_only(&brief, "unit-brief.scope", "spin_delta");

    // Its own cgroup and pid namespace: cgroup and ns_pid labels; cgroup= selects it.
    let ns = profile(&http, "/pprof?unit=unit-ns.service&seconds=4", "units-ns.pb.gz");
    let ns_cgroups = labels(&ns, "cgroup");
    let [ns_cgroup] = ns_cgroups.iter().collect::<Vec<_>>()[..] else {
        panic!("one cgroup label for unit-ns: {ns_cgroups:?}");
    };
    let epsilon: Vec<RawSample> = ns
        .iter()
        .filter(|sample| sample.functions.iter().any(|f| f == "spin_epsilon"))
        .cloned()
        .collect();
    assert_eq!(
        labels(&epsilon, "ns_pid"),
        set(&["1", "2"]),
        "inside `unshare --pid --fork` the workload is pid 1 and its child pid 2"
    );
    let by_cgroup = profile(
        &http,
        &format!("/pprof?cgroup={ns_cgroup}&seconds=4"),
        "units-ns-cgroup.pb.gz",
    );
    assert_only(&by_cgroup, "unit-ns.service", "spin_epsilon");
    let parent = ns_cgroup.rsplit_once('/').map_or("/", |(parent, _)| parent);
    let under_parent = profile(
        &http,
        &format!("/pprof?cgroup={parent}&seconds=4"),
        "units-parent-cgroup.pb.gz",
    );
    let units = labels(&under_parent, "unit");
    assert!(
        units.contains("unit-ns.service") && units.contains("unit-alpha.service"),
        "cgroup={parent} holds both services: {units:?}"
    );
    // Prefixes are whole components.
    let (status, body) = http
        .get(&format!(
            "/pprof?cgroup={}&seconds=4",
            &ns_cgroup[..ns_cgroup.len() - 1]
        ))
        .unwrap_or_else(|err| panic!("GET cgroup= prefix: {err}"));
    assert_eq!(status, 404, "a partial component selects nothing: {body}");

    // /threads names each process's unit.
    let (status, threads) = http
        .get("/threads?unit=unit-beta.service&seconds=4")
        .unwrap_or_else(|err| panic!("GET /threads: {err}"));
    assert_eq!(status, 200, "{threads}");
    assert_eq!(
        threads.matches("\"unit\":\"unit-beta.service\"").count(),
        2,
        "/threads: both processes of unit-beta with their unit: {threads}"
    );
    assert_ok(
        &ct.run(&["/opt/profilerd/deploy/install.sh", "--uninstall"]),
        "uninstall",
    );
}

/// `systemd-run --unit NAME [properties] COMMAND...`, which must succeed.
fn start_service(ct: &Container, unit: &str, command: &[&str], properties: &[&str]) {
    let mut args = vec!["systemd-run", "--unit", unit];
    args.extend(properties);
    args.extend(command);
    assert_ok(&ct.run(&args), &format!("systemd-run --unit {unit}"));
}

/// The container pids in a unit's cgroup (cgroup v2, unified or hybrid layout).
fn container_pids(ct: &Container, unit: &str) -> BTreeSet<String> {
    let group = ct.output(&["systemctl", "show", "-P", "ControlGroup", unit]);
    let procs = ct.output(&[
        "sh",
        "-c",
        &format!("cat /sys/fs/cgroup/unified{group}/cgroup.procs 2>/dev/null || cat /sys/fs/cgroup{group}/cgroup.procs"),
    ]);
    procs.lines().map(str::to_owned).collect()
}

/// The profile's samples, asked again for up to 10 s while there are none
/// (a starved workload may not have been sampled yet; a unit without
/// samples is a 404 until it has some).
fn profile(http: &Http, path: &str, name: &str) -> Vec<RawSample> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = http
            .get_bytes(path)
            .unwrap_or_else(|err| panic!("GET {path}: {err}"));
        let samples = if status == 200 {
            let file = artifacts_dir().join(name);
            std::fs::write(&file, &body).expect("saving the profile");
            parse_raw(&go_pprof(&[
                "-symbolize=none",
                "-raw",
                &file.display().to_string(),
            ]))
        } else {
            Vec::new()
        };
        if !samples.is_empty() {
            return samples;
        }
        if Instant::now() > deadline {
            let threads = http
                .get("/threads?seconds=10")
                .map(|(_, text)| text)
                .unwrap_or_default();
            let metrics = http.get("/metrics").map(|(_, text)| text).unwrap_or_default();
            let cgroup_metrics: Vec<&str> = metrics.lines().filter(|line| line.contains("cgroup")).collect();
            panic!(
                "{path}: no samples within 10 s; last answer {status}: {}\n/threads:\n{threads}\n{}",
                if status == 200 {
                    "a profile".into()
                } else {
                    String::from_utf8_lossy(&body)
                },
                cgroup_metrics.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Every sample is labelled `unit`, and most samples are in `function`
/// (some are the workload starting or exiting).
fn assert_only(samples: &[RawSample], unit: &str, function: &str) {
    let units = labels(samples, "unit");
    assert_eq!(units, set(&[unit]), "unit labels");
    let total: i64 = samples.iter().map(|sample| sample.values[0]).sum();
    let hot: i64 = samples
        .iter()
        .filter(|sample| sample.functions.iter().any(|f| f == function))
        .map(|sample| sample.values[0])
        .sum();
    assert!(
        hot * 10 >= total * 8,
        "{unit}: {hot} of {total} samples in {function}; functions: {:?}",
        samples
            .iter()
            .flat_map(|sample| sample.functions.first())
            .collect::<BTreeSet<_>>()
    );
}

fn labels(samples: &[RawSample], key: &str) -> BTreeSet<String> {
    samples
        .iter()
        .map(|sample| sample.label(key).to_owned())
        .filter(|value| !value.is_empty())
        .collect()
}

fn set(values: &[&str]) -> BTreeSet<String> {
    values.iter().map(|value| (*value).to_owned()).collect()
}
