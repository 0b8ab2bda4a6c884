//! What a drain reads out of the sampler's maps: raw addresses and counts,
//! not yet symbolized. The boundary between collect and symbolize.

use std::{collections::HashMap, sync::Arc};

use profiler_common::{Counter, SampleKey};

/// One (kind, thread, process instance, stacks) entry of a drained buffer;
/// `key.kind` says what the values measure (see SampleValue).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawSample {
    pub key: SampleKey,
    /// Samples, or waits.
    pub count: u64,
    /// Nanoseconds of CPU, or of waiting.
    pub amount: u64,
}

/// Cumulative BPF counters, summed over CPUs, indexed by `Counter as usize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BpfCounters(pub [u64; Counter::COUNT as usize]);

impl Default for BpfCounters {
    fn default() -> Self {
        Self([0; Counter::COUNT as usize])
    }
}

impl BpfCounters {
    pub fn get(&self, counter: Counter) -> u64 {
        self.0[counter as usize]
    }

    /// Sum of every failure counter.
    pub fn errors(&self) -> u64 {
        Counter::ALL
            .iter()
            .filter(|counter| counter.is_error())
            .map(|&counter| self.get(counter))
            .sum()
    }
}

/// What one drain read: raw addresses, not yet symbolized.
#[derive(Debug, Default)]
pub struct RawBatch {
    pub samples: Vec<RawSample>,
    /// Stack id -> instruction pointers, leaf first.
    pub user_stacks: HashMap<u32, Arc<[u64]>>,
    pub kernel_stacks: HashMap<u32, Arc<[u64]>>,
    pub counters: BpfCounters,
    /// Map read errors skipped during this drain.
    pub read_errors: u64,
    /// How many of `samples` came through the spill ring.
    pub spilled: usize,
    /// Off-CPU waits whose stacks were gone (counted, kept without them).
    pub wait_stacks_lost: u64,
}
