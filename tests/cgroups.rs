//! Issue 13 on this machine's own kernel: a workload in a cgroup made for
//! it, named like a systemd service, is labelled and selected by unit and
//! cgroup; a user who may not see it gets the 404 of a unit that never ran;
//! `record --unit` records it alone.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use profilerd_tests::{
    Workload,
    attacker::attacker,
    cgroup::TestCgroup,
    daemon::{Daemon, RawSample, go_pprof, parse_raw},
    record_while, serial,
};

const SPLIT: &str = env!("WORKLOAD_SPLIT");

/// A cgroup of the v2 hierarchy made for the test, removed (with its
/// parent) when dropped; its processes must be gone by then.
#[test]
fn a_unit_in_its_own_cgroup_is_labelled_selected_and_hidden_from_others() {
    let _serial = serial();
    let unit = format!("probe-{}.service", std::process::id());
    let cgroup = TestCgroup::create(&unit);
    let daemon = Daemon::start(&[]);
    // In the cgroup from its exec on, as a service's process is.
    // Paths as arguments, not in the script: a clone's path may hold spaces.
    let procs = cgroup.dir.join("cgroup.procs");
    let workload = Workload::spawn(
        "/bin/sh",
        &[
            "-c",
            r#"echo $$ > "$1" && exec "$2" 60"#,
            "sh",
            procs.to_str().expect("utf-8 cgroup path"),
            SPLIT,
        ],
    );
    let pid = workload.pid().to_string();
    std::thread::sleep(Duration::from_secs(3));

    let path = format!("/pprof?unit={unit}&seconds=3");
    let samples = pprof(&daemon, &path, "cgroups-unit.pb.gz");
    assert_eq!(labels(&samples, "pid"), set(&[&pid]), "{path}: the workload only");
    assert_eq!(labels(&samples, "unit"), set(&[&unit]), "{path}: unit labels");
    let cgroup_path = format!("/profilerd-test-{}/{unit}", std::process::id());
    assert_eq!(
        labels(&samples, "cgroup"),
        set(&[&cgroup_path]),
        "{path}: cgroup labels"
    );
    assert!(
        samples
            .iter()
            .any(|sample| sample.functions.iter().any(|f| f == "hot_a")),
        "{path}: the workload's hot function"
    );

    // A path prefix selects it too; a partial component does not.
    let parent = format!("/profilerd-test-{}", std::process::id());
    let by_prefix = pprof(
        &daemon,
        &format!("/pprof?cgroup={parent}&seconds=3"),
        "cgroups-prefix.pb.gz",
    );
    assert_eq!(labels(&by_prefix, "pid"), set(&[&pid]), "cgroup={parent}");
    let partial = daemon.get(&format!(
        "/pprof?cgroup={}&seconds=3",
        &parent[..parent.len() - 1]
    ));
    assert_eq!(partial.status, 404, "a partial component: {}", partial.text());

    // Unknown unit: 404, one line; a user who may not see the unit's
    // process gets the same answer.
    let never = daemon.get("/pprof?unit=never-ran.service&seconds=3");
    assert_eq!(never.status, 404, "{}", never.text());
    assert_eq!(never.text().trim_end().lines().count(), 1, "{}", never.text());
    let (status, body) = attacker().curl(&daemon.url(&path));
    assert_eq!(status, 404, "{path} as a user who may not see root's process");
    assert_eq!(
        String::from_utf8_lossy(&body).replace(&unit, "never-ran.service"),
        never.text(),
        "the same error as for a unit that never ran"
    );

    // /threads and the index name the unit.
    let threads = daemon.get(&format!("/threads?pid={pid}&seconds=3")).text();
    assert!(
        threads.contains(&format!("\"unit\":\"{unit}\"")),
        "/threads: {threads}"
    );
    let index = daemon.get("/?seconds=3").text();
    assert!(
        index.contains(&format!("/flamegraph.svg?unit={unit}&amp;seconds=3")),
        "the index links the unit's flame graph: {index}"
    );
    drop(daemon);

    // record --unit: that unit's process only.
    let recording = record_while(&["--unit", &unit, "--seconds", "3"], |_| {});
    let comms: BTreeSet<String> = recording.folded().iter().map(|line| line.comm.clone()).collect();
    assert_eq!(
        comms,
        set(&["split"]),
        "record --unit {unit}:\n{}",
        recording.output
    );
    drop(workload);
}

/// The profile's samples, asked again for up to 10 s while there are none
/// (a starved workload may not have been sampled yet).
fn pprof(daemon: &Daemon, path: &str, name: &str) -> Vec<RawSample> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let response = daemon.get(path);
        if response.status == 200 {
            let file = profilerd_tests::artifacts_dir().join(name);
            std::fs::write(&file, &response.body).expect("saving the profile");
            let samples = parse_raw(&go_pprof(&[
                "-symbolize=none",
                "-raw",
                &file.display().to_string(),
            ]));
            if !samples.is_empty() {
                return samples;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{path}: no samples within 10 s; last answer {}: {}",
            response.status,
            if response.status == 200 {
                String::new()
            } else {
                response.text()
            }
        );
        std::thread::sleep(Duration::from_millis(500));
    }
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
