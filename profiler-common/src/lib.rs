//! Types shared by the BPF sampler and the daemon.
//!
//! Everything here crosses the kernel boundary through BPF maps, so every type is
//! `#[repr(C)]`, has no implicit padding (asserted below), and its layout is the
//! contract between `profiler-ebpf` and `profiler-daemon`.
#![no_std]

/// Length of a task's `comm` as the kernel stores it (TASK_COMM_LEN).
pub const COMM_LEN: usize = 16;

/// Frames kept per stack; the kernel's own limit (PERF_MAX_STACK_DEPTH).
pub const MAX_STACK_DEPTH: usize = 127;

/// Key of the counts maps: one entry per distinct (thread, process instance, stacks).
///
/// A stack id is the id in the stack-trace map of the same buffer, or a negative
/// errno when the kernel could not provide that stack (`-EFAULT`: no such stack,
/// e.g. no user stack for a kernel thread or no kernel stack for a sample taken
/// in user mode).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleKey {
    /// Process id (the kernel's tgid).
    pub tgid: u32,
    /// Thread id (the kernel's pid).
    pub tid: u32,
    /// Identifies one exec of one process; see [`ProcessEvent`]. 0 means unknown.
    pub instance: u32,
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    /// The sampled thread's comm (its thread name), NUL padded.
    pub comm: [u8; COMM_LEN],
}

/// Sent through the process-events ring buffer.
///
/// The sampler hands out a random `instance` the first time it sees a process
/// (and again after every exec), so the daemon can snapshot the process's
/// memory mappings while it still runs, and so that a reused pid never gets
/// the symbols of the process that had it before.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessEvent {
    /// bpf_ktime_get_ns() when the event happened.
    pub ktime_ns: u64,
    /// One of [`ProcessEventKind`] as u32.
    pub kind: u32,
    pub tgid: u32,
    pub instance: u32,
    pub reserved: u32,
}

/// Value of the counts maps.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleValue {
    /// Number of samples.
    pub count: u64,
    /// CPU time the thread consumed since its previous sample, summed over
    /// these samples (nanoseconds).
    pub cpu_ns: u64,
}

/// A sample whose stacks could not get an id (another stack held the hash
/// bucket): rather than lose its stacks, the sampler copies them whole into
/// the SPILLED_SAMPLES ring buffer, which the daemon empties at every drain.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpilledSample {
    pub tgid: u32,
    pub tid: u32,
    pub instance: u32,
    /// Bytes of `user` written by bpf_get_stack, or a negative errno.
    pub user_len: i32,
    /// Bytes of `kernel` written, or a negative errno.
    pub kernel_len: i32,
    pub comm: [u8; COMM_LEN],
    pub reserved: u32,
    /// As [`SampleValue::cpu_ns`].
    pub cpu_ns: u64,
    pub user: [u64; MAX_STACK_DEPTH],
    pub kernel: [u64; MAX_STACK_DEPTH],
}

/// Stack ids the daemon gives spilled stacks; real stack-map ids stay below.
pub const SPILLED_STACK_ID_BASE: u32 = 1 << 30;

#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessEventKind {
    /// First sample of a new process instance: its mappings should be read now.
    Started = 1,
    /// The process's main thread exited; its instance will not be sampled again.
    Exited = 2,
}

impl ProcessEventKind {
    pub fn from_u32(kind: u32) -> Option<Self> {
        match kind {
            1 => Some(Self::Started),
            2 => Some(Self::Exited),
            _ => None,
        }
    }
}

/// Index in the CONTROL array of the counts/stack buffer pair the sampler
/// writes to (0 or 1); the daemon drains the other one.
pub const CONTROL_ACTIVE_BUFFER: u32 = 0;
pub const CONTROL_LEN: u32 = 1;

/// What happened to samples inside the BPF program, counted per CPU in the
/// COUNTERS map at index `counter as u32`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Every invocation of the sampler.
    Samples = 0,
    /// Samples of the idle task, which is not a process and is not recorded.
    Idle,
    /// Samples without a user stack (kernel threads); normal.
    NoUserStack,
    /// Samples without a kernel stack (taken in user mode); normal.
    NoKernelStack,
    /// bpf_get_stackid found another stack in the hash bucket (-EEXIST); the
    /// sample went through the spill ring instead, stacks intact.
    UserStackCollision,
    /// The user stack-trace map had no free entry (-ENOMEM).
    UserStackMapFull,
    /// Any other bpf_get_stackid failure for the user stack.
    UserStackError,
    KernelStackCollision,
    KernelStackMapFull,
    KernelStackError,
    /// The counts map was full: the sample is lost.
    CountsMapFull,
    /// The process-instance map refused an entry; the sample has instance 0.
    ProcessMapFull,
    /// The process-events ring buffer was full; the daemon learns of the process late.
    ProcessEventsLost,
    /// Samples copied whole into the spill ring after a stack-id collision.
    Spilled,
    /// The spill ring was full: the sample was counted without its stacks.
    SpillLost,
    /// The thread-time map refused an entry: that thread's next sample
    /// carries an estimate instead of its measured CPU time.
    ThreadMapFull,
    /// The task's CPU time could not be read (unknown offset or read error).
    TaskReadError,
}

impl Counter {
    pub const COUNT: u32 = 17;

    pub const ALL: [Counter; Self::COUNT as usize] = [
        Counter::Samples,
        Counter::Idle,
        Counter::NoUserStack,
        Counter::NoKernelStack,
        Counter::UserStackCollision,
        Counter::UserStackMapFull,
        Counter::UserStackError,
        Counter::KernelStackCollision,
        Counter::KernelStackMapFull,
        Counter::KernelStackError,
        Counter::CountsMapFull,
        Counter::ProcessMapFull,
        Counter::ProcessEventsLost,
        Counter::Spilled,
        Counter::SpillLost,
        Counter::ThreadMapFull,
        Counter::TaskReadError,
    ];

    /// Stable snake_case name used in logs and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Counter::Samples => "samples",
            Counter::Idle => "idle",
            Counter::NoUserStack => "no_user_stack",
            Counter::NoKernelStack => "no_kernel_stack",
            Counter::UserStackCollision => "user_stack_collision",
            Counter::UserStackMapFull => "user_stack_map_full",
            Counter::UserStackError => "user_stack_error",
            Counter::KernelStackCollision => "kernel_stack_collision",
            Counter::KernelStackMapFull => "kernel_stack_map_full",
            Counter::KernelStackError => "kernel_stack_error",
            Counter::CountsMapFull => "counts_map_full",
            Counter::ProcessMapFull => "process_map_full",
            Counter::ProcessEventsLost => "process_events_lost",
            Counter::Spilled => "spilled",
            Counter::SpillLost => "spill_lost",
            Counter::ThreadMapFull => "thread_map_full",
            Counter::TaskReadError => "task_read_error",
        }
    }

    /// True for failures (data lost or degraded), false for plain statistics.
    /// A collision is not one: the spill ring keeps the sample whole, and
    /// `SpillLost` counts the times it could not.
    pub const fn is_error(self) -> bool {
        !matches!(
            self,
            Counter::Samples
                | Counter::Idle
                | Counter::NoUserStack
                | Counter::NoKernelStack
                | Counter::UserStackCollision
                | Counter::KernelStackCollision
                | Counter::Spilled
        )
    }
}

/// Map names, shared so the daemon can find (and resize) what the program declares.
pub mod maps {
    pub const COUNTS: [&str; 2] = ["COUNTS_0", "COUNTS_1"];
    pub const USER_STACKS: [&str; 2] = ["USER_STACKS_0", "USER_STACKS_1"];
    pub const KERNEL_STACKS: [&str; 2] = ["KERNEL_STACKS_0", "KERNEL_STACKS_1"];
    pub const CONTROL: &str = "CONTROL";
    pub const COUNTERS: &str = "COUNTERS";
    pub const PROCESSES: &str = "PROCESSES";
    pub const PROCESS_EVENTS: &str = "PROCESS_EVENTS";
    pub const SPILLED_SAMPLES: &str = "SPILLED_SAMPLES";
    pub const THREAD_TIMES: &str = "THREAD_TIMES";

    /// Default capacities; the daemon may override them at load time.
    pub const DEFAULT_COUNTS_ENTRIES: u32 = 16384;
    pub const DEFAULT_USER_STACKS_ENTRIES: u32 = 16384;
    pub const DEFAULT_KERNEL_STACKS_ENTRIES: u32 = 8192;
    pub const DEFAULT_PROCESSES_ENTRIES: u32 = 32768;
    pub const DEFAULT_THREADS_ENTRIES: u32 = 65536;
    pub const PROCESS_EVENTS_BYTES: u32 = 256 * 1024;
    /// About 250 spilled samples per drain.
    pub const SPILLED_SAMPLES_BYTES: u32 = 512 * 1024;
}

/// Load-time settings of the BPF program (globals the daemon overrides).
pub mod globals {
    /// Byte offset of `task_struct.se.sum_exec_runtime` (0: unknown, no CPU time).
    pub const TASK_RUNTIME_OFFSET: &str = "TASK_RUNTIME_OFFSET";
    /// Byte offset of `task_struct.start_time` (0: unknown).
    pub const TASK_START_OFFSET: &str = "TASK_START_OFFSET";
    /// CLOCK_MONOTONIC ns when the sampler was attached.
    pub const ATTACH_NS: &str = "ATTACH_NS";
    /// Sampling period in ns: the CPU-time estimate for a thread's first sample.
    pub const PERIOD_NS: &str = "PERIOD_NS";
}

/// Program names as the daemon looks them up.
pub mod programs {
    pub const SAMPLE: &str = "sample";
    pub const ON_EXEC: &str = "on_exec";
    pub const ON_EXIT: &str = "on_exit";
}

// The layout is the contract: no implicit padding, sizes fixed.
const _: () = assert!(core::mem::size_of::<SampleKey>() == 5 * 4 + COMM_LEN);
const _: () = assert!(core::mem::align_of::<SampleKey>() == 4);
const _: () = assert!(core::mem::size_of::<ProcessEvent>() == 8 + 4 * 4);
const _: () =
    assert!(core::mem::size_of::<SpilledSample>() == 5 * 4 + COMM_LEN + 4 + 8 + 2 * 8 * MAX_STACK_DEPTH);
const _: () = assert!(core::mem::size_of::<SampleValue>() == 16);
const _: () = assert!(core::mem::align_of::<SpilledSample>() == 8);
const _: () = assert!(Counter::ALL.len() == Counter::COUNT as usize);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: repr(C), only integer fields, no padding (asserted above).
    unsafe impl aya::Pod for super::SampleKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ProcessEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SpilledSample {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SampleValue {}
}
