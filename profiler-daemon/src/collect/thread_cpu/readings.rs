//! The ledger's boundary with what it reads and tells: the threads a
//! drain read (from /proc and the sampler's exits, see [`super::read`]),
//! and what the sampler is told afterwards.

use profiler_common::{COMM_LEN, ThreadExit};

/// One process's threads as read at a drain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessReading {
    pub threads: Vec<ThreadReading>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadReading {
    pub tid: u32,
    /// `se.sum_exec_runtime`, ns; None when it could not be read (the
    /// thread is then left as it was).
    pub runtime_ns: Option<u64>,
    /// Read for threads the ledger does not know yet.
    pub new: Option<NewThread>,
}

/// What is read of a thread the ledger meets for the first time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewThread {
    pub comm: [u8; COMM_LEN],
    /// Started since the previous drain's reads: none of its CPU was
    /// credited but by its samples (whose first carries all its time).
    /// None: unknown.
    pub started_since_previous: Option<bool>,
    /// Its runtime at its last sample (the sampler's THREAD_TIMES), if any.
    pub sampled_ns: Option<u64>,
}

/// What a drain read: each process to read (None: gone), and the exits
/// recorded since the previous drain, by tid.
#[derive(Debug, Default)]
pub struct Readings {
    pub processes: Vec<(u32, Option<ProcessReading>)>,
    pub exits: Vec<(u32, ThreadExit)>,
    /// Processes whose threads grew past what may be read: no longer followed.
    pub too_many: Vec<u32>,
}

/// What the sampler is told after a drain (see [`super::CpuLedger::take_changes`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub started: Vec<u32>,
    pub stopped: Vec<u32>,
    /// (tid, CPU time it was credited up to): its sampling baseline.
    pub credited: Vec<(u32, u64)>,
}
