//! The sampler's own counters: what happened to samples in BPF.

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
    /// The unwound-stacks map had no free entry (or no memory for one): the
    /// sample has no user stack.
    UnwoundStackMapFull,
    // Off-CPU (the sched_switch program), when enabled.
    /// Switches recorded: a thread (not an idle task) left a CPU and its
    /// wait was taken: every time, or at the odds of one in N
    /// (`--off-cpu-sample-every`) halved under the budget (`--off-cpu-budget`).
    /// Unrecorded switches are not counted (a counter on the path every
    /// switch takes); the kernel counts all of them (`ctxt` in /proc/stat).
    OffCpuRecordedSwitches,
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
    /// Allocator calls of traced processes that reached a probe.
    AllocCalls,
    /// Allocations sampled (recorded with their stack).
    AllocSampled,
    /// Frees of sampled blocks.
    AllocFreed,
    /// Allocator calls made inside another (glibc's realloc calling malloc):
    /// counted once, by the outer call.
    AllocNested,
    /// A sampled block found no room in the live-block map: its free will
    /// not be seen, so it stays "in use".
    AllocBlocksFull,
    /// A freed block's stack was gone: the free is counted without it.
    AllocStackLost,
    /// A thread found no room for its allocator state: its calls are not seen.
    AllocThreadsFull,
    /// The per-CPU walk scratch was in use (a preempted probe): the sample
    /// was skipped.
    AllocScratchBusy,
    /// The thread-exits map was full: the CPU an exiting thread used since
    /// the daemon last read its time is not in its window.
    ThreadExitsFull,
    /// A user stack deeper than `MAX_STACK_DEPTH` found no room in the
    /// unwound-tails map (full, or its key held another stack's tail): it
    /// keeps its leaf-most `MAX_STACK_DEPTH` frames, like a walk cut at
    /// the depth limit.
    UnwoundTailsFull,
}

impl Counter {
    pub const COUNT: u32 = 51;

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
        Counter::OffCpuRecordedSwitches,
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
        Counter::AllocCalls,
        Counter::AllocSampled,
        Counter::AllocFreed,
        Counter::AllocNested,
        Counter::AllocBlocksFull,
        Counter::AllocStackLost,
        Counter::AllocThreadsFull,
        Counter::AllocScratchBusy,
        Counter::ThreadExitsFull,
        Counter::UnwoundTailsFull,
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
            Counter::OffCpuRecordedSwitches => "off_cpu_recorded_switches",
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
            Counter::AllocCalls => "alloc_calls",
            Counter::AllocSampled => "alloc_sampled",
            Counter::AllocFreed => "alloc_freed",
            Counter::AllocNested => "alloc_nested",
            Counter::AllocBlocksFull => "alloc_blocks_full",
            Counter::AllocStackLost => "alloc_stack_lost",
            Counter::AllocThreadsFull => "alloc_threads_full",
            Counter::AllocScratchBusy => "alloc_scratch_busy",
            Counter::ThreadExitsFull => "thread_exits_full",
            Counter::UnwoundTailsFull => "unwound_tails_full",
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
                | Counter::UnwoundTailsFull
                | Counter::OffCpuRecordedSwitches
                | Counter::OffCpuShort
                | Counter::OffCpuWaits
                | Counter::PythonComplete
                | Counter::PythonDepthLimit
                | Counter::PythonReadFault
                | Counter::PythonInvalid
                | Counter::PythonNoThreadState
                | Counter::PythonFrames
                | Counter::PythonCodesLost
                | Counter::AllocCalls
                | Counter::AllocSampled
                | Counter::AllocFreed
                | Counter::AllocNested
        )
    }
}

// The layout is the contract: no implicit padding, sizes fixed.
const _: () = assert!(Counter::ALL.len() == Counter::COUNT as usize);
