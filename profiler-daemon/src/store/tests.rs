use std::{sync::Arc, time::Duration};

use super::*;
use crate::symbolize::{FrameKind, Function, Line, Location, SymbolizedSample, SymbolizedStack};

fn stack(names: &[&str]) -> Arc<SymbolizedStack> {
    Arc::new(SymbolizedStack {
        locations: names
            .iter()
            .map(|name| Location {
                kind: FrameKind::User,
                address: 0x1000,
                mapping: None,
                lines: Arc::new([Line {
                    function: Arc::new(Function {
                        name: (*name).into(),
                        system_name: (*name).into(),
                        filename: None,
                    }),
                    line: 0,
                }]),
                resolved: true,
            })
            .collect(),
    })
}

fn sample(pid: u32, tid: u32, comm: &str, stack: &Arc<SymbolizedStack>, count: u64) -> SymbolizedSample {
    SymbolizedSample {
        pid,
        tid,
        comm: comm.into(),
        thread_name: comm.into(),
        stack: stack.clone(),
        count,
    }
}

fn store(retention_secs: u64, max_bytes: usize) -> Store {
    Store::new(
        StoreConfig {
            retention: Duration::from_secs(retention_secs),
            max_bytes,
        },
        99,
    )
}

fn all(filter: Filter) -> Query {
    Query {
        window: Window::ALL,
        filter,
    }
}

fn count_of(profile: &Profile, pid: u32) -> u64 {
    profile
        .samples
        .iter()
        .filter(|s| s.pid == pid)
        .map(|s| s.count)
        .sum()
}

#[test]
fn aggregates_equal_keys_across_buckets_and_within_a_batch() {
    let mut store = store(300, 1 << 20);
    let a = stack(&["hot_a", "main"]);
    // The same stack content arriving as distinct Arcs must still merge.
    let a_again = stack(&["hot_a", "main"]);
    store.ingest(100, &[sample(1, 1, "w", &a, 3), sample(1, 1, "w", &a_again, 2)]);
    store.ingest(101, &[sample(1, 1, "w", &a, 5)]);
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
        store.ingest(second, &[sample(1, 1, "w", &a, 1)]);
    }
    let last3 = store.query(&Query {
        window: Window::last(3, 109),
        filter: Filter::default(),
    });
    assert_eq!(last3.total_samples(), 3, "seconds 107, 108, 109 expected");
    assert_eq!(last3.window, Window { start: 107, end: 110 });
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
    store.ingest(100, &[sample(1, 1, "w", &old, 7)]);
    store.ingest(104, &[sample(1, 1, "w", &new, 1)]);
    assert_eq!(store.stats().buckets, 2);
    store.ingest(105, &[sample(1, 1, "w", &new, 1)]);
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
        store.ingest(second, &samples);
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
        stats.samples_evicted + store.query(&all(Filter::default())).total_samples(),
        "every sample is either kept or counted as evicted"
    );
    assert!(
        store
            .query(&all(Filter::default()))
            .samples
            .iter()
            .all(|s| s.count == 1)
    );
}

#[test]
fn has_pid_looks_only_inside_the_window() {
    let mut store = store(300, 1 << 20);
    store.ingest(50, &[sample(42, 42, "w", &stack(&["f"]), 1)]);
    assert!(store.has_pid(42, Window::ALL));
    assert!(!store.has_pid(42, Window { start: 51, end: 60 }));
    assert!(!store.has_pid(43, Window::ALL));
}
