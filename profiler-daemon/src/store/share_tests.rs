//! Shares of a full store (issue 30): one user's storm takes its own oldest
//! samples, not everyone's history.

use std::time::Duration;

use super::{
    LOSS_REASONS, Store, StoreConfig,
    room::{OVER_SHARE, REFUSED, STORE_FULL},
    tests::{all, sample, stack},
};
use crate::{collect::ReadableBy, profile::Filter, shares::Owner, symbolize::SymbolizedSample};

const ROOT_PID: u32 = 10;
const STORMER_PID: u32 = 20;
const STORMER: Owner = Owner::User(1020);
/// Full within a minute of the storm; a drain's bucket, one root entry and
/// its stack are far within root's part of it.
const MAX: usize = 512 * 1024;

fn store(user_share_percent: u64) -> Store {
    Store::new(
        StoreConfig {
            retention: Duration::from_secs(3600),
            max_bytes: MAX,
            user_share_percent,
        },
        99,
    )
}

/// A root process's one sample of the second.
fn root_sample() -> SymbolizedSample {
    SymbolizedSample {
        readable_by: ReadableBy::User(0),
        ..sample(ROOT_PID, ROOT_PID, "rootd", &stack(&["root_work", "main"]), 1)
    }
}

/// A storm's second: 40 threads, each in a stack of its own this second.
fn storm(second: u64) -> Vec<SymbolizedSample> {
    (0..40u32)
        .map(|tid| {
            let frame = format!("wait_{}", (second + u64::from(tid)) % 97);
            sample(STORMER_PID, 1000 + tid, "storm", &stack(&[&frame, "main"]), 1)
        })
        .collect()
}

fn kept(store: &Store, pid: u32) -> u64 {
    store
        .query(&all(Filter {
            pids: vec![pid],
            ..Filter::default()
        }))
        .total_samples()
}

fn check_accounting(store: &Store) {
    let stats = store.stats();
    assert!(stats.bytes <= MAX, "{} bytes over the {MAX} bound", stats.bytes);
    assert_eq!(
        stats.samples_ingested,
        stats.samples_evicted + stats.samples_expired + store.query(&all(Filter::default())).total_samples(),
        "every sample is either kept or counted as evicted or expired"
    );
    let lost: u64 = stats.losses.series().iter().map(|(_, _, count)| count).sum();
    assert_eq!(lost, stats.samples_evicted, "every eviction is some owner's loss");
}

#[test]
fn a_users_storm_leaves_roots_whole_history() {
    let mut store = store(50);
    for second in 0..300u64 {
        let mut samples = storm(second);
        samples.push(root_sample());
        store.ingest((second + 1) * 1000, &samples);
    }
    check_accounting(&store);
    assert_eq!(
        kept(&store, ROOT_PID),
        300,
        "root's history is whole; losses: {:?}",
        store.stats().losses.series()
    );
    let losses = store.stats().losses;
    assert!(
        losses.of(STORMER, OVER_SHARE) > 0,
        "the storm lost its own oldest"
    );
    assert_eq!(losses.of(Owner::Privileged, OVER_SHARE), 0);
    assert_eq!(losses.of(Owner::Privileged, STORE_FULL), 0);
    assert_eq!(losses.of(Owner::Privileged, REFUSED), 0);
    assert_eq!(LOSS_REASONS[OVER_SHARE], "over_share");
}

#[test]
fn without_shares_the_storm_took_roots_history() {
    // What the default replaced: a user may hold it all, and everyone's
    // oldest go together.
    let mut store = store(100);
    for second in 0..300u64 {
        let mut samples = storm(second);
        samples.push(root_sample());
        store.ingest((second + 1) * 1000, &samples);
    }
    check_accounting(&store);
    assert!(
        kept(&store, ROOT_PID) < 150,
        "root kept {}",
        kept(&store, ROOT_PID)
    );
    let losses = store.stats().losses;
    let root_lost = losses.of(Owner::Privileged, STORE_FULL) + losses.of(Owner::Privileged, OVER_SHARE);
    assert!(root_lost > 0, "root lost its oldest: {:?}", losses.series());
}

#[test]
fn a_user_alone_uses_the_whole_store_as_before() {
    let mut shared = store(50);
    let mut whole = store(100);
    for second in 0..300u64 {
        shared.ingest((second + 1) * 1000, &storm(second));
        whole.ingest((second + 1) * 1000, &storm(second));
    }
    check_accounting(&shared);
    assert_eq!(
        kept(&shared, STORMER_PID),
        kept(&whole, STORMER_PID),
        "alone, a user borrows all the room nobody else needs"
    );
    assert!(shared.stats().bytes > MAX * 9 / 10, "the store is full of it");
}

#[test]
fn two_users_keep_their_own_shares() {
    let mut store = store(40);
    let quiet_pid = 30;
    for second in 0..300u64 {
        let mut samples = storm(second);
        samples.push(sample(
            quiet_pid,
            quiet_pid,
            "quiet",
            &stack(&["quiet", "main"]),
            2,
        ));
        store.ingest((second + 1) * 1000, &samples);
    }
    check_accounting(&store);
    assert_eq!(kept(&store, quiet_pid), 600, "the quiet user's history is whole");
    assert_eq!(store.stats().losses.of(Owner::User(1030), OVER_SHARE), 0);
}

#[test]
fn expiry_is_no_loss() {
    let mut store = Store::new(
        StoreConfig {
            retention: Duration::from_secs(10),
            ..StoreConfig::default()
        },
        99,
    );
    for second in 0..30u64 {
        store.ingest((second + 1) * 1000, &storm(second));
    }
    let stats = store.stats();
    assert!(stats.samples_expired > 0);
    assert_eq!(stats.samples_evicted, 0);
    assert!(stats.losses.series().is_empty(), "{:?}", stats.losses.series());
}

#[test]
fn a_storm_larger_than_the_store_in_one_drain_leaves_roots_history() {
    let mut store = store(50);
    for second in 0..60u64 {
        // Deep, distinct stacks: one drain's worth is several times the bound.
        let mut samples: Vec<SymbolizedSample> = (0..400u32)
            .map(|tid| {
                let frames: Vec<String> = (0..60).map(|depth| format!("f{second}_{tid}_{depth}")).collect();
                let frames: Vec<&str> = frames.iter().map(String::as_str).collect();
                sample(STORMER_PID, 1000 + tid, "storm", &stack(&frames), 1)
            })
            .collect();
        // Root's sample comes last, when the storm has taken all there was.
        samples.push(root_sample());
        store.ingest((second + 1) * 1000, &samples);
        assert!(
            store.stats().bytes <= MAX,
            "{} bytes at second {second}",
            store.stats().bytes
        );
    }
    check_accounting(&store);
    assert_eq!(kept(&store, ROOT_PID), 60, "{:?}", store.stats().losses.series());
    assert!(
        store.stats().losses.of(STORMER, REFUSED) > 0,
        "the storm's own excess was refused"
    );
}

#[test]
fn an_owner_over_its_share_takes_only_from_itself() {
    // Another user's history, a little over its share, stays whole while
    // the storm, over its own too (though by less), keeps on.
    let mut store = store(40);
    let other_pid = 30;
    let other = Owner::User(1030);
    for second in 0..300u64 {
        let mut samples = storm(second);
        if second < 60 {
            samples = (0..44u32)
                .map(|tid| sample(other_pid, 100 + tid, "other", &stack(&["other", "main"]), 1))
                .collect();
        }
        store.ingest((second + 1) * 1000, &samples);
    }
    check_accounting(&store);
    let losses = store.stats().losses;
    assert!(losses.of(STORMER, OVER_SHARE) > 0);
    assert_eq!(kept(&store, other_pid), 60 * 44, "{:?}", losses.series());
    assert_eq!(losses.of(other, OVER_SHARE) + losses.of(other, STORE_FULL), 0);
}
