//! What the table manager reports to /metrics.

use std::sync::atomic::{AtomicU64, Ordering};

use profiler_common::UnwindRowChunk;

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
    pub processes: AtomicU64,
    /// Inputs dropped because the manager fell behind (those processes get
    /// frame-pointer stacks until their next snapshot).
    pub inputs_dropped: AtomicU64,
    pub map_errors: AtomicU64,
}

impl UnwindStats {
    pub fn bytes_used(&self) -> u64 {
        self.chunks_used.load(Ordering::Relaxed) * size_of::<UnwindRowChunk>() as u64
    }

    pub fn bytes_max(&self) -> u64 {
        self.chunks_total.load(Ordering::Relaxed) * size_of::<UnwindRowChunk>() as u64
    }
}
