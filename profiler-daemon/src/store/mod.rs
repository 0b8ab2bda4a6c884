//! Stage 3: the bounded, time-bucketed store of symbolized samples.
//!
//! One bucket per second, holding counts per (pid, tid, comm, thread name,
//! stack); stacks are interned. Buckets older than the retention go, and so
//! do the oldest ones whenever the approximate memory use passes the bound.

mod actor;
mod query;
mod stacks;

use std::{collections::HashMap, collections::VecDeque, sync::Arc, time::Duration};

pub use actor::{StoreClosed, StoreHandle, spawn};
pub use query::{Filter, Query, Window};

use crate::{
    profile::Profile,
    symbolize::{SymbolizedSample, SymbolizedStack},
};
use stacks::{StackId, StackTable};

/// Approximate bytes of one bucket entry (key, value and hash table overhead).
const ENTRY_BYTES: usize = 96;
const BUCKET_BYTES: usize = 128;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    pub retention: Duration,
    pub max_bytes: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(300),
            max_bytes: 64 << 20,
        }
    }
}

/// Cumulative store counters and current sizes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub samples_ingested: u64,
    /// Samples that aged out of the retention window.
    pub samples_expired: u64,
    /// Samples evicted early, or refused, to stay under the memory bound.
    pub samples_evicted: u64,
    pub bytes: usize,
    pub buckets: usize,
    pub stacks: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct EntryKey {
    pid: u32,
    tid: u32,
    comm: Arc<str>,
    thread_name: Arc<str>,
    stack: StackId,
}

struct Bucket {
    second: u64,
    entries: HashMap<EntryKey, u64>,
}

pub struct Store {
    config: StoreConfig,
    frequency: u64,
    buckets: VecDeque<Bucket>,
    stacks: StackTable,
    entry_count: usize,
    stats: StoreStats,
}

impl Store {
    pub fn new(config: StoreConfig, frequency: u64) -> Self {
        Self {
            config,
            frequency,
            buckets: VecDeque::new(),
            stacks: StackTable::default(),
            entry_count: 0,
            stats: StoreStats::default(),
        }
    }

    pub fn config(&self) -> StoreConfig {
        self.config
    }

    /// Adds samples drained at unix second `second`, then enforces retention.
    pub fn ingest(&mut self, second: u64, samples: &[SymbolizedSample]) {
        self.expire(second);
        // Drains arrive in time order; a clock step back lands in the newest bucket.
        if self.buckets.back().is_none_or(|bucket| bucket.second < second) {
            self.buckets.push_back(Bucket {
                second,
                entries: HashMap::new(),
            });
        }
        let mut batch_ids: HashMap<*const SymbolizedStack, StackId> = HashMap::new();
        for sample in samples {
            self.stats.samples_ingested += sample.count;
            let key_stack = *batch_ids.entry(Arc::as_ptr(&sample.stack)).or_insert_with(|| {
                // This reference is the batch's own, released at the end of the call.
                self.stacks.acquire(&sample.stack).0
            });
            let key = EntryKey {
                pid: sample.pid,
                tid: sample.tid,
                comm: sample.comm.clone(),
                thread_name: sample.thread_name.clone(),
                stack: key_stack,
            };
            let bucket = self.buckets.back_mut().expect("a bucket was pushed above");
            if let Some(count) = bucket.entries.get_mut(&key) {
                *count += sample.count;
                continue;
            }
            if !self.make_room(ENTRY_BYTES) {
                self.stats.samples_evicted += sample.count;
                continue;
            }
            self.stacks.add_ref(key_stack);
            let bucket = self
                .buckets
                .back_mut()
                .expect("make_room keeps the newest bucket");
            bucket.entries.insert(key, sample.count);
            self.entry_count += 1;
        }
        // Drop the batch's own references; stacks no entry kept are freed.
        for id in batch_ids.into_values() {
            self.stacks.release(id);
        }
        self.refresh_stats();
    }

    /// Drops buckets that fell out of the retention window as of `now`.
    pub fn expire(&mut self, now: u64) {
        let oldest_kept = now.saturating_sub(self.config.retention.as_secs().saturating_sub(1));
        while self
            .buckets
            .front()
            .is_some_and(|bucket| bucket.second < oldest_kept)
        {
            let count = self.pop_oldest();
            self.stats.samples_expired += count;
        }
        self.refresh_stats();
    }

    /// Aggregates the window's samples that pass the filter.
    pub fn query(&self, query: &Query) -> Profile {
        let mut totals: HashMap<&EntryKey, u64> = HashMap::new();
        let mut first = u64::MAX;
        let mut last = 0;
        for bucket in self
            .buckets
            .iter()
            .filter(|bucket| query.window.contains(bucket.second))
        {
            first = first.min(bucket.second);
            last = last.max(bucket.second);
            for (key, count) in &bucket.entries {
                if query.filter.matches(key.pid, key.tid, &key.comm) {
                    *totals.entry(key).or_default() += count;
                }
            }
        }
        let window = if first <= last {
            Window {
                start: query.window.start.max(first.saturating_sub(1)),
                end: query.window.end.min(last + 1),
            }
        } else {
            query.window
        };
        let samples = totals
            .into_iter()
            .filter_map(|(key, count)| {
                Some(SymbolizedSample {
                    pid: key.pid,
                    tid: key.tid,
                    comm: key.comm.clone(),
                    thread_name: key.thread_name.clone(),
                    stack: self.stacks.get(key.stack)?.clone(),
                    count,
                })
            })
            .collect();
        Profile {
            window,
            frequency: self.frequency,
            samples,
        }
    }

    /// True when any sample of `pid` is stored within `window`.
    pub fn has_pid(&self, pid: u32, window: Window) -> bool {
        self.buckets
            .iter()
            .filter(|bucket| window.contains(bucket.second))
            .any(|bucket| bucket.entries.keys().any(|key| key.pid == pid))
    }

    pub fn stats(&self) -> StoreStats {
        self.stats
    }

    fn bytes(&self) -> usize {
        self.entry_count * ENTRY_BYTES + self.buckets.len() * BUCKET_BYTES + self.stacks.bytes()
    }

    /// Evicts the oldest buckets (never the newest) until `extra` more bytes
    /// fit; false if they cannot.
    fn make_room(&mut self, extra: usize) -> bool {
        while self.bytes() + extra > self.config.max_bytes {
            if self.buckets.len() <= 1 {
                return false;
            }
            let count = self.pop_oldest();
            self.stats.samples_evicted += count;
        }
        true
    }

    fn pop_oldest(&mut self) -> u64 {
        let Some(bucket) = self.buckets.pop_front() else {
            return 0;
        };
        let mut count = 0;
        self.entry_count -= bucket.entries.len();
        for (key, value) in bucket.entries {
            count += value;
            self.stacks.release(key.stack);
        }
        count
    }

    fn refresh_stats(&mut self) {
        self.stats.bytes = self.bytes();
        self.stats.buckets = self.buckets.len();
        self.stats.stacks = self.stacks.len();
    }
}

#[cfg(test)]
mod tests;
