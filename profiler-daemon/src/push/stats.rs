//! Per-target push counters, written by the target's sender and read by
//! /metrics.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Debug, Default)]
pub struct TargetStats {
    /// `backend URL`, as the `target` label.
    pub name: String,
    /// Attempts by outcome.
    pub accepted: AtomicU64,
    pub failed: AtomicU64,
    pub refused: AtomicU64,
    /// Request bytes the target accepted.
    pub bytes: AtomicU64,
    /// Windows given up: to stay within the spool's bound, or refused.
    pub dropped_full: AtomicU64,
    pub dropped_refused: AtomicU64,
    /// Samples in the windows given up.
    pub dropped_samples: AtomicU64,
    /// Samples the target accepted.
    pub samples: AtomicU64,
    /// The queue now (the window in flight included).
    pub queued_windows: AtomicU64,
    pub queued_bytes: AtomicU64,
    /// Start of the oldest queued window (Unix ms), 0 with none.
    pub oldest_queued_ms: AtomicU64,
    /// When a push was last accepted (Unix ms), 0 before the first.
    pub last_accepted_ms: AtomicU64,
    /// CPU time spent encoding the windows handed to this target (shared
    /// with the other targets of its backend: each window is encoded once
    /// per backend).
    pub encode_cpu_ns: AtomicU64,
}

/// A copy of one target's counters, for one scrape.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetSnapshot {
    pub name: String,
    pub accepted: u64,
    pub failed: u64,
    pub refused: u64,
    pub bytes: u64,
    pub dropped_full: u64,
    pub dropped_refused: u64,
    pub dropped_samples: u64,
    pub samples: u64,
    pub queued_windows: u64,
    pub queued_bytes: u64,
    pub oldest_queued_ms: u64,
    pub last_accepted_ms: u64,
    pub encode_cpu_ns: u64,
}

impl TargetStats {
    pub fn new(name: String) -> Self {
        Self {
            name,
            ..Self::default()
        }
    }

    pub fn snapshot(&self) -> TargetSnapshot {
        TargetSnapshot {
            name: self.name.clone(),
            accepted: self.accepted.load(Relaxed),
            failed: self.failed.load(Relaxed),
            refused: self.refused.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            dropped_full: self.dropped_full.load(Relaxed),
            dropped_refused: self.dropped_refused.load(Relaxed),
            dropped_samples: self.dropped_samples.load(Relaxed),
            samples: self.samples.load(Relaxed),
            queued_windows: self.queued_windows.load(Relaxed),
            queued_bytes: self.queued_bytes.load(Relaxed),
            oldest_queued_ms: self.oldest_queued_ms.load(Relaxed),
            last_accepted_ms: self.last_accepted_ms.load(Relaxed),
            encode_cpu_ns: self.encode_cpu_ns.load(Relaxed),
        }
    }
}
