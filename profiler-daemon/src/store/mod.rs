//! Stage 3: the bounded, time-bucketed store of symbolized samples.
//!
//! One bucket per drain (about a second apart; on-demand drains add more),
//! stamped with the drain's time in milliseconds and holding counts and
//! nanoseconds per (kind, pid, tid, comm, thread name, stack); stacks are
//! interned. A query keeps the kinds its profile type includes; a wall
//! profile keeps a stack's CPU samples and its off-CPU waits as separate
//! samples (their kinds differ), whose nanoseconds add up to its wall time.
//! A window of drains is therefore exact: what a reader asks for between two
//! drains is precisely what was sampled between them. Buckets older than the retention go, and so
//! do the oldest samples whenever the approximate memory use passes the
//! bound: first those of whoever is over their share of it (see [`room`]).

mod actor;
pub mod metrics;
mod query;
mod room;
mod stacks;

use std::{collections::HashMap, collections::VecDeque, sync::Arc, time::Duration};

pub use actor::{StoreClosed, StoreHandle, spawn};
pub use query::{Query, Visible};

use crate::{
    cgroup::Cgroup,
    collect::ReadableBy,
    kind::{ProfileType, SampleKind},
    profile::{Profile, Window},
    shares::{DEFAULT_USER_SHARE_PERCENT, Owner, Shares},
    symbolize::{SymbolizedSample, SymbolizedStack},
};
pub use room::{LOSS_REASONS, StoreLosses};
use stacks::{StackId, StackTable};

/// Approximate bytes of one bucket entry (key, value and hash table overhead).
const ENTRY_BYTES: usize = 96;
const BUCKET_BYTES: usize = 128;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    pub retention: Duration,
    pub max_bytes: usize,
    /// The percentage of `max_bytes` each non-root user keeps when the store
    /// is full (`store_user_share_percent`).
    pub user_share_percent: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(300),
            max_bytes: 64 << 20,
            user_share_percent: DEFAULT_USER_SHARE_PERCENT,
        }
    }
}

/// Cumulative store counters and current sizes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub samples_ingested: u64,
    /// Samples that aged out of the retention window.
    pub samples_expired: u64,
    /// Samples evicted early, or refused, to stay under the memory bound.
    pub samples_evicted: u64,
    pub bytes: usize,
    pub buckets: usize,
    pub stacks: usize,
    /// Samples each owner lost to the bound, per reason ([`LOSS_REASONS`]).
    pub losses: StoreLosses,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct EntryKey {
    kind: SampleKind,
    pid: u32,
    tid: u32,
    comm: Arc<str>,
    readable_by: ReadableBy,
    thread_name: Arc<str>,
    stack: StackId,
    cgroup: Option<Arc<Cgroup>>,
    ns_pid: Option<u32>,
}

impl EntryKey {
    fn of(sample: &SymbolizedSample, stack: StackId) -> Self {
        Self {
            kind: sample.kind,
            pid: sample.pid,
            tid: sample.tid,
            comm: sample.comm.clone(),
            readable_by: sample.readable_by,
            thread_name: sample.thread_name.clone(),
            stack,
            cgroup: sample.cgroup.clone(),
            ns_pid: sample.ns_pid,
        }
    }
}

/// Samples (or waits) and nanoseconds, as the entry's kind counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Totals {
    count: u64,
    amount: u64,
}

struct Bucket {
    time_ms: u64,
    entries: HashMap<EntryKey, Totals>,
    /// Entries per owner, to find an owner's oldest without a scan.
    owners: HashMap<Owner, usize>,
}

impl Bucket {
    fn new(time_ms: u64) -> Self {
        Self {
            time_ms,
            entries: HashMap::new(),
            owners: HashMap::new(),
        }
    }
}

pub struct Store {
    config: StoreConfig,
    frequency: u64,
    alloc_interval: u64,
    buckets: VecDeque<Bucket>,
    stacks: StackTable,
    entry_count: usize,
    shares: Shares,
    /// Bytes charged to each owner: its entries and the stacks it brought in.
    owner_bytes: HashMap<Owner, usize>,
    stats: StoreStats,
    /// `stats` as /metrics reads them, published at every change.
    shared: Arc<metrics::SharedStats>,
}

impl Store {
    pub fn new(config: StoreConfig, frequency: u64) -> Self {
        Self {
            config,
            frequency,
            alloc_interval: 0,
            buckets: VecDeque::new(),
            stacks: StackTable::default(),
            entry_count: 0,
            shares: Shares::new(config.max_bytes as u64, config.user_share_percent),
            owner_bytes: HashMap::new(),
            stats: StoreStats::default(),
            shared: Arc::default(),
        }
    }

    /// The allocation probes' sampling interval, which allocation profiles
    /// are scaled by.
    pub fn with_alloc_interval(mut self, bytes: u64) -> Self {
        self.alloc_interval = bytes;
        self
    }

    pub fn config(&self) -> StoreConfig {
        self.config
    }

    /// Adds the samples of a drain at `time_ms` (Unix milliseconds), then
    /// enforces retention.
    pub fn ingest(&mut self, time_ms: u64, samples: &[SymbolizedSample]) {
        self.expire(time_ms);
        // Drains arrive in time order; a clock step back lands in the newest bucket.
        if self.buckets.back().is_none_or(|bucket| bucket.time_ms < time_ms) {
            self.buckets.push_back(Bucket::new(time_ms));
        }
        // Each distinct stack Arc of the batch is looked up by content once;
        // an id cached here may have been freed (and reused) by an eviction
        // since, hence the check. The batch holds no reference of its own: a
        // storm's stacks must not stay pinned while its entries are evicted.
        let mut batch_ids: HashMap<*const SymbolizedStack, StackId> = HashMap::new();
        for sample in samples {
            self.stats.samples_ingested += sample.count;
            let owner = Owner::from(sample.readable_by);
            let pointer = Arc::as_ptr(&sample.stack);
            let known = batch_ids
                .get(&pointer)
                .copied()
                .filter(|&id| {
                    self.stacks
                        .get(id)
                        .is_some_and(|stack| Arc::ptr_eq(stack, &sample.stack) || **stack == *sample.stack)
                })
                .or_else(|| self.stacks.id_of(&sample.stack));
            let stored = match known {
                Some(id) => {
                    batch_ids.insert(pointer, id);
                    let key = EntryKey::of(sample, id);
                    let bucket = self.buckets.back_mut().expect("a bucket was pushed above");
                    if let Some(totals) = bucket.entries.get_mut(&key) {
                        totals.count += sample.count;
                        totals.amount += sample.amount;
                        continue;
                    }
                    // The new entry's reference, taken first: making room
                    // must not free the stack under it.
                    self.stacks.add_ref(id);
                    let room = self.make_room(owner, ENTRY_BYTES);
                    if !room {
                        self.release_stack(id);
                    }
                    room.then_some(key)
                }
                None => {
                    let bytes = sample.stack.approx_bytes();
                    self.make_room(owner, ENTRY_BYTES + bytes).then(|| {
                        let (id, new) = self.stacks.acquire(&sample.stack, owner);
                        if new {
                            self.charge(owner, bytes);
                        }
                        batch_ids.insert(pointer, id);
                        EntryKey::of(sample, id)
                    })
                }
            };
            let Some(key) = stored else {
                self.stats.samples_evicted += sample.count;
                self.stats.losses.add(owner, room::REFUSED, sample.count);
                continue;
            };
            let bucket = self
                .buckets
                .back_mut()
                .expect("make_room keeps the newest bucket");
            bucket.entries.insert(
                key,
                Totals {
                    count: sample.count,
                    amount: sample.amount,
                },
            );
            *bucket.owners.entry(owner).or_default() += 1;
            self.entry_count += 1;
            self.charge(owner, ENTRY_BYTES);
        }
        self.refresh_stats();
    }

    /// Drops buckets that fell out of the retention window as of `now_ms`.
    pub fn expire(&mut self, now_ms: u64) {
        let retention_ms = u64::try_from(self.config.retention.as_millis()).unwrap_or(u64::MAX);
        // Kept: drains in (now - retention, now].
        let oldest_kept = now_ms.saturating_sub(retention_ms);
        while self
            .buckets
            .front()
            .is_some_and(|bucket| bucket.time_ms <= oldest_kept)
        {
            let count = self.pop_oldest(None);
            self.stats.samples_expired += count;
        }
        self.refresh_stats();
    }

    /// Aggregates the window's samples that pass the filter.
    pub fn query(&self, query: &Query) -> Profile {
        let mut totals: HashMap<&EntryKey, Totals> = HashMap::new();
        // The drain before the window's first one marks where its samples begin.
        let mut begins = None;
        let mut last = None;
        for bucket in &self.buckets {
            if bucket.time_ms < query.window.start_ms {
                begins = Some(bucket.time_ms);
                continue;
            }
            if !query.window.contains(bucket.time_ms) {
                continue;
            }
            last = Some(bucket.time_ms);
            for (key, value) in &bucket.entries {
                if query.profile_type.includes(key.kind)
                    && query.visible.allows(key.readable_by)
                    && query
                        .filter
                        .matches(key.pid, key.tid, &key.comm, key.cgroup.as_deref())
                {
                    let total = totals.entry(key).or_default();
                    total.count += value.count;
                    total.amount += value.amount;
                }
            }
        }
        // The first bucket holds what was sampled since the drain before it:
        // that is where the window really starts. Open ends are clipped to
        // what the store holds.
        let window = Window {
            start_ms: begins.map_or(query.window.start_ms, |ms| ms + 1),
            end_ms: match last {
                Some(last) if query.window.end_ms == u64::MAX => last + 1,
                _ => query.window.end_ms,
            },
        };
        let samples = totals
            .into_iter()
            .filter_map(|(key, totals)| {
                Some(SymbolizedSample {
                    kind: key.kind,
                    pid: key.pid,
                    tid: key.tid,
                    comm: key.comm.clone(),
                    readable_by: key.readable_by,
                    thread_name: key.thread_name.clone(),
                    stack: self.stacks.get(key.stack)?.clone(),
                    count: totals.count,
                    amount: totals.amount,
                    cgroup: key.cgroup.clone(),
                    ns_pid: key.ns_pid,
                })
            })
            .collect();
        Profile {
            window,
            frequency: self.frequency,
            alloc_interval: self.alloc_interval,
            profile_type: query.profile_type,
            samples,
        }
    }

    /// Entries of `profile_type` stored within `window`: an upper bound of
    /// the samples a query of them returns, counted without aggregating.
    pub fn entries_in(&self, window: Window, profile_type: ProfileType) -> usize {
        let buckets = self
            .buckets
            .iter()
            .filter(|bucket| window.contains(bucket.time_ms));
        if SampleKind::ALL
            .into_iter()
            .all(|kind| profile_type.includes(kind))
        {
            // Every kind (wall): the table sizes are the count.
            return buckets.map(|bucket| bucket.entries.len()).sum();
        }
        buckets
            .map(|bucket| {
                bucket
                    .entries
                    .keys()
                    .filter(|key| profile_type.includes(key.kind))
                    .count()
            })
            .sum()
    }

    /// True when any sample of `pid` and `profile_type` that `visible`
    /// allows is stored within `window`.
    pub fn has_pid(&self, pid: u32, window: Window, visible: Visible, profile_type: ProfileType) -> bool {
        self.buckets
            .iter()
            .filter(|bucket| window.contains(bucket.time_ms))
            .any(|bucket| {
                bucket.entries.keys().any(|key| {
                    key.pid == pid && visible.allows(key.readable_by) && profile_type.includes(key.kind)
                })
            })
    }

    /// Every cgroup with samples `visible` allows, over the whole retention,
    /// each once: what cgroup, unit and container filters can select.
    pub fn cgroups(&self, visible: Visible) -> Vec<Arc<Cgroup>> {
        let mut seen: std::collections::HashSet<&Arc<Cgroup>> = std::collections::HashSet::new();
        for bucket in &self.buckets {
            for key in bucket.entries.keys() {
                if let Some(cgroup) = &key.cgroup
                    && visible.allows(key.readable_by)
                {
                    seen.insert(cgroup);
                }
            }
        }
        seen.into_iter().cloned().collect()
    }

    pub fn stats(&self) -> StoreStats {
        self.stats.clone()
    }

    /// The figures this store publishes for /metrics (see [`metrics`]).
    pub fn shared_stats(&self) -> Arc<metrics::SharedStats> {
        self.shared.clone()
    }

    fn bytes(&self) -> usize {
        self.entry_count * ENTRY_BYTES + self.buckets.len() * BUCKET_BYTES + self.stacks.bytes()
    }

    fn refresh_stats(&mut self) {
        self.stats.bytes = self.bytes();
        self.stats.buckets = self.buckets.len();
        self.stats.stacks = self.stacks.len();
        self.shared.publish(&self.stats);
    }
}

#[cfg(test)]
mod share_tests;
#[cfg(test)]
mod tests;
