//! Each thread's CPU time between two of its samples, from the kernel's own
//! accounting: what a CPU sample's amount is.

use aya_ebpf::{
    Global,
    helpers::{bpf_get_current_comm, bpf_get_current_task, bpf_probe_read_kernel},
    macros::map,
    maps::{HashMap, LruHashMap},
};
use profiler_common::{COMM_LEN, Counter, ThreadExit, maps::*};

use crate::{bump, process::PROCESSES};

/// tid -> the thread's CPU time (ns) as of its previous sample.
#[map]
static THREAD_TIMES: LruHashMap<u32, u64> = LruHashMap::with_max_entries(DEFAULT_THREADS_ENTRIES, 0);

/// tid -> its CPU time at exit, for threads the daemon may owe CPU (it
/// empties the map at every drain).
#[map]
static THREAD_EXITS: HashMap<u32, ThreadExit> = HashMap::with_max_entries(THREAD_EXITS_ENTRIES, 0);

/// tgid -> 1 for the processes whose threads' CPU the daemon follows
/// between samples (it keeps the map): their threads' exits are recorded,
/// sampled or not, whichever of them exits last.
#[map]
static CPU_FOLLOWED: HashMap<u32, u32> = HashMap::with_max_entries(CPU_FOLLOWED_ENTRIES, 0);

#[unsafe(no_mangle)]
static TASK_RUNTIME_OFFSET: Global<u64> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_START_OFFSET: Global<u64> = Global::new(0);
#[unsafe(no_mangle)]
static ATTACH_NS: Global<u64> = Global::new(0);
#[unsafe(no_mangle)]
static PERIOD_NS: Global<u64> = Global::new(10_101_010);

/// CPU time the current thread consumed since its previous sample, from the
/// kernel's own per-thread accounting (`se.sum_exec_runtime`, which the
/// scheduler brings up to date at every tick and context switch). A thread's
/// first sample carries all its CPU time if it started after the sampler was
/// attached, else one sampling period (all that is known).
#[inline(always)]
pub(crate) fn thread_cpu_since_last_sample(tid: u32) -> u64 {
    let period = PERIOD_NS.load();
    let offset = TASK_RUNTIME_OFFSET.load();
    if offset == 0 {
        return period;
    }
    let task = current_task();
    let Some(runtime) = runtime_of(task, offset) else {
        return period;
    };
    if let Some(last) = THREAD_TIMES.get_ptr_mut(&tid) {
        // SAFETY: the entry is this thread's, which runs on this CPU only now.
        return unsafe { runtime.saturating_sub(core::mem::replace(&mut *last, runtime)) };
    }
    if THREAD_TIMES.insert(&tid, &runtime, 0).is_err() {
        bump(Counter::ThreadMapFull);
        return period;
    }
    let start_offset = TASK_START_OFFSET.load();
    let started = match start_offset {
        0 => 0,
        // SAFETY: probe_read checks the address; the offset comes from BTF.
        _ => unsafe { bpf_probe_read_kernel(task.wrapping_add(start_offset as usize) as *const u64) }
            .unwrap_or(0),
    };
    if started >= ATTACH_NS.load() {
        runtime
    } else {
        period
    }
}

/// The current task, only ever used as an address for probe_read.
#[inline(always)]
fn current_task() -> *const u8 {
    // SAFETY: a helper without arguments; the pointer is never dereferenced.
    unsafe { bpf_get_current_task() as *const u8 }
}

/// The task's `se.sum_exec_runtime`; a failed read is counted.
#[inline(always)]
fn runtime_of(task: *const u8, offset: u64) -> Option<u64> {
    // SAFETY: probe_read checks the address; the offset comes from BTF.
    match unsafe { bpf_probe_read_kernel(task.wrapping_add(offset as usize) as *const u64) } {
        Ok(runtime) => Some(runtime),
        Err(_) => {
            bump(Counter::TaskReadError);
            None
        }
    }
}

/// A thread exits: its CPU time since the daemon last read it from /proc
/// would be lost with its /proc entry, so it is recorded for the threads
/// of processes the daemon follows (CPU_FOLLOWED), or will from its next
/// drain (sampled: PROCESSES). Its sample baseline stays: a sample in the
/// rest of its exit would otherwise start a new one from nothing (the
/// daemon takes back what samples after its exit carry).
#[inline(always)]
pub(crate) fn thread_exited(tid: u32, tgid: u32) {
    // SAFETY: the value is only read.
    let sampled_ns = unsafe { THREAD_TIMES.get(&tid) }.copied();
    // SAFETY: the values are only looked up.
    let followed = unsafe { CPU_FOLLOWED.get(&tgid).is_some() || PROCESSES.get(&tgid).is_some() };
    if !followed {
        return;
    }
    let offset = TASK_RUNTIME_OFFSET.load();
    if offset == 0 {
        return;
    }
    let task = current_task();
    let Some(runtime_ns) = runtime_of(task, offset) else {
        return;
    };
    let start_offset = TASK_START_OFFSET.load();
    let start_ns = match start_offset {
        0 => 0,
        // SAFETY: probe_read checks the address; the offset comes from BTF.
        _ => unsafe { bpf_probe_read_kernel(task.wrapping_add(start_offset as usize) as *const u64) }
            .unwrap_or(0),
    };
    let exit = ThreadExit {
        runtime_ns,
        start_ns,
        sampled_ns: sampled_ns.unwrap_or(0),
        tgid,
        reserved: 0,
        comm: bpf_get_current_comm().unwrap_or([0; COMM_LEN]),
    };
    if THREAD_EXITS.insert(&tid, &exit, 0).is_err() {
        bump(Counter::ThreadExitsFull);
    }
}
