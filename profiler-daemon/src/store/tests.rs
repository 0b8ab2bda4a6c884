use std::{sync::Arc, time::Duration};

use super::*;
use crate::{
    profile::Filter,
    symbolize::{SymbolizedSample, SymbolizedStack},
};

pub(super) fn stack(names: &[&str]) -> Arc<SymbolizedStack> {
    crate::symbolize::user_stack(names)
}

pub(super) fn sample(
    pid: u32,
    tid: u32,
    comm: &str,
    stack: &Arc<SymbolizedStack>,
    count: u64,
) -> SymbolizedSample {
    SymbolizedSample {
        pid,
        tid,
        comm: comm.into(),
        readable_by: ReadableBy::User(pid + 1000),
        thread_name: comm.into(),
        stack: stack.clone(),
        count,
        kind: SampleKind::Cpu,
        amount: count * 10_000_000,
        cgroup: None,
        ns_pid: None,
    }
}

fn store(retention_secs: u64, max_bytes: usize) -> Store {
    Store::new(
        StoreConfig {
            retention: Duration::from_secs(retention_secs),
            max_bytes,
            ..StoreConfig::default()
        },
        99,
    )
}

pub(super) fn all(filter: Filter) -> Query {
    Query {
        window: Window::ALL,
        filter,
        visible: Visible::All,
        profile_type: ProfileType::Cpu,
    }
}

#[test]
fn aggregates_equal_keys_across_buckets_and_within_a_batch() {
    let mut store = store(300, 1 << 20);
    let a = stack(&["hot_a", "main"]);
    // The same stack content arriving as distinct Arcs must still merge.
    let a_again = stack(&["hot_a", "main"]);
    store.ingest(
        100_000,
        &[sample(1, 1, "w", &a, 3), sample(1, 1, "w", &a_again, 2)],
    );
    store.ingest(101_000, &[sample(1, 1, "w", &a, 5)]);
    let profile = store.query(&all(Filter::default()));
    assert_eq!(
        profile.samples.len(),
        1,
        "one key expected, got {:?}",
        profile.samples
    );
    assert_eq!(profile.samples[0].count, 10);
    assert_eq!(store.stats().stacks, 1, "stack content must be interned once");
}

#[test]
fn window_selects_buckets() {
    let mut store = store(300, 1 << 20);
    let a = stack(&["a"]);
    for second in 100..110 {
        store.ingest(second * 1000, &[sample(1, 1, "w", &a, 1)]);
    }
    let last3 = store.query(&Query {
        window: Window::last(3, 109_000),
        filter: Filter::default(),
        visible: Visible::All,
        profile_type: ProfileType::Cpu,
    });
    assert_eq!(
        last3.total_samples(),
        3,
        "drains at 107, 108, 109 s expected (106 s is 3 s before)"
    );
    let between = store.query(&Query {
        window: Window::between_drains(104_000, 106_000),
        filter: Filter::default(),
        visible: Visible::All,
        profile_type: ProfileType::Cpu,
    });
    assert_eq!(
        between.total_samples(),
        2,
        "drains after 104 s up to 106 s: 105 and 106"
    );
    assert_eq!(
        between.window,
        Window {
            start_ms: 104_001,
            end_ms: 106_001
        }
    );
    assert_eq!(
        between.samples[0].amount, 20_000_000,
        "CPU time adds up like counts"
    );
    let all = store.query(&all(Filter::default()));
    assert_eq!(
        all.window,
        Window {
            start_ms: 0,
            end_ms: 109_001
        },
        "an open end is clipped to the last drain"
    );
}

#[test]
fn filters_or_within_and_across() {
    let mut store = store(300, 1 << 20);
    let s = stack(&["f"]);
    store.ingest(
        10,
        &[
            sample(1, 11, "alpha", &s, 1),
            sample(1, 12, "alpha", &s, 2),
            sample(2, 21, "beta", &s, 4),
            sample(3, 31, "gamma", &s, 8),
        ],
    );
    let pids = |pids: Vec<u32>| Filter {
        pids,
        ..Filter::default()
    };
    assert_eq!(store.query(&all(pids(vec![1]))).total_samples(), 3);
    assert_eq!(store.query(&all(pids(vec![1, 3]))).total_samples(), 11);
    let and = Filter {
        pids: vec![1, 2],
        tids: vec![12, 21],
        comms: vec!["beta".into()],
        ..Filter::default()
    };
    assert_eq!(
        store.query(&all(and)).total_samples(),
        4,
        "pid∈{{1,2}} ∧ tid∈{{12,21}} ∧ comm=beta"
    );
    assert_eq!(store.query(&all(pids(vec![99]))).total_samples(), 0);
}

#[test]
fn retention_expires_old_buckets_and_frees_stacks() {
    let mut store = store(5, 1 << 20);
    let old = stack(&["old"]);
    let new = stack(&["new"]);
    store.ingest(100_000, &[sample(1, 1, "w", &old, 7)]);
    store.ingest(104_000, &[sample(1, 1, "w", &new, 1)]);
    assert_eq!(store.stats().buckets, 2);
    store.ingest(105_000, &[sample(1, 1, "w", &new, 1)]);
    let stats = store.stats();
    assert_eq!(stats.buckets, 2, "second 100 is outside a 5 s retention at 105");
    assert_eq!(stats.samples_expired, 7);
    assert_eq!(stats.stacks, 1, "the expired bucket's stack must be freed");
}

#[test]
fn memory_bound_evicts_oldest_and_never_exceeds() {
    let max = 16 * 1024;
    let mut store = store(3600, max);
    for second in 0..200u64 {
        let samples: Vec<_> = (0..10u32)
            .map(|tid| sample(1, tid, "w", &stack(&["f", &format!("g{}", second % 7)]), 1))
            .collect();
        store.ingest(second * 1000, &samples);
        assert!(
            store.stats().bytes <= max,
            "{} bytes over the {max} bound at second {second}",
            store.stats().bytes
        );
    }
    let stats = store.stats();
    assert!(stats.samples_evicted > 0, "the bound must have evicted something");
    assert_eq!(
        stats.samples_ingested,
        stats.samples_evicted + stats.samples_expired + store.query(&all(Filter::default())).total_samples(),
        "every sample is either kept or counted as evicted or expired"
    );
}

#[test]
fn has_pid_looks_only_inside_the_window() {
    let mut store = store(300, 1 << 20);
    store.ingest(50_000, &[sample(42, 42, "w", &stack(&["f"]), 1)]);
    assert!(store.has_pid(42, Window::ALL, Visible::All, ProfileType::Cpu));
    assert!(!store.has_pid(
        42,
        Window {
            start_ms: 51_000,
            end_ms: 60_000
        },
        Visible::All,
        ProfileType::Cpu
    ));
    assert!(!store.has_pid(43, Window::ALL, Visible::All, ProfileType::Cpu));
}

#[test]
fn a_caller_sees_only_the_samples_it_may_read() {
    let mut store = store(300, 1 << 20);
    let f = stack(&["f"]);
    let mut unknown = sample(7, 7, "gone", &f, 4);
    unknown.readable_by = ReadableBy::Privileged;
    // sample() makes pid P readable by uid P + 1000.
    store.ingest(
        50_000,
        &[sample(1, 1, "a", &f, 1), sample(2, 2, "b", &f, 2), unknown],
    );
    let pids = |visible| {
        let mut query = all(Filter::default());
        query.visible = visible;
        let mut pids: Vec<u32> = store.query(&query).samples.iter().map(|s| s.pid).collect();
        pids.sort_unstable();
        pids
    };
    assert_eq!(pids(Visible::All), vec![1, 2, 7]);
    assert_eq!(pids(Visible::User(1002)), vec![2]);
    assert_eq!(pids(Visible::User(5)), Vec::<u32>::new());
    assert!(store.has_pid(2, Window::ALL, Visible::User(1002), ProfileType::Cpu));
    assert!(!store.has_pid(1, Window::ALL, Visible::User(1002), ProfileType::Cpu));
    assert!(!store.has_pid(7, Window::ALL, Visible::User(1002), ProfileType::Cpu));
    assert!(store.has_pid(7, Window::ALL, Visible::All, ProfileType::Cpu));
}

#[test]
fn unit_cgroup_and_container_filters_and_the_cgroups_a_caller_may_see() {
    let mut store = store(300, 1 << 20);
    let s = stack(&["f"]);
    let id = "4f1e0c2ab3d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f";
    let in_cgroup = |pid, path: &str, count| SymbolizedSample {
        cgroup: Some(Arc::new(crate::cgroup::Cgroup::from_path(path))),
        ..sample(pid, pid, "w", &s, count)
    };
    store.ingest(
        10,
        &[
            in_cgroup(1, "/system.slice/nginx.service", 1),
            in_cgroup(2, "/system.slice/nginx.service", 2),
            in_cgroup(3, &format!("/system.slice/docker-{id}.scope"), 4),
            in_cgroup(4, "/user.slice/user-1000.slice/session-3.scope", 8),
            sample(5, 5, "unnamed", &s, 16),
        ],
    );
    let total = |filter: Filter| store.query(&all(filter)).total_samples();
    let units = |units: &[&str]| Filter {
        units: units.iter().map(|unit| (*unit).to_owned()).collect(),
        ..Filter::default()
    };
    assert_eq!(total(units(&["nginx.service"])), 3);
    assert_eq!(total(units(&["nginx.service", "session-3.scope"])), 11);
    assert_eq!(total(units(&["nginx"])), 0, "exact names only");
    let cgroups = |prefixes: &[&str]| Filter {
        cgroups: prefixes.iter().map(|prefix| (*prefix).to_owned()).collect(),
        ..Filter::default()
    };
    assert_eq!(total(cgroups(&["/system.slice"])), 7);
    assert_eq!(
        total(cgroups(&["/"])),
        15,
        "the root holds every named cgroup, not unnamed ones"
    );
    assert_eq!(total(cgroups(&["/system"])), 0, "whole components");
    let containers = Filter {
        containers: vec![id.to_owned()],
        ..Filter::default()
    };
    assert_eq!(total(containers), 4);
    // AND across filters.
    let both = Filter {
        pids: vec![1, 3],
        ..units(&["nginx.service"])
    };
    assert_eq!(total(both), 1);
    // Each caller sees the cgroups of the processes it may see (uid = pid + 1000).
    assert_eq!(store.cgroups(Visible::All).len(), 3);
    let own = store.cgroups(Visible::User(1004));
    assert_eq!(own.len(), 1);
    assert_eq!(own[0].unit.as_deref(), Some("session-3.scope"));
    assert!(
        store.cgroups(Visible::User(1005)).is_empty(),
        "unnamed: no cgroup"
    );
}

/// A CPU sample and off-CPU waits of one stack and thread.
fn mixed_store() -> Store {
    let mut store = store(300, 1 << 20);
    let f = stack(&["f", "main"]);
    let wait = |kind, count, ns| SymbolizedSample {
        kind,
        amount: ns,
        ..sample(1, 1, "w", &f, count)
    };
    store.ingest(
        10_000,
        &[
            sample(1, 1, "w", &f, 3),
            wait(SampleKind::OffCpuBlocked, 2, 500_000_000),
            wait(SampleKind::OffCpuRunnable, 1, 7_000_000),
        ],
    );
    // A process that only waited.
    store.ingest(
        11_000,
        &[SymbolizedSample {
            kind: SampleKind::OffCpuBlocked,
            amount: 1_000,
            ..sample(2, 2, "sleeper", &f, 1)
        }],
    );
    store
}

#[test]
fn a_query_keeps_the_kinds_its_type_includes() {
    let store = mixed_store();
    let of_type = |profile_type| {
        let profile = store.query(&Query {
            profile_type,
            ..all(Filter::default())
        });
        assert_eq!(profile.profile_type, profile_type, "the profile says its type");
        let mut kinds: Vec<(u32, SampleKind, u64, u64)> = profile
            .samples
            .iter()
            .map(|sample| (sample.pid, sample.kind, sample.count, sample.amount))
            .collect();
        kinds.sort_unstable();
        kinds
    };
    use SampleKind::{Cpu, OffCpuBlocked, OffCpuRunnable};
    assert_eq!(of_type(ProfileType::Cpu), vec![(1, Cpu, 3, 30_000_000)]);
    assert_eq!(
        of_type(ProfileType::OffCpu),
        vec![
            (1, OffCpuBlocked, 2, 500_000_000),
            (1, OffCpuRunnable, 1, 7_000_000),
            (2, OffCpuBlocked, 1, 1_000)
        ]
    );
    let wall = of_type(ProfileType::Wall);
    assert_eq!(
        wall.len(),
        4,
        "CPU samples and waits stay separate samples: {wall:?}"
    );
    let stack_ns: u64 = wall.iter().filter(|s| s.0 == 1).map(|s| s.3).sum();
    assert_eq!(
        stack_ns,
        30_000_000 + 500_000_000 + 7_000_000,
        "wall = CPU ns + off-CPU ns"
    );
}

#[test]
fn entries_and_pids_are_counted_per_type() {
    let store = mixed_store();
    assert_eq!(store.entries_in(Window::ALL, ProfileType::Cpu), 1);
    assert_eq!(store.entries_in(Window::ALL, ProfileType::OffCpu), 3);
    assert_eq!(store.entries_in(Window::ALL, ProfileType::Wall), 4);
    assert!(store.has_pid(2, Window::ALL, Visible::All, ProfileType::OffCpu));
    assert!(store.has_pid(2, Window::ALL, Visible::All, ProfileType::Wall));
    assert!(
        !store.has_pid(2, Window::ALL, Visible::All, ProfileType::Cpu),
        "pid 2 only waited"
    );
}
