//! Allocation tracing: what the allocator uprobes keep per thread, per
//! traced process and per sampled live block.

use crate::COMM_LEN;

/// Which allocator entry point a probe is on: its attach cookie.
pub mod alloc_op {
    /// `malloc(size)`, `valloc(size)`, `pvalloc(size)`.
    pub const MALLOC: u64 = 1;
    /// `calloc(count, size)`.
    pub const CALLOC: u64 = 2;
    /// `realloc(old, size)`: frees `old` (counted at the call).
    pub const REALLOC: u64 = 3;
    /// `memalign(alignment, size)`, `aligned_alloc(alignment, size)`.
    pub const MEMALIGN: u64 = 4;
    /// `posix_memalign(&block, alignment, size)`: the block is written
    /// through its first argument when it returns 0.
    pub const POSIX_MEMALIGN: u64 = 5;
    /// `free(block)`.
    pub const FREE: u64 = 6;
}

/// A thread's allocator call in progress, and its byte countdown to the
/// next sampled allocation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocThread {
    /// Bytes still to allocate before the next sample (sampling on).
    pub countdown: i64,
    /// The call's requested size.
    pub size: u64,
    /// posix_memalign's out-pointer.
    pub argument: u64,
    /// Allocator calls in progress on this thread: a call inside another
    /// (glibc's realloc calling malloc) is not counted again.
    pub depth: u32,
    /// One of [`alloc_op`], as u32.
    pub op: u32,
}

/// A traced process: the probes fire for it, and count what it costs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocTraced {
    /// Allocator calls that reached a probe (entry probes, free included).
    pub calls: u64,
    /// Allocations recorded (sampled).
    pub sampled: u64,
    /// Frees of recorded blocks.
    pub freed: u64,
    /// Recorded blocks not yet freed (at most `ALLOC_BLOCKS_PER_PROCESS`:
    /// one process cannot take every other's room).
    pub live: u64,
}

/// Key of the live-block map: a sampled block of a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AllocBlockKey {
    pub tgid: u32,
    /// Always 0.
    pub reserved: u32,
    pub address: u64,
}

/// A sampled block not yet freed: what its free is counted under.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocBlock {
    pub size: u64,
    /// bpf_ktime_get_ns() when it was allocated: its free adds its lifetime.
    pub allocated_ns: u64,
    /// The allocation's user stack (its hash; see `AllocStackKey`).
    pub stack_hash: u64,
    pub cgroup_id: u64,
    pub comm: [u8; COMM_LEN],
    /// The allocating thread.
    pub tid: u32,
    pub instance: u32,
    /// Its id in the unwound-stacks map of `generation`'s buffer.
    pub user_stack_id: i32,
    pub generation: u32,
}

/// Key of the allocation-stacks map: a stack of a process, by its hash.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AllocStackKey {
    pub tgid: u32,
    /// Always 0.
    pub reserved: u32,
    pub hash: u64,
}

/// Entries of the sampling table: exponential draws of the byte interval.
pub const ALLOC_DRAW_COUNT: u32 = 256;

// The layout is the contract: no implicit padding, sizes fixed.
const _: () = assert!(core::mem::size_of::<AllocThread>() == 32);
const _: () = assert!(core::mem::size_of::<AllocTraced>() == 32);
const _: () = assert!(core::mem::size_of::<AllocBlockKey>() == 16);
const _: () = assert!(core::mem::size_of::<AllocBlock>() == 64);
const _: () = assert!(core::mem::size_of::<AllocStackKey>() == 16);
