//! Allocations of traced processes: uprobes on their allocator's entry
//! points (the attach cookie says which, see `alloc_op`) and uretprobes on
//! the allocating ones.
//!
//! - Entry: the thread remembers the call (size, posix_memalign's
//!   out-pointer). A call inside another allocator call
//!   (glibc's realloc(NULL, n) calls malloc) only deepens it: one call, one
//!   count.
//! - Return: byte-based sampling as Go, jemalloc and tcmalloc do (a
//!   per-thread countdown of exponentially drawn bytes, mean
//!   `ALLOC_INTERVAL`; 0: every allocation). A sampled allocation is walked
//!   from the caller's registers (the kernel has put the return address
//!   back: no trampoline frame) and counted as `ALLOC` under its stack; its
//!   block is remembered.
//! - free (and realloc's old block, at realloc's entry): a remembered
//!   block's free is counted
//!   as `ALLOC_FREED` under the allocation's own key and stack, so the
//!   daemon's allocations less frees are the blocks still in use.
//!
//! Only processes in `ALLOC_TRACED` are recorded: the daemon attaches the
//! probes to one process at a time and removes its entry to stop at once.

use aya_ebpf::{
    EbpfContext, Global,
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_prandom_u32, bpf_ktime_get_ns,
        bpf_probe_read_user, generated::bpf_get_attach_cookie,
    },
    macros::{map, uprobe, uretprobe},
    maps::{Array, HashMap, PerCpuArray},
    programs::{ProbeContext, RetProbeContext},
};
use profiler_common::{
    ALLOC_DRAW_COUNT, AllocBlock, AllocBlockKey, AllocStackKey, AllocThread, AllocTraced, COMM_LEN, Counter,
    SampleKey, alloc_op, maps::*, sample_kind,
};

mod blocks;

use crate::{
    BUFFER_0, BUFFER_1, atomic_add, bump, current_cgroup, generation, process_instance, stored_stack_id,
    unwind, walk::Walk,
};
use blocks::{ALLOC_BLOCKS, ALLOC_STACKS, add_to, freed};

const EFAULT: i32 = 14;

/// tgid -> what tracing it cost; present = traced.
#[map]
static ALLOC_TRACED: HashMap<u32, AllocTraced> = HashMap::with_max_entries(ALLOC_TRACED_ENTRIES, 0);
/// tid -> its allocator call in progress and sampling countdown.
#[map]
static ALLOC_THREADS: HashMap<u32, AllocThread> =
    HashMap::with_max_entries(ALLOC_THREADS_ENTRIES, BPF_F_NO_PREALLOC);
/// Exponential draws of the sampling interval, filled by the daemon.
#[map]
static ALLOC_DRAWS: Array<u64> = Array::with_max_entries(ALLOC_DRAW_COUNT, 0);
#[map]
static ALLOC_SCRATCH: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);
/// Set while this CPU's scratch is in use: a probe program can be
/// preempted (it runs with migration, not preemption, disabled), and
/// another one on this CPU must not walk into the same scratch.
#[map]
static ALLOC_BUSY: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

#[unsafe(no_mangle)]
static ALLOC_INTERVAL: Global<u64> = Global::new(512 * 1024);
#[unsafe(no_mangle)]
static ALLOC_BLOCKS_PER_PROCESS: Global<u64> = Global::new(65_536);

/// Every probed allocator function's entry, free included.
#[uprobe(multi)]
pub fn alloc_enter(ctx: ProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    let Some(traced) = ALLOC_TRACED.get_ptr_mut(&tgid) else {
        return 0;
    };
    // SAFETY: a live map value; other CPUs add to it too, hence atomics.
    unsafe { atomic_add(&mut (*traced).calls, 1) };
    bump(Counter::AllocCalls);
    // SAFETY: the helper reads the cookie of the link that fired.
    let op = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let argument = |n| ctx.arg::<u64>(n).unwrap_or(0);
    if op == alloc_op::FREE {
        freed(true, tgid, tid, argument(0));
        return 0;
    }
    let (size, kept) = match op {
        alloc_op::CALLOC => (argument(0).wrapping_mul(argument(1)), 0),
        alloc_op::REALLOC => {
            // The old block counts as freed here, at the call: a realloc
            // that fails (and keeps it) is rare, and the return probe stays
            // small for the verifier, which checks the stack walk below it
            // once per distinct path.
            freed(false, tgid, tid, argument(0));
            (argument(1), 0)
        }
        alloc_op::MEMALIGN => (argument(1), 0),
        alloc_op::POSIX_MEMALIGN => (argument(2), argument(0)),
        _ => (argument(0), 0),
    };
    let thread = match ALLOC_THREADS.get_ptr_mut(&tid) {
        Some(thread) => thread,
        None => {
            let fresh = AllocThread {
                countdown: next_interval() as i64,
                ..AllocThread::default()
            };
            if ALLOC_THREADS.insert(&tid, &fresh, 0).is_err() {
                bump(Counter::AllocThreadsFull);
                return 0;
            }
            let Some(thread) = ALLOC_THREADS.get_ptr_mut(&tid) else {
                return 0;
            };
            thread
        }
    };
    // SAFETY: this thread's own entry: only this thread, on this CPU, writes it.
    unsafe {
        if (*thread).depth > 0 {
            (*thread).depth += 1;
            bump(Counter::AllocNested);
            return 0;
        }
        (*thread).depth = 1;
        (*thread).op = op as u32;
        (*thread).size = size;
        (*thread).argument = kept;
    }
    0
}

/// The allocating functions' return.
#[uretprobe(multi)]
pub fn alloc_return(ctx: RetProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    let Some(thread) = ALLOC_THREADS.get_ptr_mut(&tid) else {
        return 0;
    };
    // SAFETY: this thread's own entry (see alloc_enter).
    let call = unsafe {
        if (*thread).depth == 0 {
            // The probes were attached while this call was under way.
            return 0;
        }
        (*thread).depth -= 1;
        if (*thread).depth > 0 {
            return 0;
        }
        *thread
    };
    let returned: u64 = ctx.ret();
    let block = match u64::from(call.op) {
        alloc_op::POSIX_MEMALIGN if returned == 0 && call.argument != 0 => {
            // SAFETY: read from the traced process's memory, checked.
            unsafe { bpf_probe_read_user(call.argument as *const u64) }.unwrap_or(0)
        }
        alloc_op::POSIX_MEMALIGN => 0,
        _ => returned,
    };
    if block == 0 || call.size == 0 || !ALLOC_TRACED.get_ptr(&tgid).is_some() {
        return 0;
    }
    let interval = ALLOC_INTERVAL.load();
    if interval != 0 {
        // SAFETY: this thread's own entry (see alloc_enter).
        unsafe {
            (*thread).countdown -= call.size as i64;
            if (*thread).countdown > 0 {
                return 0;
            }
            (*thread).countdown = next_interval() as i64;
        }
    }
    sampled(&ctx, tgid, tid, block, call.size);
    0
}

/// Records a sampled allocation of `size` bytes at `block`.
#[inline(always)]
fn sampled(ctx: &RetProbeContext, tgid: u32, tid: u32, block: u64, size: u64) {
    let (Some(busy), Some(scratch)) = (ALLOC_BUSY.get_ptr_mut(0), ALLOC_SCRATCH.get_ptr_mut(0)) else {
        return;
    };
    // SAFETY: this CPU's flag; see ALLOC_BUSY.
    unsafe {
        if *busy != 0 {
            bump(Counter::AllocScratchBusy);
            return;
        }
        *busy = 1;
    }
    // SAFETY: `regs` is the context's pt_regs: the caller's user registers.
    let registers = unsafe { ((*ctx.regs).rip, (*ctx.regs).rsp, (*ctx.regs).rbp) };
    // Without CPython frames: with them, the verifier's paths through this
    // program pass its million-instruction bound.
    let walk = unwind::walk_user_stack_in(scratch, Some(registers), tgid, true);
    let generation = generation();
    let mut key = SampleKey {
        tgid,
        tid,
        instance: process_instance(ctx, tgid),
        user_stack_id: -EFAULT,
        kernel_stack_id: -EFAULT,
        comm: bpf_get_current_comm().unwrap_or([0; COMM_LEN]),
        kind: sample_kind::ALLOC,
        reserved: 0,
        generation,
        reserved2: 0,
        cgroup_id: current_cgroup(),
    };
    let buffer = if generation & 1 == 1 { BUFFER_1 } else { BUFFER_0 };
    let mut hash = 0;
    if let Some(walk) = walk {
        // SAFETY: the scratch the walk filled.
        let stack = unsafe { &(*walk).stack };
        hash = stack.hash;
        key.user_stack_id = stored_stack_id(stack, buffer.unwound_stacks);
        let stack_key = AllocStackKey {
            tgid,
            reserved: 0,
            hash,
        };
        // SAFETY: the value is only read.
        if unsafe { ALLOC_STACKS.get(&stack_key) }.is_none()
            && ALLOC_STACKS
                .insert(&stack_key, stack, BPF_NOEXIST as u64)
                .is_err()
        {
            hash = 0;
        }
    }
    // SAFETY: as above.
    unsafe { *busy = 0 };
    add_to(&buffer, &key, size);
    bump(Counter::AllocSampled);
    if let Some(traced) = ALLOC_TRACED.get_ptr_mut(&tgid) {
        // SAFETY: a live map value, added to atomically.
        unsafe { atomic_add(&mut (*traced).sampled, 1) };
    }
    let block_key = AllocBlockKey {
        tgid,
        reserved: 0,
        address: block,
    };
    let remembered = AllocBlock {
        size,
        // SAFETY: a helper without arguments.
        allocated_ns: unsafe { bpf_ktime_get_ns() },
        stack_hash: hash,
        cgroup_id: key.cgroup_id,
        comm: key.comm,
        tid,
        instance: key.instance,
        user_stack_id: key.user_stack_id,
        generation,
    };
    let Some(traced) = ALLOC_TRACED.get_ptr_mut(&tgid) else {
        return;
    };
    // SAFETY: a live map value; other CPUs add to it too, hence atomics.
    unsafe {
        if (*traced).live >= ALLOC_BLOCKS_PER_PROCESS.load()
            || ALLOC_BLOCKS.insert(&block_key, &remembered, 0).is_err()
        {
            bump(Counter::AllocBlocksFull);
            return;
        }
        atomic_add(&mut (*traced).live, 1);
    }
}

/// Bytes to the next sampled allocation: an exponential draw of mean
/// `ALLOC_INTERVAL` from the daemon's table.
#[inline(always)]
fn next_interval() -> u64 {
    // SAFETY: a helper without arguments.
    let index = unsafe { bpf_get_prandom_u32() } % ALLOC_DRAW_COUNT;
    ALLOC_DRAWS.get(index).copied().unwrap_or(0)
}

/// After exec the process is another program: its tracing ends (the
/// daemon sees the entry gone).
#[inline(always)]
pub fn exec(tgid: u32) {
    let _ = ALLOC_TRACED.remove(&tgid);
}

/// A thread exits: its allocator state goes (its tid may be reused).
#[inline(always)]
pub fn thread_exited(tid: u32) {
    let _ = ALLOC_THREADS.remove(&tid);
}
