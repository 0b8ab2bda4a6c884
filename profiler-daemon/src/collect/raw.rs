//! What a drain reads out of the sampler's maps: raw addresses and counts,
//! not yet symbolized. The boundary between collect and symbolize.

use std::{collections::HashMap, sync::Arc};

use profiler_common::{Counter, SampleKey};

/// The stack id (user and kernel) of CPU a thread used where no sample
/// landed and no stack of its is known yet (see `thread_cpu`): named
/// [`UNSAMPLED_CPU`]. Far from the sampler's ids (>= 0) and errnos (small
/// negatives).
pub const UNSAMPLED_CPU_STACK_ID: i32 = i32::MIN;

/// What the placeholder frame of CPU without any stack says.
pub const UNSAMPLED_CPU: &str = "[cpu between samples]";

/// What one drain's ledger did (summed into the drain stage's metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuCredits {
    /// CPU added where the samples carried less than the kernel accounted.
    pub added_ns: u64,
    /// CPU taken off samples that carried what an earlier drain credited.
    pub taken_back_ns: u64,
    /// CPU added under [`UNSAMPLED_CPU`]: threads without any stack yet.
    pub unplaced_ns: u64,
    /// CPU samples carried beyond what there was to take back (should stay 0).
    pub excess_ns: u64,
    /// Threads whose time was read from /proc.
    pub threads_read: u64,
    /// Processes not followed: the bound on threads was reached.
    pub processes_unfollowed: u64,
    /// Threads that disappeared without an exit record (their last CPU is
    /// what their samples said).
    pub exits_unrecorded: u64,
    /// The drain thread's CPU time spent on the ledger (reads included).
    pub cost_ns: u64,
}

impl std::ops::AddAssign for CpuCredits {
    fn add_assign(&mut self, other: Self) {
        self.added_ns += other.added_ns;
        self.taken_back_ns += other.taken_back_ns;
        self.unplaced_ns += other.unplaced_ns;
        self.excess_ns += other.excess_ns;
        self.threads_read += other.threads_read;
        self.processes_unfollowed += other.processes_unfollowed;
        self.exits_unrecorded += other.exits_unrecorded;
        self.cost_ns += other.cost_ns;
    }
}

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

/// What making sampled threads' off-CPU time exact did at drains.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuExact {
    /// Threads scaled to their exact time off CPU.
    pub threads: u64,
    /// Threads whose time off CPU could not be read.
    pub unread: u64,
    /// Threads left weighted: more than a drain reads.
    pub capped: u64,
}

impl std::ops::AddAssign for OffCpuExact {
    fn add_assign(&mut self, other: Self) {
        self.threads += other.threads;
        self.unread += other.unread;
        self.capped += other.capped;
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
    /// Sampled threads whose off-CPU samples were scaled to their exact
    /// time off CPU (`off_cpu::exact`), those whose time could not be read
    /// (exited ones included) and those over the cap: the last two keep
    /// their weighted figures.
    pub off_cpu_exact: OffCpuExact,
    /// What the CPU ledger did to this batch (`thread_cpu`).
    pub cpu_credits: CpuCredits,
}
