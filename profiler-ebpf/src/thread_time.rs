//! Each thread's CPU time between two of its samples, from the kernel's own
//! accounting: what a CPU sample's amount is.

use aya_ebpf::{
    Global,
    helpers::{bpf_get_current_task, bpf_probe_read_kernel},
    macros::map,
    maps::LruHashMap,
};
use profiler_common::{Counter, maps::*};

use crate::bump;

/// tid -> the thread's CPU time (ns) as of its previous sample.
#[map]
static THREAD_TIMES: LruHashMap<u32, u64> = LruHashMap::with_max_entries(DEFAULT_THREADS_ENTRIES, 0);

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
    // SAFETY: the task pointer is only used as an address for probe_read.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    // SAFETY: probe_read checks the address; the offset comes from BTF.
    let Ok(runtime) = (unsafe { bpf_probe_read_kernel(task.wrapping_add(offset as usize) as *const u64) })
    else {
        bump(Counter::TaskReadError);
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
