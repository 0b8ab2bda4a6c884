//! Off-CPU waits that span drains.
//!
//! The sampler takes a wait's stacks when the thread leaves the CPU, into
//! the buffer of that moment, and adds the wait to the counts when the thread
//! runs again — maybe several drains later, under a key whose `generation`
//! names the buffer that held the stacks. So at every drain the tracker:
//!
//! 1. gives the drained waits of earlier generations the stacks it kept, and
//!    takes off what it already credited of them (step 2 of earlier drains);
//! 2. reads the waits still going on and credits each with its time up to
//!    this drain's flip, keeping their stacks: a thread blocked for the
//!    whole window still shows its wait in that window;
//! 3. forgets what no wait has used for two drains.
//!
//! Each stretch of a wait is counted once: before the flip by the daemon,
//! after it by the sampler (which counts the whole wait when it ends, less
//! what was credited, taken off in step 1).

use std::{
    collections::{HashMap as StdHashMap, hash_map::Entry},
    sync::Arc,
};

use aya::maps::{HashMap as MapHandle, IterableMap as _, MapData};
use profiler_common::{SPILLED_STACK_ID_BASE, SampleKey, Wait, maps};

use super::{
    batch,
    raw::{RawBatch, RawSample},
};

mod exact;
pub(super) use exact::ExactOffCpu;

/// Stack ids the tracker gives kept stacks in a batch; spilled ones count
/// up from SPILLED_STACK_ID_BASE, far below this.
const KEPT_STACK_ID_BASE: u32 = SPILLED_STACK_ID_BASE | (1 << 29);
const EFAULT: i32 = 14;

/// A wait's stacks: (generation, user stack id, kernel stack id).
type StackRef = (u32, i32, i32);

#[derive(Clone, Debug)]
struct KeptStacks {
    user: Option<Arc<[u64]>>,
    kernel: Option<Arc<[u64]>>,
    /// The drain that last saw a wait using them.
    seen: u64,
}

/// What step 2 credited of a thread's current wait.
#[derive(Clone, Copy, Debug)]
struct Credited {
    since_ns: u64,
    generation: u32,
    /// Credited up to here (a flip time).
    until_ns: u64,
    /// Weighted nanoseconds credited so far.
    ns: u64,
    seen: u64,
}

/// Off-CPU at a drain: the waits map read, the tracker, and (when waits are
/// sampled) sampled threads' totals made exact.
pub(super) struct WaitsDrain {
    map: MapHandle<MapData, u32, Wait>,
    tracker: WaitTracker,
    exact: Option<ExactOffCpu>,
    /// Reused at every drain.
    tids: Vec<u32>,
    read: Vec<Wait>,
    entries: Vec<(u32, Wait)>,
}

impl WaitsDrain {
    pub(super) fn new(map: MapHandle<MapData, u32, Wait>, min_ns: u64, exact: Option<ExactOffCpu>) -> Self {
        Self {
            map,
            tracker: WaitTracker::new(min_ns),
            exact,
            tids: Vec::new(),
            read: Vec::new(),
            entries: Vec::new(),
        }
    }

    /// `batch` is the buffer of `generation`, drained after the flip at
    /// `flipped_ns`: the waits still going on are read and credited, and
    /// sampled threads' totals made exact.
    pub(super) fn drained(&mut self, batch: &mut RawBatch, generation: u32, flipped_ns: u64) {
        if let Err(err) = batch::read_all(self.map.map(), false, &mut self.tids, &mut self.read) {
            batch.read_errors += 1;
            tracing::debug!("reading {}: {err}", maps::OFF_CPU_WAITS);
        }
        self.entries.clear();
        self.entries
            .extend(self.tids.iter().copied().zip(self.read.iter().copied()));
        self.tracker.drained(batch, generation, flipped_ns, &self.entries);
        if let Some(exact) = &mut self.exact {
            batch.off_cpu_exact += exact.drained(&mut batch.samples, &self.entries, generation);
        }
    }
}

pub(super) struct WaitTracker {
    min_ns: u64,
    drains: u64,
    kept: StdHashMap<StackRef, KeptStacks>,
    credited: StdHashMap<u32, Credited>,
    /// The previous drained batch's stacks and generation: waits that ended
    /// just after its flip carry its ids.
    previous: Option<PreviousStacks>,
}

/// A drained batch's stacks: (generation, user stacks, kernel stacks).
type PreviousStacks = (u32, StdHashMap<u32, Arc<[u64]>>, StdHashMap<u32, Arc<[u64]>>);

impl WaitTracker {
    pub(super) fn new(min_ns: u64) -> Self {
        Self {
            min_ns,
            drains: 0,
            kept: StdHashMap::new(),
            credited: StdHashMap::new(),
            previous: None,
        }
    }

    /// `batch` is the buffer of `generation`, drained after the flip at
    /// `flipped_ns` (CLOCK_MONOTONIC); `waits` is the OFF_CPU_WAITS map as
    /// read after the flip, by tid.
    pub(super) fn drained(
        &mut self,
        batch: &mut RawBatch,
        generation: u32,
        flipped_ns: u64,
        waits: &[(u32, Wait)],
    ) {
        self.drains += 1;
        let mut next_id = KEPT_STACK_ID_BASE;
        for index in 0..batch.samples.len() {
            let sample = batch.samples[index];
            if sample.key.kind == profiler_common::sample_kind::CPU || sample.key.generation == generation {
                continue;
            }
            let key = self.restack(batch, sample.key, &mut next_id);
            let mut amount = sample.amount;
            if let Some(credited) = self.credited.get(&key.tid)
                && credited.generation == sample.key.generation
            {
                amount = amount.saturating_sub(credited.ns);
                self.credited.remove(&key.tid);
            }
            batch.samples[index] = RawSample {
                key,
                amount,
                ..sample
            };
        }
        self.credit_ongoing(batch, generation, flipped_ns, waits, &mut next_id);
        let drains = self.drains;
        self.kept.retain(|_, kept| kept.seen + 2 > drains);
        self.credited.retain(|_, credited| credited.seen + 2 > drains);
        self.previous = Some((generation, batch.user_stacks.clone(), batch.kernel_stacks.clone()));
    }

    /// Step 2: every wait still going on, credited up to the flip.
    fn credit_ongoing(
        &mut self,
        batch: &mut RawBatch,
        generation: u32,
        flipped_ns: u64,
        waits: &[(u32, Wait)],
        next_id: &mut u32,
    ) {
        // A wait that began after the flip is in the new buffer: next time.
        // One of the drained generation may still be timed from after the
        // flip (the sampler picks the buffer before its stack walks and
        // times the wait after them): its stacks are kept now, as this is
        // their buffer's only drain, and its time credited from the next.
        let ongoing = waits.iter().filter(|(_, wait)| {
            wait.since_ns != 0 && (wait.since_ns < flipped_ns || wait.generation == generation)
        });
        for &(tid, wait) in ongoing {
            let stacks = (wait.generation, wait.user_stack_id, wait.kernel_stack_id);
            if wait.generation == generation {
                let kept = KeptStacks {
                    user: stack(&batch.user_stacks, wait.user_stack_id),
                    kernel: stack(&batch.kernel_stacks, wait.kernel_stack_id),
                    seen: self.drains,
                };
                self.kept.insert(stacks, kept);
            } else if let Some(kept) = self.kept.get_mut(&stacks) {
                kept.seen = self.drains;
            }
            if wait.since_ns >= flipped_ns || flipped_ns - wait.since_ns < self.min_ns {
                // Too short so far: the sampler may still drop it.
                continue;
            }
            let credited = match self.credited.entry(tid) {
                Entry::Occupied(entry)
                    if entry.get().since_ns == wait.since_ns && entry.get().generation == wait.generation =>
                {
                    entry.into_mut()
                }
                entry => {
                    let fresh = Credited {
                        since_ns: wait.since_ns,
                        generation: wait.generation,
                        until_ns: wait.since_ns,
                        ns: 0,
                        seen: self.drains,
                    };
                    match entry {
                        Entry::Occupied(mut entry) => {
                            entry.insert(fresh);
                            entry.into_mut()
                        }
                        Entry::Vacant(entry) => entry.insert(fresh),
                    }
                }
            };
            let ns = flipped_ns
                .saturating_sub(credited.until_ns)
                .saturating_mul(wait.weight.max(1));
            credited.until_ns = flipped_ns;
            credited.ns += ns;
            credited.seen = self.drains;
            let key = wait.key(tid);
            let key = if wait.generation == generation {
                key
            } else {
                self.restack(batch, key, next_id)
            };
            // Waits are counted when they end; here only their time so far.
            batch.samples.push(RawSample {
                key,
                count: 0,
                amount: ns,
            });
        }
    }

    /// The key with stack ids of this batch for stacks of an earlier
    /// generation (kept, or the previous batch's).
    fn restack(&mut self, batch: &mut RawBatch, mut key: SampleKey, next_id: &mut u32) -> SampleKey {
        let reference = (key.generation, key.user_stack_id, key.kernel_stack_id);
        let (user, kernel) = match self.kept.get(&reference) {
            Some(kept) => (kept.user.clone(), kept.kernel.clone()),
            None => match &self.previous {
                Some((generation, user, kernel)) if *generation == key.generation => {
                    (stack(user, key.user_stack_id), stack(kernel, key.kernel_stack_id))
                }
                _ => (None, None),
            },
        };
        if (key.user_stack_id >= 0 && user.is_none()) || (key.kernel_stack_id >= 0 && kernel.is_none()) {
            batch.wait_stacks_lost += 1;
        }
        key.user_stack_id = place(&mut batch.user_stacks, user, next_id);
        key.kernel_stack_id = place(&mut batch.kernel_stacks, kernel, next_id);
        key
    }
}

fn stack(stacks: &StdHashMap<u32, Arc<[u64]>>, id: i32) -> Option<Arc<[u64]>> {
    u32::try_from(id).ok().and_then(|id| stacks.get(&id)).cloned()
}

/// Puts a kept stack in the batch under a fresh id; -EFAULT without one.
fn place(stacks: &mut StdHashMap<u32, Arc<[u64]>>, stack: Option<Arc<[u64]>>, next_id: &mut u32) -> i32 {
    let Some(stack) = stack else {
        return -EFAULT;
    };
    let id = *next_id;
    *next_id += 1;
    stacks.insert(id, stack);
    id as i32
}

#[cfg(test)]
mod tests;
