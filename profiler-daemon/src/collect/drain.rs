//! Emptying the sampler's maps without losing a sample.
//!
//! The sampler writes into one of two buffers (a counts map plus its stack
//! maps: the kernel's stack-trace maps, or its own unwound stacks and their
//! tails, read by `stacks`); CONTROL says which. A drain flips CONTROL,
//! waits for programs that already picked the old buffer to finish, then
//! owns the old buffer alone: it reads every count and stack and deletes
//! them, so stack ids are reclaimed each cycle and the maps never fill up
//! with stale entries.

mod stacks;

use std::{collections::HashMap as StdHashMap, sync::Arc, time::Duration};

use aya::maps::{Array, HashMap, IterableMap, MapData, PerCpuArray, RingBuf, StackTraceMap};
use profiler_common::{
    CONTROL_GENERATION, Counter, SPILLED_STACK_ID_BASE, SampleKey, SampleValue, SpilledSample, UnwoundStack,
    Wait, maps,
};
use stacks::{StackTaker, drain_unwound, stacks_named};

use super::{
    CollectError, batch,
    clock::monotonic_now_ns,
    off_cpu::{ExactOffCpu, WaitsDrain},
    raw::{BpfCounters, CpuCredits, RawBatch, RawSample},
    thread_cpu::{CpuLedger, read::ThreadClock},
};

/// A perf_event program runs to completion in interrupt context in
/// microseconds; this grace period also covers a vCPU being descheduled by
/// the hypervisor mid-program. It only delays the drain thread, costs no CPU.
const FLIP_GRACE: Duration = Duration::from_millis(10);

/// Where the sampler puts user stacks: the kernel's stack-trace maps
/// (frame-pointer mode), or its own walk's unwound-stacks maps and the
/// tails of the stacks deeper than `MAX_STACK_DEPTH`.
pub enum UserStackMaps {
    StackTraces(Box<[StackTraceMap<MapData>; 2]>),
    Unwound(Box<UnwoundMaps>),
}

/// The sampler's own walk's stacks, one map per buffer, and their tails.
pub struct UnwoundMaps {
    pub stacks: [HashMap<MapData, u32, UnwoundStack>; 2],
    pub tails: [HashMap<MapData, u32, UnwoundStack>; 2],
}

/// Owns the sampler's maps on the daemon side.
pub struct Drainer {
    counts: [HashMap<MapData, SampleKey, SampleValue>; 2],
    user_stacks: UserStackMaps,
    kernel_stacks: [StackTraceMap<MapData>; 2],
    control: Array<MapData, u32>,
    counters: PerCpuArray<MapData, u64>,
    spilled: RingBuf<MapData>,
    /// The generation the sampler writes to now (its buffer: `& 1`).
    generation: u32,
    /// The possible CPUs (the values of each per-CPU counter) while the
    /// counters are read in one call; None: a lookup per counter.
    counters_batch: Option<usize>,
    counter_keys: Vec<u32>,
    counter_values: Vec<u64>,
    stacks: StackTaker,
    /// Reused by every drain (batch reads).
    count_keys: Vec<SampleKey>,
    count_values: Vec<SampleValue>,
    stack_keys: Vec<u32>,
    unwound: Vec<UnwoundStack>,
    tail_keys: Vec<u32>,
    tails: Vec<UnwoundStack>,
    waits: Option<WaitsDrain>,
    cpu: Option<(CpuLedger, ThreadClock)>,
}

impl Drainer {
    pub(super) fn new(
        counts: [HashMap<MapData, SampleKey, SampleValue>; 2],
        user_stacks: UserStackMaps,
        kernel_stacks: [StackTraceMap<MapData>; 2],
        control: Array<MapData, u32>,
        counters: PerCpuArray<MapData, u64>,
        spilled: RingBuf<MapData>,
    ) -> Self {
        Self {
            counts,
            user_stacks,
            kernel_stacks,
            control,
            counters,
            spilled,
            generation: 0,
            // The count aya sizes its own per-CPU reads by; unknown, the
            // counters are read one by one (aya's reads then fail loudly).
            counters_batch: aya::util::nr_cpus().ok().map(|cpus| cpus.get() as usize),
            counter_keys: Vec::new(),
            counter_values: Vec::new(),
            stacks: StackTaker::default(),
            count_keys: Vec::new(),
            count_values: Vec::new(),
            stack_keys: Vec::new(),
            unwound: Vec::new(),
            tail_keys: Vec::new(),
            tails: Vec::new(),
            waits: None,
            cpu: None,
        }
    }

    /// The sampler measures threads' CPU time: every drain tops it up to what
    /// the kernel accounted (see `thread_cpu`).
    /// `attached_ns`: CLOCK_MONOTONIC when the sampler was attached.
    pub(super) fn track_thread_cpu(&mut self, clock: ThreadClock, attached_ns: u64) {
        self.cpu = Some((CpuLedger::new(attached_ns), clock));
    }

    /// Off-CPU is on: waits still going on are read at every drain, and
    /// with `exact` (waits are sampled) sampled threads' totals made exact.
    pub(super) fn track_waits(
        &mut self,
        map: HashMap<MapData, u32, Wait>,
        min_ns: u64,
        exact: Option<ExactOffCpu>,
    ) {
        self.waits = Some(WaitsDrain::new(map, min_ns, exact));
    }

    /// Flips the buffers and returns everything the old one held.
    pub fn drain(&mut self) -> Result<RawBatch, CollectError> {
        let drained = self.generation;
        let old = (drained & 1) as usize;
        let next = drained.wrapping_add(1);
        self.control
            .set(CONTROL_GENERATION, &next, 0)
            .map_err(|source| CollectError::Map {
                name: maps::CONTROL,
                source,
            })?;
        let flipped_ns = monotonic_now_ns();
        self.generation = next;
        std::thread::sleep(FLIP_GRACE);

        let counters = self.read_counters()?;
        let mut batch = RawBatch {
            counters,
            ..RawBatch::default()
        };
        let (keys, values) = (&mut self.count_keys, &mut self.count_values);
        if let Err(err) = batch::read_all(self.counts[old].map(), true, keys, values) {
            batch.read_errors += 1;
            tracing::debug!("reading {}: {err}", maps::COUNTS[old]);
        }
        batch
            .samples
            .extend(keys.iter().zip(values.iter()).map(|(&key, value)| RawSample {
                key,
                count: value.count,
                amount: value.amount,
            }));
        batch.read_errors += match &mut self.user_stacks {
            UserStackMaps::StackTraces(maps) => {
                let used = stacks_named(&batch.samples, drained, |key| key.user_stack_id);
                self.stacks.drain(&mut maps[old], used, &mut batch.user_stacks)
            }
            UserStackMaps::Unwound(maps) => drain_unwound(
                [&maps.stacks[old], &maps.tails[old]],
                [&mut self.stack_keys, &mut self.tail_keys],
                [&mut self.unwound, &mut self.tails],
                &mut batch.user_stacks,
            ),
        };
        let used = stacks_named(&batch.samples, drained, |key| key.kernel_stack_id);
        batch.read_errors += self
            .stacks
            .drain(&mut self.kernel_stacks[old], used, &mut batch.kernel_stacks);
        self.drain_spilled(&mut batch, drained);
        if let Some((ledger, clock)) = &mut self.cpu {
            let cpu_before = crate::thread_cpu_ns();
            let mut credits = CpuCredits::default();
            let tgids = ledger.follow_sampled(&batch, |tgid| clock.threads_of(tgid), &mut credits);
            // Before the reads: a thread that starts during them is new
            // to the next drain.
            let read_ns = monotonic_now_ns();
            let readings = clock.read(ledger, &tgids, &mut batch.read_errors);
            credits.threads_read = readings
                .processes
                .iter()
                .filter_map(|(_, reading)| reading.as_ref())
                .map(|reading| reading.threads.len() as u64)
                .sum();
            ledger.credit(&mut batch, drained, readings, read_ns, &mut credits);
            clock.follow(ledger.take_changes(), &mut batch.read_errors);
            credits.cost_ns = crate::thread_cpu_ns().saturating_sub(cpu_before);
            batch.cpu_credits = credits;
        }
        if let Some(waits) = &mut self.waits {
            waits.drained(&mut batch, drained, flipped_ns);
        }
        Ok(batch)
    }

    /// Samples the sampler copied whole after a stack-id collision: each gets
    /// fresh stack ids above the stack maps' range.
    fn drain_spilled(&mut self, batch: &mut RawBatch, generation: u32) {
        let mut next_id = SPILLED_STACK_ID_BASE;
        let mut stack_id = |len: i32, frames: &[u64], stacks: &mut StdHashMap<u32, Arc<[u64]>>| -> i32 {
            let Ok(len) = usize::try_from(len) else {
                return len;
            };
            let id = next_id;
            next_id += 1;
            stacks.insert(id, frames[..(len / 8).min(frames.len())].into());
            id as i32
        };
        while let Some(item) = self.spilled.next() {
            if item.len() < size_of::<SpilledSample>() {
                batch.read_errors += 1;
                continue;
            }
            // SAFETY: length checked; SpilledSample is plain integers.
            let spilled = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<SpilledSample>()) };
            let key = SampleKey {
                tgid: spilled.tgid,
                tid: spilled.tid,
                instance: spilled.instance,
                user_stack_id: stack_id(spilled.user_len, &spilled.user, &mut batch.user_stacks),
                kernel_stack_id: stack_id(spilled.kernel_len, &spilled.kernel, &mut batch.kernel_stacks),
                comm: spilled.comm,
                // Checked where every key's kind is (symbolize: unknown
                // kinds are counted, not guessed).
                kind: spilled.kind,
                reserved: 0,
                generation,
                reserved2: 0,
                cgroup_id: spilled.cgroup_id,
            };
            batch.samples.push(RawSample {
                key,
                count: 1,
                amount: spilled.amount,
            });
            batch.spilled += 1;
        }
    }

    /// The BPF counters now, summed over CPUs: one batch read (a lookup
    /// per counter where this kernel cannot).
    pub fn read_counters(&mut self) -> Result<BpfCounters, CollectError> {
        let mut totals = BpfCounters::default();
        if let Some(cpus) = self.counters_batch {
            let (keys, values) = (&mut self.counter_keys, &mut self.counter_values);
            // SAFETY: COUNTERS is a per-CPU array of u64 with
            // Counter::COUNT entries (profiler-ebpf's main.rs), and `cpus`
            // the possible CPUs.
            match unsafe {
                batch::read_per_cpu_array(self.counters.map(), Counter::COUNT, cpus, keys, values)
            } {
                Ok(()) => {
                    for (total, per_cpu) in totals.0.iter_mut().zip(values.chunks_exact(cpus)) {
                        *total = per_cpu.iter().sum();
                    }
                    return Ok(totals);
                }
                Err(err) => {
                    tracing::debug!(
                        "reading {} in one call: {err}; one call per counter from now on",
                        maps::COUNTERS
                    );
                    self.counters_batch = None;
                }
            }
        }
        for counter in Counter::ALL {
            let per_cpu = self
                .counters
                .get(&(counter as u32), 0)
                .map_err(|source| CollectError::Map {
                    name: maps::COUNTERS,
                    source,
                })?;
            totals.0[counter as usize] = per_cpu.iter().sum();
        }
        Ok(totals)
    }
}
