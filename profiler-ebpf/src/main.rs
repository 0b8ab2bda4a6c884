//! The sampler: a perf_event program on cpu-clock (one per CPU) that counts
//! (thread, process instance, cgroup, user stack, kernel stack) in-kernel, and two raw
//! tracepoints that keep the process-instance table honest across exec and exit.
//!
//! Two buffers (counts + stack maps) alternate: the sampler writes to the one
//! CONTROL names, the daemon flips CONTROL and drains the other, so no sample
//! lands in a map while it is being read and cleared.
#![no_std]
#![no_main]
// Atomic adds (BPF_ATOMIC) for counters several CPUs update: core's
// atomic types have no read-modify-write on this target.
#![allow(internal_features)]
#![feature(core_intrinsics)]
// Every unsafe block here talks to the kernel or dereferences a map pointer:
// each must say why it is sound (scripts/test.sh lints with -D warnings).
#![warn(clippy::undocumented_unsafe_blocks)]

mod alloc;
mod kernel_names;
mod off_cpu;
mod process;
mod python;
mod thread_time;
mod unwind;
mod walk;

use aya_ebpf::{
    EbpfContext, Global,
    bindings::{BPF_F_NO_PREALLOC, BPF_F_USER_STACK, BPF_NOEXIST, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_stack, generated,
    },
    macros::{map, perf_event, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf, StackTrace},
    programs::{PerfEventContext, RawTracePointContext, tracing::StackIdContext},
};
use aya_log_ebpf::warn;
use core::intrinsics::{AtomicOrdering, atomic_xadd};
use process::process_instance;
use profiler_common::{
    COMM_LEN, CONTROL_GENERATION, CONTROL_LEN, Counter, MAX_STACK_DEPTH, MAX_USER_DEPTH, ProcessEventKind,
    SPILLED_STACK_ID_BASE, SampleKey, SampleValue, SpilledSample, UnwindEnd, UnwoundStack, maps::*,
    sample_kind, unwind_mode,
};
use thread_time::thread_cpu_since_last_sample;
use unwind::UNWIND_PROCESSES;
use walk::Walk;

pub(crate) const EEXIST: i32 = 17;
const EFAULT: i32 = 14;
const ENOMEM: i32 = 12;

// The counts and unwound-stacks maps allocate their entries as samples come
// (BPF_F_NO_PREALLOC): the kernel memory they take follows the stacks a
// drain holds, not their maximum (36 MiB at rest before). Their entries are
// all deleted at every drain; an insert costs an allocation from the BPF
// memory allocator's per-CPU caches, which works in any context.
#[map]
static COUNTS_0: HashMap<SampleKey, SampleValue> =
    HashMap::with_max_entries(DEFAULT_COUNTS_ENTRIES, BPF_F_NO_PREALLOC);
#[map]
static COUNTS_1: HashMap<SampleKey, SampleValue> =
    HashMap::with_max_entries(DEFAULT_COUNTS_ENTRIES, BPF_F_NO_PREALLOC);
#[map]
static USER_STACKS_0: StackTrace = StackTrace::with_max_entries(DEFAULT_USER_STACKS_ENTRIES, 0);
#[map]
static USER_STACKS_1: StackTrace = StackTrace::with_max_entries(DEFAULT_USER_STACKS_ENTRIES, 0);
#[map]
static KERNEL_STACKS_0: StackTrace = StackTrace::with_max_entries(DEFAULT_KERNEL_STACKS_ENTRIES, 0);
#[map]
static KERNEL_STACKS_1: StackTrace = StackTrace::with_max_entries(DEFAULT_KERNEL_STACKS_ENTRIES, 0);
/// User stacks the sampler unwound itself (`UNWIND_MODE` = tables), keyed
/// by the low bits of their hash; one map per buffer, like the stack-trace maps.
#[map]
static UNWOUND_STACKS_0: HashMap<u32, UnwoundStack> =
    HashMap::with_max_entries(DEFAULT_UNWOUND_STACKS_ENTRIES, BPF_F_NO_PREALLOC);
#[map]
static UNWOUND_STACKS_1: HashMap<u32, UnwoundStack> =
    HashMap::with_max_entries(DEFAULT_UNWOUND_STACKS_ENTRIES, BPF_F_NO_PREALLOC);
/// The frames past `MAX_STACK_DEPTH` of the unwound stacks deeper than that.
#[map]
static UNWOUND_TAILS_0: HashMap<u32, UnwoundStack> =
    HashMap::with_max_entries(DEFAULT_UNWOUND_TAILS_ENTRIES, BPF_F_NO_PREALLOC);
#[map]
static UNWOUND_TAILS_1: HashMap<u32, UnwoundStack> =
    HashMap::with_max_entries(DEFAULT_UNWOUND_TAILS_ENTRIES, BPF_F_NO_PREALLOC);
#[map]
static CONTROL: Array<u32> = Array::with_max_entries(CONTROL_LEN, 0);
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT, 0);

#[unsafe(no_mangle)]
pub(crate) static UNWIND_MODE: Global<u64> = Global::new(unwind_mode::FRAME_POINTERS);
#[map]
static SPILLED_SAMPLES: RingBuf = RingBuf::with_byte_size(SPILLED_SAMPLES_BYTES, 0);

/// Adds `amount` to a per-CPU counter (see [`bump`] on why no atomics).
#[inline(always)]
pub(crate) fn add(counter: Counter, amount: u64) {
    if let Some(value) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: a valid per-CPU slot; programs do not nest on one CPU.
        unsafe { *value += amount };
    }
}

/// Adds one to a per-CPU counter and returns its previous value. No atomics:
/// the value is per CPU and tracing programs do not nest on one CPU.
#[inline(always)]
pub(crate) fn bump(counter: Counter) -> u64 {
    match COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: a valid per-CPU slot; programs do not nest on one CPU.
        Some(value) => unsafe {
            let before = *value;
            *value = before + 1;
            before
        },
        None => 0,
    }
}

/// Adds to a counter other CPUs may add to at the same time.
///
/// # Safety
/// `counter` must be valid for writes (a map value).
#[inline(always)]
pub(crate) unsafe fn atomic_add(counter: *mut u64, amount: u64) {
    // SAFETY: the caller's pointer; BPF's atomic add (lock xadd).
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(counter, amount) };
}

#[perf_event]
pub fn sample(ctx: PerfEventContext) -> u32 {
    bump(Counter::Samples);
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let tgid = (pid_tgid >> 32) as u32;
    if tid == 0 {
        // Each CPU's idle task (swapper/N) has pid 0; it is not a process.
        bump(Counter::Idle);
        return 0;
    }
    let generation = generation();
    let key = SampleKey {
        tgid,
        tid,
        instance: process_instance(&ctx, tgid),
        user_stack_id: 0,
        kernel_stack_id: 0,
        comm: bpf_get_current_comm().unwrap_or([0; COMM_LEN]),
        kind: sample_kind::CPU,
        reserved: 0,
        generation,
        reserved2: 0,
        cgroup_id: current_cgroup(),
    };
    let cpu_ns = thread_cpu_since_last_sample(tid);
    let in_kernel = !unwind::in_user_mode(&ctx);
    let user = match UNWIND_MODE.load() {
        unwind_mode::TABLES => UserStack::Unwound(unwind::walk_user_stack(
            unwind::sampled_user_registers(&ctx),
            tgid,
        )),
        _ => UserStack::FramePointers,
    };
    // Two monomorphic copies rather than one with a map pointer chosen at run
    // time: the verifier can then inline the map lookups.
    if generation & 1 == 1 {
        record(&ctx, key, cpu_ns, user, in_kernel, BUFFER_1)
    } else {
        record(&ctx, key, cpu_ns, user, in_kernel, BUFFER_0)
    }
    0
}

/// The buffer generation now (see CONTROL_GENERATION); its low bit picks
/// the buffer.
#[inline(always)]
pub(crate) fn generation() -> u32 {
    CONTROL.get(CONTROL_GENERATION).copied().unwrap_or(0)
}

#[inline(always)]
pub(crate) fn current_cgroup() -> u64 {
    // SAFETY: a helper without arguments; it cannot fail (the root cgroup's
    // id when the task has no other).
    unsafe { bpf_get_current_cgroup_id() }
}

pub(crate) const BUFFER_0: Buffer = Buffer {
    counts: &COUNTS_0,
    user_stacks: &USER_STACKS_0,
    unwound_stacks: &UNWOUND_STACKS_0,
    unwound_tails: &UNWOUND_TAILS_0,
    kernel_stacks: &KERNEL_STACKS_0,
};
pub(crate) const BUFFER_1: Buffer = Buffer {
    counts: &COUNTS_1,
    user_stacks: &USER_STACKS_1,
    unwound_stacks: &UNWOUND_STACKS_1,
    unwound_tails: &UNWOUND_TAILS_1,
    kernel_stacks: &KERNEL_STACKS_1,
};

/// How this sample's user stack is taken.
#[derive(Clone, Copy)]
pub(crate) enum UserStack {
    /// bpf_get_stackid / bpf_get_stack: frame pointers.
    FramePointers,
    /// Walked by the sampler (None: no user stack).
    Unwound(Option<*mut Walk>),
}

/// One of the two alternating buffers.
pub(crate) struct Buffer {
    pub counts: &'static HashMap<SampleKey, SampleValue>,
    pub user_stacks: &'static StackTrace,
    pub unwound_stacks: &'static HashMap<u32, UnwoundStack>,
    pub unwound_tails: &'static HashMap<u32, UnwoundStack>,
    pub kernel_stacks: &'static StackTrace,
}

#[inline(always)]
fn record(
    ctx: &PerfEventContext,
    mut key: SampleKey,
    cpu_ns: u64,
    user: UserStack,
    in_kernel: bool,
    buffer: Buffer,
) {
    let counts = buffer.counts;
    key.user_stack_id = match user {
        UserStack::FramePointers => stack_id(
            ctx,
            buffer.user_stacks,
            BPF_F_USER_STACK as u64,
            [
                Counter::NoUserStack,
                Counter::UserStackCollision,
                Counter::UserStackMapFull,
                Counter::UserStackError,
            ],
        ),
        UserStack::Unwound(None) => {
            bump(Counter::NoUserStack);
            -EFAULT
        }
        UserStack::Unwound(Some(walk)) => unwound_stack_id(walk, &buffer),
    };
    key.kernel_stack_id = if in_kernel {
        stack_id(
            ctx,
            buffer.kernel_stacks,
            0,
            [
                Counter::NoKernelStack,
                Counter::KernelStackCollision,
                Counter::KernelStackMapFull,
                Counter::KernelStackError,
            ],
        )
    } else {
        // A sample in user mode has no kernel frames: the helper would walk
        // nothing and say -EFAULT, after a third of a microsecond.
        bump(Counter::NoKernelStack);
        -EFAULT
    };
    if (key.user_stack_id == -EEXIST || key.kernel_stack_id == -EEXIST) && spill(ctx, &key, cpu_ns, user) {
        return;
    }
    count(ctx, counts, &key, 1, cpu_ns);
}

/// Adds to the counts entry of `key`, creating it if new.
#[inline(always)]
pub(crate) fn count<C: EbpfContext>(
    ctx: &C,
    counts: &HashMap<SampleKey, SampleValue>,
    key: &SampleKey,
    count: u64,
    amount: u64,
) {
    // The key holds the tid and a thread runs on one CPU at a time (and
    // is switched in on one), so no other CPU updates this entry
    // concurrently: plain additions are exact.
    if let Some(value) = counts.get_ptr_mut(key) {
        // SAFETY: the key holds the tid, so only this CPU updates this entry now.
        unsafe {
            (*value).count += count;
            (*value).amount += amount;
        }
        return;
    }
    let value = SampleValue { count, amount };
    if counts.insert(key, &value, BPF_NOEXIST as u64).is_err() && bump(Counter::CountsMapFull) == 0 {
        warn!(
            ctx,
            "counts map full: samples are being lost (first loss on this CPU)"
        );
    }
}

/// The id of the walked stack in `buffer`'s unwound stacks, storing it (and
/// its frames past `MAX_STACK_DEPTH` in the tails) if new; -EEXIST when
/// another stack holds its key (the caller spills the sample).
#[inline(always)]
pub(crate) fn unwound_stack_id(walk: *mut Walk, buffer: &Buffer) -> i32 {
    // SAFETY: `walk` is this CPU's scratch entry, filled by the walk, and
    // nothing else uses it until this program returns (see unwind.rs).
    let walk = unsafe { &mut *walk };
    if walk.stack.len as usize > MAX_STACK_DEPTH && !stored_tail(walk, buffer.unwound_tails) {
        // No room for the tail: the leaf-most frames, as the kernel keeps
        // them. The hash still names the whole stack, so the truncated one
        // never takes the key of a whole one.
        bump(Counter::UnwoundTailsFull);
        walk.stack.len = MAX_STACK_DEPTH as u32;
        walk.stack.end = UnwindEnd::DepthLimit as u32;
    }
    stored_stack_id(&walk.stack, buffer.unwound_stacks)
}

/// Stores the walk's frames past `MAX_STACK_DEPTH` under its stack's key
/// (or finds them there, stored by another CPU); false if the key holds
/// another stack's tail or the map is full.
#[inline(always)]
fn stored_tail(walk: &mut Walk, tails: &HashMap<u32, UnwoundStack>) -> bool {
    let id = (walk.stack.hash as u32) & (SPILLED_STACK_ID_BASE - 1);
    walk.tail.hash = walk.stack.hash;
    walk.tail.len = walk.stack.len - MAX_STACK_DEPTH as u32;
    walk.tail.end = walk.stack.end;
    match tails.insert(&id, &walk.tail, BPF_NOEXIST as u64) {
        Ok(()) => true,
        Err(err) if -err == EEXIST => {
            // SAFETY: the value is only read (another CPU may insert, never change it).
            let stored = unsafe { tails.get(&id) };
            stored.is_some_and(|tail| tail.hash == walk.stack.hash)
        }
        Err(_) => false,
    }
}

/// As [`unwound_stack_id`], for a stack held anywhere (a map value).
#[inline(always)]
pub(crate) fn stored_stack_id(stack: &UnwoundStack, stacks: &HashMap<u32, UnwoundStack>) -> i32 {
    let id = (stack.hash as u32) & (SPILLED_STACK_ID_BASE - 1);
    for _ in 0..2 {
        // SAFETY: the value is only read (another CPU may insert, never change it).
        if let Some(existing) = unsafe { stacks.get(&id) } {
            if existing.hash == stack.hash {
                return id as i32;
            }
            bump(Counter::UnwoundStackCollision);
            return -EEXIST;
        }
        match stacks.insert(&id, stack, BPF_NOEXIST as u64) {
            Ok(()) => return id as i32,
            // Another CPU stored a stack under this key first: look again.
            Err(err) if -err == EEXIST => continue,
            Err(err) => {
                bump(Counter::UnwoundStackMapFull);
                return err;
            }
        }
    }
    -EEXIST
}

/// Copies a sample (its kind, count 1 and `amount`) with both stacks into
/// the spill ring; false if it is full.
#[inline(always)]
fn spill(ctx: &PerfEventContext, key: &SampleKey, amount: u64, user: UserStack) -> bool {
    let Some(mut entry) = SPILLED_SAMPLES.reserve::<SpilledSample>(0) else {
        bump(Counter::SpillLost);
        return false;
    };
    let sample = entry.as_mut_ptr();
    const STACK_BYTES: u32 = (MAX_STACK_DEPTH * 8) as u32;
    // SAFETY: `sample` points at the reserved record, which the fields and the
    // stack buffers (user: twice STACK_BYTES, kernel: STACK_BYTES) lie within.
    unsafe {
        (*sample).tgid = key.tgid;
        (*sample).tid = key.tid;
        (*sample).instance = key.instance;
        (*sample).comm = key.comm;
        (*sample).kind = key.kind;
        (*sample).reserved = 0;
        (*sample).amount = amount;
        (*sample).cgroup_id = key.cgroup_id;
        let frames = core::ptr::addr_of_mut!((*sample).user).cast();
        (*sample).user_len = match user {
            UserStack::FramePointers => {
                bpf_get_stack(ctx.as_ptr(), frames, STACK_BYTES, BPF_F_USER_STACK as u64) as i32
            }
            UserStack::Unwound(Some(walk)) => {
                let (stack, tail) = (&(*walk).stack, &(*walk).tail);
                // The frames past MAX_STACK_DEPTH follow, when there are any.
                let deeper: *mut u64 = core::ptr::addr_of_mut!((*sample).user[MAX_STACK_DEPTH]);
                let read =
                    match generated::bpf_probe_read_kernel(frames, STACK_BYTES, stack.frames.as_ptr().cast())
                    {
                        0 if stack.len as usize > MAX_STACK_DEPTH => generated::bpf_probe_read_kernel(
                            deeper.cast(),
                            STACK_BYTES,
                            tail.frames.as_ptr().cast(),
                        ),
                        result => result,
                    };
                match read {
                    0 => (stack.len.min(MAX_USER_DEPTH as u32) * 8) as i32,
                    err => err as i32,
                }
            }
            UserStack::Unwound(None) => -EFAULT,
        };
        let kernel = core::ptr::addr_of_mut!((*sample).kernel).cast();
        (*sample).kernel_len = bpf_get_stack(ctx.as_ptr(), kernel, STACK_BYTES, 0) as i32;
    }
    // No wakeup: the daemon empties the ring at every drain.
    entry.submit(BPF_RB_NO_WAKEUP as u64);
    bump(Counter::Spilled);
    true
}

/// The stack's id, or the negative errno; each failure kind is counted.
/// `counters` = [no stack, collision, map full, other error].
#[inline(always)]
fn stack_id(ctx: &PerfEventContext, map: &StackTrace, flags: u64, counters: [Counter; 4]) -> i32 {
    match ctx.get_stackid(map, flags) {
        Ok(id) => id as i32,
        Err(err) => {
            let counter = match -err {
                EFAULT => counters[0],
                EEXIST => counters[1],
                ENOMEM => counters[2],
                _ => counters[3],
            };
            bump(counter);
            err
        }
    }
}

/// After exec the process has new mappings: forget its instance so the next
/// sample announces a new one and the daemon reads the new mappings.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn on_exec(_ctx: RawTracePointContext) -> i32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let _ = process::PROCESSES.remove(&tgid);
    let _ = UNWIND_PROCESSES.remove(&tgid);
    python::forget(tgid);
    alloc::exec(tgid);
    0
}

/// When a thread exits, its off-CPU record goes (a later thread may get its
/// tid). When a sampled process's main thread exits, tell the daemon (so it can drop
/// the mappings once the last samples are drained) and free the tgid.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn on_exit(_ctx: RawTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // Before the process's instance goes (below).
    thread_time::thread_exited(pid_tgid as u32, tgid);
    off_cpu::thread_exited(pid_tgid as u32);
    alloc::thread_exited(pid_tgid as u32);
    if pid_tgid as u32 != tgid {
        return 0;
    }
    let _ = UNWIND_PROCESSES.remove(&tgid);
    python::forget(tgid);
    // SAFETY: the value is only read.
    if let Some(instance) = unsafe { process::PROCESSES.get(&tgid) }.copied() {
        let _ = process::PROCESSES.remove(&tgid);
        process::announce(ProcessEventKind::Exited, tgid, instance);
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
