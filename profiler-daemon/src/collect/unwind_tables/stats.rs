//! What the table manager reports to /metrics.

use std::sync::{
    Mutex,
    atomic::{AtomicU64, Ordering},
};

use profiler_common::{UNWIND_GROUP_CHUNKS, UnwindRowChunk};

use super::charges::TableLosses;
use crate::shares::Owner;

/// Counters and gauges for /metrics.
#[derive(Debug, Default)]
pub struct UnwindStats {
    pub tables_loaded: AtomicU64,
    pub table_failures: AtomicU64,
    pub evictions: AtomicU64,
    /// Tables larger than the whole rows map.
    pub too_large: AtomicU64,
    pub compiles: AtomicU64,
    pub compile_ns: AtomicU64,
    pub rows_loaded: AtomicU64,
    pub chunks_used: AtomicU64,
    pub chunks_total: AtomicU64,
    /// Groups of the rows map created (each `UNWIND_GROUP_CHUNKS` chunks;
    /// kept once created).
    pub groups_created: AtomicU64,
    pub processes: AtomicU64,
    /// Inputs dropped because the manager fell behind (those processes get
    /// frame-pointer stacks until their next snapshot).
    pub inputs_dropped: AtomicU64,
    pub map_errors: AtomicU64,
    /// Tables each owner lost, per reason ([`super::charges::LOSS_REASONS`]).
    /// Locked only to add a count or copy them out, never across anything else.
    pub losses: Mutex<TableLosses>,
}

impl UnwindStats {
    pub fn bytes_used(&self) -> u64 {
        self.chunks_used.load(Ordering::Relaxed) * size_of::<UnwindRowChunk>() as u64
    }

    /// Counts a table lost for `reason` by each of `owners`.
    pub fn lose(&self, owners: &[Owner], reason: usize) {
        // A poisoned lock only means a panic elsewhere mid-count: the counts stand.
        let mut losses = self
            .losses
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for &owner in owners {
            losses.add(owner, reason, 1);
        }
    }

    pub fn losses(&self) -> TableLosses {
        self.losses
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Kernel memory of the rows map's groups created so far.
    pub fn bytes_allocated(&self) -> u64 {
        self.groups_created.load(Ordering::Relaxed)
            * (UNWIND_GROUP_CHUNKS * size_of::<UnwindRowChunk>()) as u64
    }

    pub fn bytes_max(&self) -> u64 {
        self.chunks_total.load(Ordering::Relaxed) * size_of::<UnwindRowChunk>() as u64
    }
}
