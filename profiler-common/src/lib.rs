//! Types shared by the BPF sampler and the daemon.
//!
//! Everything here crosses the kernel boundary through BPF maps, so every type is
//! `#[repr(C)]`, has no implicit padding (asserted below), and its layout is the
//! contract between `profiler-ebpf` and `profiler-daemon`.
#![no_std]

pub mod python;

/// Length of a task's `comm` as the kernel stores it (TASK_COMM_LEN).
pub const COMM_LEN: usize = 16;

/// Frames kept per stack; the kernel's own limit (PERF_MAX_STACK_DEPTH).
pub const MAX_STACK_DEPTH: usize = 127;

/// Key of the counts maps: one entry per distinct (kind, thread, process
/// instance, cgroup, stacks).
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
    /// What the value measures: one of [`sample_kind`].
    pub kind: u16,
    /// Always 0 (explicit, so no padding byte of the map key is undefined).
    pub reserved: u16,
    /// The buffer generation (see [`CONTROL_GENERATION`]) whose stack maps
    /// hold the stack ids. It is the drained buffer's own, except for an
    /// off-CPU wait that began before an earlier drain: its stacks were
    /// taken when it began, and the daemon kept them.
    pub generation: u32,
    /// Always 0.
    pub reserved2: u32,
    /// The thread's cgroup v2 id (the inode of its directory under
    /// /sys/fs/cgroup): counts are kept per cgroup, so a thread that moves
    /// between cgroups has its samples split where it moved.
    pub cgroup_id: u64,
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

impl Wait {
    /// The counts key this wait is added under, for thread `tid`: the
    /// stacks (and their generation) it began with.
    #[inline(always)]
    pub const fn key(&self, tid: u32) -> SampleKey {
        SampleKey {
            tgid: self.tgid,
            tid,
            instance: self.instance,
            user_stack_id: self.user_stack_id,
            kernel_stack_id: self.kernel_stack_id,
            comm: self.comm,
            kind: self.kind,
            reserved: 0,
            generation: self.generation,
            reserved2: 0,
            cgroup_id: self.cgroup_id,
        }
    }
}

/// What a counts entry measures ([`SampleKey::kind`]).
pub mod sample_kind {
    /// CPU samples: `count` samples, `ns` the CPU time the thread consumed
    /// since its previous sample, summed.
    pub const CPU: u16 = 0;
    /// Off-CPU waits of a thread that blocked (slept, waited for I/O or a
    /// lock): `count` waits, `ns` their length, both weighted by the
    /// off-CPU sampling rate.
    pub const OFF_CPU_BLOCKED: u16 = 1;
    /// Off-CPU waits of a thread that was preempted and waited, runnable,
    /// for a CPU (the run queue).
    pub const OFF_CPU_RUNNABLE: u16 = 2;
}

/// Value of the counts maps; what it counts depends on [`SampleKey::kind`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleValue {
    /// Samples, or waits.
    pub count: u64,
    /// In the kind's unit: nanoseconds of CPU, or of waiting.
    pub amount: u64,
}

/// A thread's current off-CPU wait (value of the OFF_CPU_WAITS map, keyed
/// by tid): where it was when it left the CPU. `since_ns` is 0 while the
/// thread runs or when this wait is not sampled.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wait {
    /// bpf_ktime_get_ns() when the thread left the CPU; 0: not waiting.
    pub since_ns: u64,
    pub tgid: u32,
    pub instance: u32,
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    /// The generation whose stack maps hold the two ids.
    pub generation: u32,
    /// [`sample_kind::OFF_CPU_BLOCKED`] or [`sample_kind::OFF_CPU_RUNNABLE`].
    pub kind: u16,
    pub reserved: u16,
    pub comm: [u8; COMM_LEN],
    pub cgroup_id: u64,
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
    /// As [`SampleKey::kind`]: what `amount` measures.
    pub kind: u16,
    /// Always 0.
    pub reserved: u16,
    /// As [`SampleValue::amount`], of one sample.
    pub amount: u64,
    /// As [`SampleKey::cgroup_id`].
    pub cgroup_id: u64,
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

/// Index in the CONTROL array of the buffer generation: the daemon adds one
/// at every drain; the sampler writes to buffer `generation & 1` (the
/// counts and stack maps of that index), the daemon drains the other one.
pub const CONTROL_GENERATION: u32 = 0;
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
    // Why each user-stack walk of the sampler's own unwinder ended (see UnwindEnd).
    UnwindComplete,
    UnwindNoMapping,
    UnwindNoFramePointer,
    UnwindUnsupportedRule,
    UnwindReadFault,
    UnwindDepthLimit,
    UnwindTableNotLoaded,
    /// Frames the walk took through a frame pointer (no table for that code).
    UnwindFramePointerFrames,
    /// Frames the walk took through a table row.
    UnwindTableFrames,
    /// Another unwound stack held the stack's key: the sample was spilled.
    UnwoundStackCollision,
    /// The unwound-stacks map had no free entry: the sample has no user stack.
    UnwoundStackMapFull,
    // Off-CPU (the sched_switch program), when enabled.
    /// Every time a thread (not an idle task) left a CPU.
    OffCpuSwitches,
    /// Waits not recorded: sampling takes one switch in N (and weighs it N).
    OffCpuUnsampled,
    /// Recorded waits shorter than the minimum: dropped when they ended.
    OffCpuShort,
    /// Waits added to the counts map when they ended.
    OffCpuWaits,
    /// A wait's stack could not get an id (a collision or a full map): the
    /// wait is counted without that stack.
    OffCpuStackLost,
    /// The waits map refused an entry: that wait is lost.
    OffCpuWaitsMapFull,
    /// The next task's pid could not be read: its wait is lost.
    OffCpuReadError,
    // Why each walk of a CPython thread's frames ended (see `python`).
    PythonComplete,
    PythonDepthLimit,
    PythonReadFault,
    PythonInvalid,
    PythonNoThreadState,
    /// Python frames recorded.
    PythonFrames,
    /// The ring of code objects to read was full: one may go unnamed if its
    /// process is short-lived.
    PythonCodesLost,
}

impl Counter {
    pub const COUNT: u32 = 42;

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
        Counter::UnwindComplete,
        Counter::UnwindNoMapping,
        Counter::UnwindNoFramePointer,
        Counter::UnwindUnsupportedRule,
        Counter::UnwindReadFault,
        Counter::UnwindDepthLimit,
        Counter::UnwindTableNotLoaded,
        Counter::UnwindFramePointerFrames,
        Counter::UnwindTableFrames,
        Counter::UnwoundStackCollision,
        Counter::UnwoundStackMapFull,
        Counter::OffCpuSwitches,
        Counter::OffCpuUnsampled,
        Counter::OffCpuShort,
        Counter::OffCpuWaits,
        Counter::OffCpuStackLost,
        Counter::OffCpuWaitsMapFull,
        Counter::OffCpuReadError,
        Counter::PythonComplete,
        Counter::PythonDepthLimit,
        Counter::PythonReadFault,
        Counter::PythonInvalid,
        Counter::PythonNoThreadState,
        Counter::PythonFrames,
        Counter::PythonCodesLost,
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
            Counter::UnwindComplete => "unwind_complete",
            Counter::UnwindNoMapping => "unwind_no_mapping",
            Counter::UnwindNoFramePointer => "unwind_no_frame_pointer",
            Counter::UnwindUnsupportedRule => "unwind_unsupported_rule",
            Counter::UnwindReadFault => "unwind_read_fault",
            Counter::UnwindDepthLimit => "unwind_depth_limit",
            Counter::UnwindTableNotLoaded => "unwind_table_not_loaded",
            Counter::UnwindFramePointerFrames => "unwind_frame_pointer_frames",
            Counter::UnwindTableFrames => "unwind_table_frames",
            Counter::UnwoundStackCollision => "unwound_stack_collision",
            Counter::UnwoundStackMapFull => "unwound_stack_map_full",
            Counter::OffCpuSwitches => "off_cpu_switches",
            Counter::OffCpuUnsampled => "off_cpu_unsampled",
            Counter::OffCpuShort => "off_cpu_short",
            Counter::OffCpuWaits => "off_cpu_waits",
            Counter::OffCpuStackLost => "off_cpu_stack_lost",
            Counter::OffCpuWaitsMapFull => "off_cpu_waits_map_full",
            Counter::OffCpuReadError => "off_cpu_read_error",
            Counter::PythonComplete => "python_complete",
            Counter::PythonDepthLimit => "python_depth_limit",
            Counter::PythonReadFault => "python_read_fault",
            Counter::PythonInvalid => "python_invalid",
            Counter::PythonNoThreadState => "python_no_thread_state",
            Counter::PythonFrames => "python_frames",
            Counter::PythonCodesLost => "python_codes_lost",
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
                | Counter::UnwindComplete
                | Counter::UnwindNoMapping
                | Counter::UnwindNoFramePointer
                | Counter::UnwindUnsupportedRule
                | Counter::UnwindReadFault
                | Counter::UnwindDepthLimit
                | Counter::UnwindTableNotLoaded
                | Counter::UnwindFramePointerFrames
                | Counter::UnwindTableFrames
                | Counter::UnwoundStackCollision
                | Counter::OffCpuSwitches
                | Counter::OffCpuUnsampled
                | Counter::OffCpuShort
                | Counter::OffCpuWaits
                | Counter::PythonComplete
                | Counter::PythonDepthLimit
                | Counter::PythonReadFault
                | Counter::PythonInvalid
                | Counter::PythonNoThreadState
                | Counter::PythonFrames
                | Counter::PythonCodesLost
        )
    }
}

/// User stacks: how the sampler walks them (a load-time global, see
/// [`globals::UNWIND_MODE`]).
pub mod unwind_mode {
    /// bpf_get_stackid with BPF_F_USER_STACK: frame pointers only.
    pub const FRAME_POINTERS: u64 = 0;
    /// The sampler's own walk: CFI tables where loaded, frame pointers elsewhere.
    pub const TABLES: u64 = 1;
}

/// How a row finds the canonical frame address (CFA), in the low 4 bits of
/// [`UnwindRow::rules`].
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CfaRule {
    /// No FDE covers this pc (a gap between functions): use the frame pointer.
    NoInfo = 0,
    /// CFA = rsp + 8 * cfa_offset.
    Rsp = 1,
    /// CFA = rbp + 8 * cfa_offset.
    Rbp = 2,
    /// A PLT stub (GCC's expression): CFA = rsp + 8 + ((rip & 15) >= 11 ? 8 : 0).
    Plt = 3,
    /// CFA = *(rsp + 8 * (cfa_offset & 0xff)) + 8 * (cfa_offset >> 8) (stack realignment).
    DerefRsp = 4,
    /// A signal trampoline (`__restore_rt`, CIE augmentation "S"): rsp points
    /// at the kernel's ucontext, whose saved registers give the interrupted frame.
    Signal = 5,
    /// The return address is undefined here: the outermost frame (`_start`,
    /// a thread's start). The walk is complete.
    End = 6,
    /// A rule the walker cannot evaluate (another register, another expression).
    Unsupported = 7,
}

/// Where the caller's rbp is, in the high 4 bits of [`UnwindRow::rules`].
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RbpRule {
    /// Not saved by this frame: the caller's rbp is the current one.
    Unchanged = 0,
    /// Saved at CFA + 8 * rbp_offset.
    Offset = 1,
    /// Saved in a way the walker cannot follow; rbp is unknown from here on.
    Unsupported = 2,
}

/// One row of a compiled unwind table: from `pc` up to the next row's `pc`,
/// this is how to find the caller. Tables are sorted by `pc`, an ELF virtual
/// address of the file (what `.eh_frame` speaks); a table ends with a
/// [`CfaRule::NoInfo`] row at the end of its last FDE. The return address is
/// always at CFA - 8 (x86-64).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    pub pc: u32,
    /// In units of 8 bytes; see [`CfaRule`] (DerefRsp packs two offsets).
    pub cfa_offset: u16,
    /// In units of 8 bytes, relative to the CFA; see [`RbpRule::Offset`].
    pub rbp_offset: i8,
    /// `CfaRule as u8 | (RbpRule as u8) << 4`.
    pub rules: u8,
}

impl UnwindRow {
    pub const fn cfa_rule(&self) -> u8 {
        self.rules & 0x0f
    }
    pub const fn rbp_rule(&self) -> u8 {
        self.rules >> 4
    }
}

/// Rows per element of the rows map: tables are loaded a chunk (4 KiB) per
/// map update, and every table starts at a chunk boundary.
pub const UNWIND_ROWS_PER_CHUNK: usize = 512;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UnwindRowChunk {
    pub rows: [UnwindRow; UNWIND_ROWS_PER_CHUNK],
}

/// Where one file's table lies in the rows map (indexed by table id).
/// `rows == 0`: not loaded (never, or evicted).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindTableRange {
    /// Index of the first row (a multiple of [`UNWIND_ROWS_PER_CHUNK`]).
    pub first_row: u32,
    pub rows: u32,
}

/// Executable mappings kept per process for the walk.
pub const MAX_UNWIND_MAPPINGS: usize = 256;

/// One executable mapping of a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindMapping {
    pub start: u64,
    pub end: u64,
    /// Runtime address minus the file's virtual address: a pc's row is
    /// looked up at `pc - bias`.
    pub bias: u64,
    /// Index in the table-range map; 0: the file has no table (use frame pointers).
    pub table: u32,
    pub reserved: u32,
}

/// A process's executable mappings, sorted by `start`, for the walk.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UnwindProcess {
    pub count: u32,
    /// 1 when the process runs CPython and has a `PYTHON_PROCESSES` entry
    /// (written first): only then does the walk look it up.
    pub python: u32,
    pub mappings: [UnwindMapping; MAX_UNWIND_MAPPINGS],
}

/// Why a user-stack walk ended; each is counted (see [`Counter`]) and stored
/// with the stack.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnwindEnd {
    /// Reached the outermost frame (undefined return address, rip 0, or a
    /// frame-pointer chain ending in 0).
    Complete = 0,
    /// A pc outside every known mapping of the process, and no frame pointer to follow.
    NoMapping = 1,
    /// A frame without a table whose frame pointer led nowhere.
    NoFramePointer = 2,
    /// A CFA or rbp rule the walker cannot evaluate.
    UnsupportedRule = 3,
    /// Reading the stack faulted (paged out, or garbage registers).
    ReadFault = 4,
    /// MAX_STACK_DEPTH frames and more to go.
    DepthLimit = 5,
    /// The process's table was not loaded yet (or evicted) and frame pointers
    /// could not continue.
    TableNotLoaded = 6,
}

/// A user stack the sampler unwound itself, deduplicated by `hash` in the
/// unwound-stacks maps (keyed by the hash's low bits; a different stack with
/// the same key goes through the spill ring).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UnwoundStack {
    pub hash: u64,
    pub len: u32,
    /// An [`UnwindEnd`] as u32.
    pub end: u32,
    pub frames: [u64; MAX_STACK_DEPTH],
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
    pub const UNWOUND_STACKS: [&str; 2] = ["UNWOUND_STACKS_0", "UNWOUND_STACKS_1"];
    pub const UNWIND_ROWS: &str = "UNWIND_ROWS";
    pub const UNWIND_CHUNK_PCS: &str = "UNWIND_CHUNK_PCS";
    pub const UNWIND_TABLES: &str = "UNWIND_TABLES";
    pub const UNWIND_PROCESSES: &str = "UNWIND_PROCESSES";
    pub const UNWIND_SCRATCH: &str = "UNWIND_SCRATCH";
    pub const OFF_CPU_WAITS: &str = "OFF_CPU_WAITS";
    pub const PYTHON_PROCESSES: &str = "PYTHON_PROCESSES";
    pub const PYTHON_THREADS: &str = "PYTHON_THREADS";
    pub const PYTHON_CODES: &str = "PYTHON_CODES";
    pub const PYTHON_SEEN: &str = "PYTHON_SEEN";

    /// Default capacities; the daemon may override them at load time.
    pub const DEFAULT_COUNTS_ENTRIES: u32 = 16384;
    pub const DEFAULT_USER_STACKS_ENTRIES: u32 = 16384;
    pub const DEFAULT_KERNEL_STACKS_ENTRIES: u32 = 8192;
    pub const DEFAULT_PROCESSES_ENTRIES: u32 = 32768;
    pub const DEFAULT_THREADS_ENTRIES: u32 = 65536;
    pub const PROCESS_EVENTS_BYTES: u32 = 256 * 1024;
    /// About 250 spilled samples per drain.
    pub const SPILLED_SAMPLES_BYTES: u32 = 512 * 1024;
    pub const DEFAULT_UNWOUND_STACKS_ENTRIES: u32 = 16384;
    /// 64 MiB of rows; the daemon sets it from `unwind_table_memory_mb`.
    pub const DEFAULT_UNWIND_ROW_CHUNKS: u32 = 16384;
    /// Table ids (one per loaded file); id 0 is never used.
    pub const UNWIND_TABLE_IDS: u32 = 16384;
    pub const DEFAULT_UNWIND_PROCESSES_ENTRIES: u32 = 8192;
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
    /// One of [`crate::unwind_mode`].
    pub const UNWIND_MODE: &str = "UNWIND_MODE";
    /// Byte offset of `task_struct.pid` (the thread id): the switch program
    /// reads the next task's.
    pub const TASK_PID_OFFSET: &str = "TASK_PID_OFFSET";
    /// Off-CPU sampling: one switch in N is recorded and weighs N (>= 1).
    pub const OFF_CPU_SAMPLE_EVERY: &str = "OFF_CPU_SAMPLE_EVERY";
    /// Off-CPU waits shorter than this (ns) are dropped when they end.
    pub const OFF_CPU_MIN_NS: &str = "OFF_CPU_MIN_NS";
    /// Byte offset of `task_struct.thread.fsbase` (0: unknown, no Python frames).
    pub const TASK_FSBASE_OFFSET: &str = "TASK_FSBASE_OFFSET";
}

/// Program names as the daemon looks them up.
pub mod programs {
    pub const SAMPLE: &str = "sample";
    pub const ON_EXEC: &str = "on_exec";
    pub const ON_EXIT: &str = "on_exit";
    pub const ON_SWITCH: &str = "on_switch";
}

// The layout is the contract: no implicit padding, sizes fixed.
const _: () = assert!(core::mem::size_of::<SampleKey>() == 5 * 4 + COMM_LEN + 2 * 2 + 2 * 4 + 8);
const _: () = assert!(core::mem::offset_of!(SampleKey, cgroup_id) == 5 * 4 + COMM_LEN + 2 * 2 + 2 * 4);
const _: () = assert!(core::mem::size_of::<Wait>() == 8 + 5 * 4 + 2 * 2 + COMM_LEN + 8);
const _: () = assert!(core::mem::offset_of!(Wait, cgroup_id) == 8 + 5 * 4 + 2 * 2 + COMM_LEN);
const _: () = assert!(core::mem::align_of::<SampleKey>() == 8);
const _: () = assert!(core::mem::size_of::<ProcessEvent>() == 8 + 4 * 4);
const _: () =
    assert!(core::mem::size_of::<SpilledSample>() == 5 * 4 + COMM_LEN + 4 + 8 + 8 + 2 * 8 * MAX_STACK_DEPTH);
const _: () = assert!(core::mem::size_of::<SampleValue>() == 16);
const _: () = assert!(core::mem::align_of::<SpilledSample>() == 8);
const _: () = assert!(Counter::ALL.len() == Counter::COUNT as usize);
const _: () = assert!(core::mem::size_of::<UnwindRow>() == 8);
const _: () = assert!(core::mem::size_of::<UnwindRowChunk>() == 4096);
const _: () = assert!(core::mem::size_of::<UnwindTableRange>() == 8);
const _: () = assert!(core::mem::size_of::<UnwindMapping>() == 32);
const _: () = assert!(core::mem::size_of::<UnwindProcess>() == 8 + 32 * MAX_UNWIND_MAPPINGS);
const _: () = assert!(core::mem::size_of::<UnwoundStack>() == 16 + 8 * MAX_STACK_DEPTH);

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
    // SAFETY: as above.
    unsafe impl aya::Pod for super::UnwindRowChunk {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::UnwindTableRange {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::UnwindProcess {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::UnwoundStack {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Wait {}
}
