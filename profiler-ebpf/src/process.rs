//! Process instances: the id the sampler hands a process the first time it
//! samples it (announced to the daemon, which reads its mappings then).
//! The exec and exit tracepoints that keep the table honest are in main.rs.

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns},
    macros::map,
    maps::{LruHashMap, RingBuf},
};
use aya_log_ebpf::warn;
use profiler_common::{Counter, ProcessEvent, ProcessEventKind, maps::*};

use crate::{EEXIST, bump};

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
pub(crate) fn announce(kind: ProcessEventKind, tgid: u32, instance: u32) {
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
