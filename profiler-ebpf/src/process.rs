//! Process instances: the id the sampler hands a process the first time it
//! samples it (announced to the daemon, which reads its mappings then), and
//! the exec and exit tracepoints that keep that table honest.

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_pid_tgid, bpf_get_prandom_u32, bpf_ktime_get_ns},
    macros::{map, raw_tracepoint},
    maps::{LruHashMap, RingBuf},
    programs::RawTracePointContext,
};
use aya_log_ebpf::warn;
use profiler_common::{Counter, ProcessEvent, ProcessEventKind, maps::*};

use crate::{EEXIST, bump, off_cpu, python, unwind::UNWIND_PROCESSES};

/// tgid -> instance of the process the sampler currently knows by that tgid.
#[map]
pub(crate) static PROCESSES: LruHashMap<u32, u32> =
    LruHashMap::with_max_entries(DEFAULT_PROCESSES_ENTRIES, 0);
#[map]
static PROCESS_EVENTS: RingBuf = RingBuf::with_byte_size(PROCESS_EVENTS_BYTES, 0);

/// The instance id of the process `tgid`, handing out (and announcing) a new one
/// the first time the process is sampled.
#[inline(always)]
pub(crate) fn process_instance<C: EbpfContext>(ctx: &C, tgid: u32) -> u32 {
    // SAFETY: the value is only read.
    if let Some(instance) = unsafe { PROCESSES.get(&tgid) } {
        return *instance;
    }
    // Random rather than a counter: unique enough across pid reuse without a
    // shared atomic; never 0, which means "unknown".
    // SAFETY: a helper without arguments.
    let instance = unsafe { bpf_get_prandom_u32() } | 1;
    match PROCESSES.insert(&tgid, &instance, BPF_NOEXIST as u64) {
        Ok(()) => {
            announce(ProcessEventKind::Started, tgid, instance);
            instance
        }
        // Another CPU sampled a thread of the same new process first.
        // SAFETY: the value is only read.
        Err(err) if -err == EEXIST => unsafe { PROCESSES.get(&tgid) }.copied().unwrap_or(0),
        Err(_) => {
            if bump(Counter::ProcessMapFull) == 0 {
                warn!(ctx, "process map refused an entry (first time on this CPU)");
            }
            0
        }
    }
}

#[inline(always)]
fn announce(kind: ProcessEventKind, tgid: u32, instance: u32) {
    match PROCESS_EVENTS.reserve::<ProcessEvent>(0) {
        Some(mut entry) => {
            entry.write(ProcessEvent {
                // SAFETY: a helper without arguments.
                ktime_ns: unsafe { bpf_ktime_get_ns() },
                kind: kind as u32,
                tgid,
                instance,
                reserved: 0,
            });
            entry.submit(0);
        }
        None => {
            bump(Counter::ProcessEventsLost);
        }
    }
}

/// After exec the process has new mappings: forget its instance so the next
/// sample announces a new one and the daemon reads the new mappings.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn on_exec(_ctx: RawTracePointContext) -> i32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let _ = PROCESSES.remove(&tgid);
    let _ = UNWIND_PROCESSES.remove(&tgid);
    python::forget(tgid);
    0
}

/// When a thread exits, its off-CPU record goes (a later thread may get its
/// tid). When a sampled process's main thread exits, tell the daemon (so it can drop
/// the mappings once the last samples are drained) and free the tgid.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn on_exit(_ctx: RawTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    off_cpu::thread_exited(pid_tgid as u32);
    if pid_tgid as u32 != tgid {
        return 0;
    }
    let _ = UNWIND_PROCESSES.remove(&tgid);
    python::forget(tgid);
    // SAFETY: the value is only read.
    if let Some(instance) = unsafe { PROCESSES.get(&tgid) }.copied() {
        let _ = PROCESSES.remove(&tgid);
        announce(ProcessEventKind::Exited, tgid, instance);
    }
    0
}
