//! What the sampler records: counts keys and values, off-CPU waits, spilled
//! samples and process events.

use crate::{COMM_LEN, MAX_STACK_DEPTH, MAX_USER_DEPTH};

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
    /// lock): `count` waits, `ns` their length, both weighted by one over
    /// the odds each wait was recorded with (`Wait::weight`); the daemon
    /// may then scale a thread's `ns` to the kernel's count of its time off
    /// CPU (profiler-daemon's collect/off_cpu/exact.rs).
    pub const OFF_CPU_BLOCKED: u16 = 1;
    /// Off-CPU waits of a thread that was preempted and waited, runnable,
    /// for a CPU (the run queue).
    pub const OFF_CPU_RUNNABLE: u16 = 2;
    /// Sampled allocations of a traced process: `count` blocks, `amount`
    /// their bytes (unscaled: the daemon scales by the sampling interval).
    pub const ALLOC: u16 = 3;
    /// Frees of sampled blocks, counted under the allocation's key and stack:
    /// allocations less frees are the blocks still in use.
    pub const ALLOC_FREED: u16 = 4;
    /// The lifetimes of freed sampled blocks, under their allocation's key
    /// and stack: `count` frees, `amount` the nanoseconds they lived.
    pub const ALLOC_LIFETIME: u16 = 5;
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
    /// bpf_ktime_get_ns() when the thread left the CPU and its stacks were
    /// taken; 0: not waiting.
    pub since_ns: u64,
    pub tgid: u32,
    pub instance: u32,
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    /// The generation whose stack maps hold the two ids.
    pub generation: u32,
    /// [`sample_kind::OFF_CPU_BLOCKED`] or [`sample_kind::OFF_CPU_RUNNABLE`].
    pub kind: u16,
    /// How long taking this wait's stacks took, ns (at most 65,535): the
    /// wait is timed from after it (`since_ns`), and it is added once, not
    /// weighted with the rest (see profiler-ebpf's off_cpu.rs).
    pub recorded_ns: u16,
    pub comm: [u8; COMM_LEN],
    pub cgroup_id: u64,
    /// What the wait weighs: one over the odds it was recorded
    /// (`--off-cpu-sample-every` times 2 to the halvings its CPU's switch
    /// rate called for when it began); 0 is taken as 1.
    pub weight: u64,
}

/// A thread's last CPU time, recorded as it exits (value of the THREAD_EXITS
/// map, keyed by tid) when the daemon may follow its process: the CPU it used
/// since the daemon last read its time (/proc) belongs to the window it
/// exited in, though /proc no longer has it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadExit {
    /// `se.sum_exec_runtime` at exit: all the CPU time of its life, in ns.
    pub runtime_ns: u64,
    /// `task_struct.start_time` (CLOCK_MONOTONIC ns; 0: unknown).
    pub start_ns: u64,
    /// Its runtime at its last sample (THREAD_TIMES), 0 if none.
    pub sampled_ns: u64,
    pub tgid: u32,
    pub reserved: u32,
    pub comm: [u8; COMM_LEN],
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
    /// As deep as the sampler's own walk keeps (`MAX_USER_DEPTH`); a
    /// frame-pointer walk fills at most `MAX_STACK_DEPTH`.
    pub user: [u64; MAX_USER_DEPTH],
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

// The layout is the contract: no implicit padding, sizes fixed.
const _: () = assert!(core::mem::size_of::<SampleKey>() == 5 * 4 + COMM_LEN + 2 * 2 + 2 * 4 + 8);
const _: () = assert!(core::mem::offset_of!(SampleKey, cgroup_id) == 5 * 4 + COMM_LEN + 2 * 2 + 2 * 4);
const _: () = assert!(core::mem::size_of::<Wait>() == 8 + 5 * 4 + 2 * 2 + COMM_LEN + 8 + 8);
const _: () = assert!(core::mem::offset_of!(Wait, weight) == 8 + 5 * 4 + 2 * 2 + COMM_LEN + 8);
const _: () = assert!(core::mem::offset_of!(Wait, cgroup_id) == 8 + 5 * 4 + 2 * 2 + COMM_LEN);
const _: () = assert!(core::mem::align_of::<SampleKey>() == 8);
const _: () = assert!(core::mem::size_of::<ProcessEvent>() == 8 + 4 * 4);
const _: () = assert!(core::mem::size_of::<ThreadExit>() == 3 * 8 + 2 * 4 + COMM_LEN);
const _: () = assert!(
    core::mem::size_of::<SpilledSample>()
        == 5 * 4 + COMM_LEN + 4 + 8 + 8 + 8 * (MAX_USER_DEPTH + MAX_STACK_DEPTH)
);
const _: () = assert!(core::mem::size_of::<SampleValue>() == 16);
const _: () = assert!(core::mem::align_of::<SpilledSample>() == 8);
