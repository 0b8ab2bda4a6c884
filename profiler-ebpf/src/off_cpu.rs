//! Off-CPU: where threads wait. On every context switch (the sched_switch
//! raw tracepoint, which runs in the context of the thread leaving the CPU):
//!
//! - the thread leaving records when, why (blocked, or preempted and still
//!   runnable) and where: its kernel and user stacks, taken now, the user
//!   one through the same walk as CPU samples;
//! - the thread arriving ends its wait: the time away goes to the counts map
//!   under the stacks it left with, weighted by the odds it was recorded.
//!
//! Which switches are recorded: one in N (`--off-cpu-sample-every`, default
//! every one), and on a CPU that switches faster than the budget
//! (`--off-cpu-budget`, recorded switches per CPU per second) half as many,
//! or a quarter, and so on ([`drawn`]). A quiet machine records every
//! switch, exact per thread; a switch storm pays a recorded switch's stack
//! walks (~3 us) only as often as the budget allows. Every recorded wait
//! weighs one over its odds, so totals stay unbiased (and the daemon makes
//! the totals of threads with many waits exact from schedstat).
//!
//! A wait still going on at a drain is credited by the daemon up to the
//! drain (it reads OFF_CPU_WAITS), and the rest when it ends; so a thread
//! blocked for hours shows up in every window, not once at the end.
//!
//! Every switch pays the program's dispatch and what it does before it knows
//! there is nothing to record, so that part is kept to the minimum: an
//! unrecorded one costs a per-CPU counter, a random draw without a helper
//! call ([`draw`]) and a compare (the clock is read once in 256 switches,
//! and no event counter: the kernel counts switches, `ctxt` in /proc/stat),
//! and a
//! thread arriving without a recorded wait one array read (OFF_CPU_PENDING)
//! instead of a read of its task and a hash lookup. The clock, the thread id
//! and the buffer generation are read only where a wait begins or ends.

use aya_ebpf::{
    Global,
    bindings::BPF_F_USER_STACK,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{map, raw_tracepoint},
    maps::{Array, LruHashMap, StackTrace},
    programs::{RawTracePointContext, tracing::StackIdContext},
};
use profiler_common::{COMM_LEN, Counter, Wait, maps::*, sample_kind, unwind_mode};

use crate::{
    BUFFER_0, BUFFER_1, Buffer, UNWIND_MODE, atomic_add, bump, count, current_cgroup, generation,
    process_instance, unwind, unwound_stack_id,
};

mod draw;
use draw::{OFF_CPU_BUDGET_NS, drawn};

const EFAULT: i32 = 14;
/// Kernel frames to skip: none. The frames of this program, the
/// tracepoint and `__schedule` are not always the same number (the
/// trampoline is not always a frame), so the daemon drops them by name
/// (`SymbolizedStack::trim_switch_frames`).
const KERNEL_SKIP: u64 = 0;
/// `prev_state` of a task's last switch: it exited and will not run again.
const TASK_DEAD: u64 = 0x80;

/// tid -> its current wait.
#[map]
static OFF_CPU_WAITS: LruHashMap<u32, Wait> = LruHashMap::with_max_entries(DEFAULT_THREADS_ENTRIES, 0);

/// How many recorded waits not yet ended belong to tasks whose address
/// hashes to each slot ([`pending_slot`]). Used only when some switches may
/// go unrecorded (one in N, or a budget; with every switch recorded nearly
/// every arriving thread has a wait, and the daemon sizes this to one slot). A slot is never below the
/// waits it stands for: it is raised once a wait is stored, before the
/// thread can run anywhere, and lowered by the switch that ends the wait. A
/// wait evicted from OFF_CPU_WAITS, or whose end a failed read of the task
/// missed, leaves its slot one too high for good: that costs the slot's
/// tasks a lookup per switch, never a wait.
#[map]
static OFF_CPU_PENDING: Array<u64> = Array::with_max_entries(1 << OFF_CPU_PENDING_BITS, 0);

#[unsafe(no_mangle)]
static TASK_PID_OFFSET: Global<u64> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_CPU_SAMPLE_EVERY: Global<u64> = Global::new(1);
#[unsafe(no_mangle)]
static OFF_CPU_MIN_NS: Global<u64> = Global::new(0);

/// `sched_switch(bool preempt, task_struct *prev, task_struct *next,
/// unsigned int prev_state)`; attached only when off-CPU profiling is on.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn on_switch(ctx: RawTracePointContext) -> i32 {
    let every = OFF_CPU_SAMPLE_EVERY.load();
    let budget_ns = OFF_CPU_BUDGET_NS.load();
    // Some switches may go unrecorded: arriving threads check the pending
    // slots before looking for a wait.
    let sampled = every > 1 || budget_ns != 0;
    let now = switched_out(&ctx, every, budget_ns, sampled);
    switched_in(&ctx, sampled, now);
    0
}

/// The pending-waits slot of a task (its `task_struct` address, which the
/// tracepoint passes for both tasks: no read needed to find it).
#[inline(always)]
fn pending_slot(task: *const u8) -> Option<*mut u64> {
    // Fibonacci hashing: task structs sit at multiples of their slab
    // object size, so their low bits alone would crowd a few slots.
    let index = (task as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - OFF_CPU_PENDING_BITS);
    OFF_CPU_PENDING.get_ptr_mut(index as u32)
}

/// The current thread (prev) leaves the CPU: remember where it waits.
/// Returns the time the wait began, if one was recorded: the arriving
/// thread's wait ends at the same instant (the kernel charges this
/// program's run, stack walks included, to the arriving thread's CPU time,
/// so a later clock read would count the walks twice).
#[inline(always)]
fn switched_out(ctx: &RawTracePointContext, every: u64, budget_ns: u64, sampled: bool) -> Option<u64> {
    // The draw first: an unrecorded switch does nothing else.
    let weight = if sampled { drawn(every, budget_ns)? } else { 1 };
    // sched_switch has four arguments; the first and fourth are integers.
    let (preempt, prev_state) = (ctx.arg::<u64>(0), ctx.arg::<u64>(3));
    if prev_state & TASK_DEAD != 0 {
        return None;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    if tid == 0 {
        return None;
    }
    bump(Counter::OffCpuRecordedSwitches);
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let generation = generation();
    let tgid = (pid_tgid >> 32) as u32;
    // Preempted (or yielding) threads stay runnable: they wait for a CPU,
    // not for an event.
    let kind = if preempt & 1 == 1 || prev_state == 0 {
        sample_kind::OFF_CPU_RUNNABLE
    } else {
        sample_kind::OFF_CPU_BLOCKED
    };
    // The walk before the buffer is chosen, and each buffer's maps in their
    // own copy of the code below: the verifier then checks the walk once,
    // and never a map pointer that could be either buffer's.
    let walk = match UNWIND_MODE.load() {
        unwind_mode::TABLES => {
            UserWalk::Walked(unwind::walk_user_stack(unwind::saved_user_registers(), tgid))
        }
        _ => UserWalk::FramePointers,
    };
    let (user_stack_id, kernel_stack_id) = if generation & 1 == 1 {
        wait_stacks(ctx, walk, &BUFFER_1)
    } else {
        wait_stacks(ctx, walk, &BUFFER_0)
    };
    let wait = Wait {
        // Set last, below: the daemon reads a wait only when it is set.
        since_ns: 0,
        tgid,
        instance: process_instance(ctx, tgid),
        user_stack_id,
        kernel_stack_id,
        generation,
        kind,
        recorded_ns: 0,
        comm: bpf_get_current_comm().unwrap_or([0; COMM_LEN]),
        cgroup_id: current_cgroup(),
        weight,
    };
    // The wait is timed from here, with the time its stacks took added
    // once when it ends. That time is this switch's own cost, charged to the
    // arriving thread's CPU and lengthening this thread's wait: weighted N
    // with the rest, it would count N times over in the one switch in N
    // recorded (a third too much off-CPU time on a switch storm at N = 4).
    // SAFETY: a helper without arguments.
    let since = unsafe { bpf_ktime_get_ns() };
    let wait = Wait {
        recorded_ns: since.saturating_sub(now).min(u64::from(u16::MAX)) as u16,
        ..wait
    };
    let stored = match OFF_CPU_WAITS.get_ptr_mut(&tid) {
        Some(entry) => {
            // SAFETY: this thread's entry; the thread is on this CPU, so
            // nothing else writes it now. Volatile so `since_ns` is
            // stored after the rest (the daemon may be copying the entry).
            unsafe {
                core::ptr::write_volatile(entry, wait);
                core::ptr::write_volatile(&mut (*entry).since_ns, since);
            }
            true
        }
        None => {
            let wait = Wait {
                since_ns: since,
                ..wait
            };
            let inserted = OFF_CPU_WAITS.insert(&tid, &wait, 0).is_ok();
            if !inserted {
                bump(Counter::OffCpuWaitsMapFull);
            }
            inserted
        }
    };
    // Raised once the wait is stored (a wait refused is never ended, and
    // must not hold its slot up): the thread cannot arrive on any CPU
    // before this switch completes, so no switch-in reads the slot between.
    if stored
        && sampled
        && let Some(slot) = pending_slot(ctx.arg::<*const u8>(1))
    {
        // SAFETY: a live array slot; other CPUs add to it too.
        unsafe { atomic_add(slot, 1) };
    }
    Some(now)
}

#[derive(Clone, Copy)]
enum UserWalk {
    FramePointers,
    Walked(Option<*mut crate::walk::Walk>),
}

/// The ids of the current thread's (user, kernel) stacks in `buffer`.
#[inline(always)]
fn wait_stacks(ctx: &RawTracePointContext, walk: UserWalk, buffer: &Buffer) -> (i32, i32) {
    let user = match walk {
        UserWalk::Walked(Some(walk)) => {
            let id = unwound_stack_id(walk, buffer);
            if id < 0 {
                bump(Counter::OffCpuStackLost);
            }
            id
        }
        UserWalk::Walked(None) => -EFAULT,
        UserWalk::FramePointers => stack_id(ctx, buffer.user_stacks, BPF_F_USER_STACK as u64),
    };
    (user, stack_id(ctx, buffer.kernel_stacks, KERNEL_SKIP))
}

/// The next thread gets the CPU: its wait, if one was recorded, ends.
#[inline(always)]
fn switched_in(ctx: &RawTracePointContext, sampled: bool, now: Option<u64>) {
    let offset = TASK_PID_OFFSET.load();
    if offset == 0 {
        return;
    }
    // The third argument: the next task_struct.
    let next = ctx.arg::<*const u8>(2);
    let pending = if sampled { pending_slot(next) } else { None };
    if let Some(slot) = pending {
        // SAFETY: a live array slot; a plain read (a slot raised on another
        // CPU a moment ago belongs to a task that is still switching out
        // there, not this one).
        if unsafe { core::ptr::read_volatile(slot) } == 0 {
            return;
        }
    }
    // The arriving thread's wait ends now, before the work below: like the
    // walks (see switched_out), this program's run is its CPU time.
    // SAFETY: a helper without arguments.
    let now = now.unwrap_or_else(|| unsafe { bpf_ktime_get_ns() });
    // SAFETY: `next` is only read through probe_read, at an offset that
    // comes from BTF.
    let Ok(tid) = (unsafe { bpf_probe_read_kernel(next.wrapping_add(offset as usize) as *const u32) }) else {
        bump(Counter::OffCpuReadError);
        return;
    };
    if tid == 0 {
        return;
    }
    let Some(entry) = OFF_CPU_WAITS.get_ptr_mut(&tid) else {
        return;
    };
    // SAFETY: the entry of a thread that is not running: it left its last
    // CPU (the switch there is complete) and arrives here only.
    let wait = unsafe {
        let since = core::ptr::read_volatile(&(*entry).since_ns);
        if since == 0 {
            return;
        }
        core::ptr::write_volatile(&mut (*entry).since_ns, 0);
        Wait {
            since_ns: since,
            ..*entry
        }
    };
    if let Some(slot) = pending {
        // SAFETY: a live array slot; adding 2^64 - 1 takes one away.
        unsafe { atomic_add(slot, u64::MAX) };
    }
    let waited = now.saturating_sub(wait.since_ns);
    let recorded = u64::from(wait.recorded_ns);
    if waited + recorded < OFF_CPU_MIN_NS.load() {
        bump(Counter::OffCpuShort);
        return;
    }
    let weight = wait.weight.max(1);
    let key = wait.key(tid);
    let counts = if generation() & 1 == 1 {
        BUFFER_1.counts
    } else {
        BUFFER_0.counts
    };
    // No overflow: a wait clamped to 2^44 ns (4.9 hours; the daemon has
    // credited a longer one at its drains already) times a weight of at most
    // 2^20 (`draw::MAX_WEIGHT`, or N <= 10^6). A checked multiply would need
    // a 128-bit helper BPF does not have.
    count(
        ctx,
        counts,
        &key,
        weight,
        waited.min(1 << 44).wrapping_mul(weight) + recorded,
    );
    bump(Counter::OffCpuWaits);
}

/// A stack id, or a negative errno; -EFAULT (no such stack: a kernel
/// thread's user stack) is normal, anything else loses the stack.
#[inline(always)]
fn stack_id(ctx: &RawTracePointContext, map: &StackTrace, flags: u64) -> i32 {
    match ctx.get_stackid(map, flags) {
        Ok(id) => id as i32,
        Err(err) => {
            if -err != EFAULT {
                bump(Counter::OffCpuStackLost);
            }
            err
        }
    }
}

/// A thread exits: forget its wait (its tid may be reused).
#[inline(always)]
pub fn thread_exited(tid: u32) {
    let _ = OFF_CPU_WAITS.remove(&tid);
}
