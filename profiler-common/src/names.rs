//! Names the daemon finds the program's maps, globals and programs by.

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
    pub const THREAD_EXITS: &str = "THREAD_EXITS";
    pub const CPU_FOLLOWED: &str = "CPU_FOLLOWED";
    pub const UNWOUND_STACKS: [&str; 2] = ["UNWOUND_STACKS_0", "UNWOUND_STACKS_1"];
    /// The frames past `MAX_STACK_DEPTH` of the unwound stacks that have
    /// them, under the same key (and hash) as the stack.
    pub const UNWOUND_TAILS: [&str; 2] = ["UNWOUND_TAILS_0", "UNWOUND_TAILS_1"];
    pub const UNWIND_ROWS: &str = "UNWIND_ROWS";
    pub const UNWIND_CHUNK_PCS: &str = "UNWIND_CHUNK_PCS";
    pub const UNWIND_TABLES: &str = "UNWIND_TABLES";
    pub const UNWIND_PROCESSES: &str = "UNWIND_PROCESSES";
    pub const UNWIND_SCRATCH: &str = "UNWIND_SCRATCH";
    pub const OFF_CPU_WAITS: &str = "OFF_CPU_WAITS";
    /// Recorded waits not yet ended, by a hash of the waiting task's
    /// address: lets a switch skip the waits map for a thread with none.
    pub const OFF_CPU_PENDING: &str = "OFF_CPU_PENDING";
    pub const PYTHON_PROCESSES: &str = "PYTHON_PROCESSES";
    pub const PYTHON_THREADS: &str = "PYTHON_THREADS";
    pub const PYTHON_CODES: &str = "PYTHON_CODES";
    pub const PYTHON_SEEN: &str = "PYTHON_SEEN";
    pub const ALLOC_TRACED: &str = "ALLOC_TRACED";
    pub const ALLOC_THREADS: &str = "ALLOC_THREADS";
    pub const ALLOC_BLOCKS: &str = "ALLOC_BLOCKS";
    pub const ALLOC_STACKS: &str = "ALLOC_STACKS";
    pub const ALLOC_DRAWS: &str = "ALLOC_DRAWS";
    /// The names the `kernel_names` program printed (see `KernelNames`).
    pub const KERNEL_NAMES: &str = "KERNEL_NAMES";

    /// Default capacities; the daemon may override them at load time.
    pub const DEFAULT_COUNTS_ENTRIES: u32 = 16384;
    pub const DEFAULT_USER_STACKS_ENTRIES: u32 = 16384;
    pub const DEFAULT_KERNEL_STACKS_ENTRIES: u32 = 8192;
    pub const DEFAULT_PROCESSES_ENTRIES: u32 = 32768;
    pub const DEFAULT_THREADS_ENTRIES: u32 = 65536;
    /// log2 of the slots of OFF_CPU_PENDING (8 bytes each: 64 KiB).
    pub const OFF_CPU_PENDING_BITS: u32 = 13;
    /// Exits of threads the daemon may owe CPU, between two drains.
    pub const THREAD_EXITS_ENTRIES: u32 = 8192;
    /// Processes whose threads' CPU the daemon follows between samples.
    pub const CPU_FOLLOWED_ENTRIES: u32 = 4096;
    pub const PROCESS_EVENTS_BYTES: u32 = 256 * 1024;
    /// About 170 spilled samples (3 KiB each) per drain (a ring's size is
    /// a power of two; spills are rare, and those lost are counted).
    pub const SPILLED_SAMPLES_BYTES: u32 = 512 * 1024;
    pub const DEFAULT_UNWOUND_STACKS_ENTRIES: u32 = 16384;
    /// Stacks deeper than `MAX_STACK_DEPTH` are rare: one in 16 may be,
    /// before the deepest are cut to their leaf-most `MAX_STACK_DEPTH`.
    pub const DEFAULT_UNWOUND_TAILS_ENTRIES: u32 = DEFAULT_UNWOUND_STACKS_ENTRIES / 16;
    /// 64 MiB of rows at most; the daemon sets it from
    /// `unwind_table_memory_mb`.
    pub const DEFAULT_UNWIND_ROW_CHUNKS: u32 = 16384;
    /// Groups of `UNWIND_GROUP_CHUNKS` chunks in the rows map (its outer
    /// array's entries), for the default chunks.
    pub const DEFAULT_UNWIND_ROW_GROUPS: u32 = DEFAULT_UNWIND_ROW_CHUNKS / crate::UNWIND_GROUP_CHUNKS as u32;
    /// Table ids (one per loaded file); id 0 is never used.
    pub const UNWIND_TABLE_IDS: u32 = 16384;
    pub const DEFAULT_UNWIND_PROCESSES_ENTRIES: u32 = 8192;
    /// Processes traced for allocations at once, at most.
    pub const ALLOC_TRACED_ENTRIES: u32 = 64;
    /// Threads of traced processes with an allocator state.
    pub const ALLOC_THREADS_ENTRIES: u32 = 16384;
    /// Sampled blocks not yet freed, over every traced process.
    pub const DEFAULT_ALLOC_BLOCKS_ENTRIES: u32 = 262_144;
    /// Distinct allocation stacks kept for the frees of their blocks.
    pub const DEFAULT_ALLOC_STACKS_ENTRIES: u32 = 8192;
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
    /// Off-CPU sampling: one switch in N is recorded (>= 1), before the
    /// budget's halvings; a recorded wait weighs N times 2^halvings.
    pub const OFF_CPU_SAMPLE_EVERY: &str = "OFF_CPU_SAMPLE_EVERY";
    /// Off-CPU sampling: a switch is recorded when a random u32 is below
    /// this (2^32: every switch); see `off_cpu_record_below`.
    pub const OFF_CPU_RECORD_BELOW: &str = "OFF_CPU_RECORD_BELOW";
    /// Off-CPU budget: [`OFF_CPU_RATE_SWITCHES`] switches of a CPU that
    /// take less than this many ns are more than its budget (recorded
    /// switches per CPU per second) at the odds of one in N, which then halve
    /// until they are not (0: no budget).
    pub const OFF_CPU_BUDGET_NS: &str = "OFF_CPU_BUDGET_NS";
    /// A CPU's switch rate is measured over this many of its switches (a
    /// power of two): the clock is read once per so many, not per switch.
    pub const OFF_CPU_RATE_SWITCHES: u64 = 256;
    /// Off-CPU waits shorter than this (ns) are dropped when they end.
    pub const OFF_CPU_MIN_NS: &str = "OFF_CPU_MIN_NS";
    /// Byte offset of `task_struct.thread.fsbase` (0: unknown, no Python frames).
    pub const TASK_FSBASE_OFFSET: &str = "TASK_FSBASE_OFFSET";
    /// Mean bytes between sampled allocations (0: every allocation).
    pub const ALLOC_INTERVAL: &str = "ALLOC_INTERVAL";
    /// Sampled blocks one traced process may have remembered at once.
    pub const ALLOC_BLOCKS_PER_PROCESS: &str = "ALLOC_BLOCKS_PER_PROCESS";
}

/// Program names as the daemon looks them up.
pub mod programs {
    pub const SAMPLE: &str = "sample";
    pub const ON_EXEC: &str = "on_exec";
    pub const ON_EXIT: &str = "on_exit";
    pub const ON_SWITCH: &str = "on_switch";
    /// Entry of every probed allocator function (free included).
    pub const ALLOC_ENTER: &str = "alloc_enter";
    /// Return of the allocating ones.
    pub const ALLOC_RETURN: &str = "alloc_return";
    /// Names kernel addresses for the symbolizer; never attached, only run.
    pub const KERNEL_NAMES: &str = "kernel_names";
}
