//! What readers ask of the allocation tracer and what it answers, and its
//! bounds and figures.

use std::{sync::atomic::AtomicU64, time::Duration};

use tokio::sync::oneshot;

/// What the tracing may cost and hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocationLimits {
    /// Processes traced at once.
    pub max_processes: usize,
    /// Estimated cost of the probes, as a percentage of the traced
    /// process's own CPU time; past it, its tracing ends.
    pub budget_percent: u64,
    /// What one probed call costs the process, nanoseconds: on this class
    /// of VM (kernel 6.18), `bench/alloc_cost.sh` measured 2.2 us per traced
    /// malloc (its entry and return traps) and 5.5 us per free (its first
    /// instruction is stepped, not emulated), about 3.7 us a call.
    pub cost_per_call_ns: u64,
}

impl Default for AllocationLimits {
    fn default() -> Self {
        Self {
            max_processes: 4,
            budget_percent: 10,
            cost_per_call_ns: 4_000,
        }
    }
}

/// Why allocations of a process cannot be traced.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    #[error("process {0} does not exist (or exited)")]
    NoProcess(u32),
    #[error(
        "process {0} is a Go program: its heap is the Go runtime's, which no allocator probe sees; ask the program's own /debug/pprof/heap"
    )]
    Go(u32),
    #[error(
        "process {0} maps no allocator profilerd can probe (glibc's malloc family, jemalloc, tcmalloc or mimalloc, with symbols): a static binary without symbols, or an allocator of its own"
    )]
    NoAllocator(u32),
    #[error(
        "allocation profiles need table unwinding (--unwind auto, the default): this daemon runs with frame pointers only"
    )]
    Unavailable,
    #[error("{0} processes are traced already (allocations.max_processes): try again when a window ends")]
    TooMany(usize),
    #[error(
        "user {uid} has {limit} processes traced already, its share of alloc_max_processes: try again when a window ends"
    )]
    UserShare { uid: u32, limit: usize },
    #[error("attaching the allocator probes to process {pid}: {reason}")]
    Attach { pid: u32, reason: String },
}

/// What a reader asks of the tracer.
pub enum AllocCommand {
    /// Trace `pid` for `seconds` from when its probes are attached (or
    /// until ended), for one more reader.
    Start {
        pid: u32,
        seconds: Duration,
        reply: oneshot::Sender<Result<(), AllocError>>,
    },
    /// One reader's window of `pid` is over; the reply says how the
    /// tracing went (and ends it with the last reader).
    End {
        pid: u32,
        reply: oneshot::Sender<TraceSummary>,
    },
    /// The processes traced while the daemon runs, and since when.
    Continuous {
        reply: oneshot::Sender<Vec<ContinuousTrace>>,
    },
}

/// A process traced while the daemon runs (`[allocations]` targets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContinuousTrace {
    pub pid: u32,
    /// When its tracing began (Unix ms): its heap is what it allocated
    /// since and has not freed.
    pub since_ms: u64,
}

/// How a process's tracing went, for the profile's reader.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceSummary {
    pub calls: u64,
    pub sampled: u64,
    pub freed: u64,
    /// Why it ended before the window did, if it did.
    pub cut_short: Option<String>,
}

/// Tracing figures for /metrics.
#[derive(Debug, Default)]
pub struct AllocationStats {
    pub started: AtomicU64,
    pub refused: AtomicU64,
    pub over_budget: AtomicU64,
    pub traced_now: AtomicU64,
}
