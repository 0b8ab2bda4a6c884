use std::sync::Arc;

use super::*;
use crate::{
    cgroup::Cgroup,
    kind::{ProfileType, SampleKind},
    profile::Window,
};

fn stack(name: &str) -> Arc<SymbolizedStack> {
    SymbolizedStack::of_one_function(name)
}

fn sample(
    pid: u32,
    tid: u32,
    comm: &str,
    cgroup: Option<&str>,
    stack: &Arc<SymbolizedStack>,
    count: u64,
) -> SymbolizedSample {
    SymbolizedSample {
        kind: SampleKind::Cpu,
        pid,
        tid,
        comm: comm.into(),
        readable_by: crate::collect::ReadableBy::User(0),
        thread_name: format!("{comm}-{tid}").into(),
        stack: stack.clone(),
        count,
        amount: count * 10_000_000,
        cgroup: cgroup.map(|path| Arc::new(Cgroup::from_path(path))),
        ns_pid: None,
    }
}

fn profile(samples: Vec<SymbolizedSample>) -> Profile {
    Profile {
        window: Window {
            start_ms: 1_000,
            end_ms: 16_000,
        },
        frequency: 99,
        alloc_interval: 0,
        profile_type: ProfileType::Cpu,
        samples,
    }
}

fn totals(series: &[Series]) -> Vec<(String, u64, u64)> {
    series
        .iter()
        .map(|series| {
            (
                series.service_name.to_string(),
                series.profile.total_samples(),
                series.profile.samples.iter().map(|sample| sample.amount).sum(),
            )
        })
        .collect()
}

#[test]
fn services_are_units_or_process_names_and_threads_are_summed() {
    let hot = stack("hot");
    let cold = stack("cold");
    let window = profile(vec![
        sample(10, 10, "nginx", Some("/system.slice/nginx.service"), &hot, 5),
        sample(10, 11, "nginx", Some("/system.slice/nginx.service"), &hot, 7),
        sample(12, 12, "nginx", Some("/system.slice/nginx.service"), &cold, 1),
        sample(
            20,
            20,
            "bash",
            Some("/user.slice/user-0.slice/session-4.scope"),
            &hot,
            3,
        ),
        sample(30, 31, "python3", None, &hot, 2),
    ]);
    let series = split(&window, SampleLabels::None);
    assert_eq!(
        totals(&series),
        vec![
            ("nginx.service".into(), 13, 130_000_000),
            ("bash".into(), 3, 30_000_000),
            ("python3".into(), 2, 20_000_000),
        ],
        "expected a series per service, largest first, with every sample and nanosecond kept"
    );
    let nginx = &series[0].profile.samples;
    assert_eq!(nginx.len(), 2, "one sample per stack without labels: {nginx:?}");
    assert!(
        nginx
            .iter()
            .all(|sample| sample.pid == 0 && sample.tid == 0 && sample.thread_name.is_empty()),
        "expected pids and threads summed away: {nginx:?}"
    );
    assert!(series.iter().all(|series| series.profile.window == window.window));
}

#[test]
fn parca_keeps_processes_apart_but_not_threads() {
    let hot = stack("hot");
    let window = profile(vec![
        sample(10, 10, "nginx", Some("/system.slice/nginx.service"), &hot, 5),
        sample(10, 11, "nginx", Some("/system.slice/nginx.service"), &hot, 7),
        sample(12, 12, "nginx", Some("/system.slice/nginx.service"), &hot, 1),
    ]);
    let series = split(&window, SampleLabels::Process);
    let samples = &series[0].profile.samples;
    let mut per_pid: Vec<_> = samples
        .iter()
        .map(|sample| (sample.pid, sample.tid, sample.count))
        .collect();
    per_pid.sort_unstable();
    assert_eq!(
        per_pid,
        vec![(10, 0, 12), (12, 0, 1)],
        "expected one sample per process and stack"
    );
}

#[test]
fn series_beyond_the_bound_are_pushed_as_one() {
    let hot = stack("hot");
    let samples = (0..MAX_SERIES as u32 + 40)
        .map(|pid| {
            sample(
                pid + 1,
                pid + 1,
                &format!("proc{pid}"),
                None,
                &hot,
                u64::from(pid) + 1,
            )
        })
        .collect::<Vec<_>>();
    let total: u64 = samples.iter().map(|sample| sample.count).sum();
    let series = split(&profile(samples), SampleLabels::None);
    assert_eq!(series.len(), MAX_SERIES, "expected the series count bounded");
    let other = series.last().unwrap();
    assert_eq!(&*other.service_name, OTHER_SERVICE);
    // The 41 smallest services (counts 1..=41) went together.
    assert_eq!(other.profile.total_samples(), (1..=41).sum::<u64>());
    assert_eq!(
        series
            .iter()
            .map(|series| series.profile.total_samples())
            .sum::<u64>(),
        total,
        "no sample may be lost to the bound"
    );
}
