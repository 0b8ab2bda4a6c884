//! A sampled thread's off-CPU time made exact from the kernel's own
//! accounting, where its waits were many enough.
//!
//! A recorded wait weighs one over the odds it was recorded with (one in
//! `--off-cpu-sample-every`, halved under `--off-cpu-budget`): right on
//! average, over threads and over time. One thread's figure in one drain is
//! noisy, and on a storm of microsecond waits a recorded wait also carries
//! what recording it cost the thread that ran meanwhile (cooled caches),
//! times its weight: 5-8% too much on the pinned ping-pong at weights 2^7 to
//! 2^9.
//!
//! So at every drain, for each thread with off-CPU samples in the batch
//! whose wait (the waits map's entry) weighs more than 1, this reads its
//! `task/TID/schedstat` (held open: one pread) with the clock. Between
//! readings at consecutive drains, the thread was off CPU for the time
//! between them less its CPU time, and ran `runs` times (the third field:
//! each run ended a wait). When it waited at least MIN_EXPECTED_RECORDED
//! times its weight (so that at least one of its waits was recorded, but
//! for odds under 1%), its off-CPU samples in the batch are scaled to add up
//! to that time: where it waited (the split between its stacks, blocked and
//! runnable) stays what the sampled waits say, how long in all is the
//! kernel's. With fewer waits, its weighted figure stays: scaling a thread
//! only when one of its few waits happened to be recorded would drop the
//! weight that stands for the threads whose waits were not (a thousand
//! workers each blocked once, one recorded, would show one wait, not a
//! thousand).
//!
//! A thread read for the first time, or not at the previous drain, keeps
//! its weighted figure this time; so does one that exited. What other users
//! control here is their thread ids and counts (bounded: MAX_THREADS read a
//! drain, those already followed first; the rest counted); the files are the
//! kernel's.

use std::{
    collections::{HashMap, hash_map::Entry},
    fs::File,
};

use profiler_common::{Wait, sample_kind};

use super::super::{
    clock::monotonic_now_ns,
    raw::{OffCpuExact, RawSample},
    thread_cpu::read::pread_numbers,
};
use crate::procfs::ProcRoot;

/// Threads read at one drain, at most: each costs a pread (~2 us) and holds
/// a descriptor.
const MAX_THREADS: usize = 256;
/// A thread is scaled when its waits in the drain number at least this many
/// times its weight: none of them recorded then has odds below e^-5, 0.7%.
const MIN_EXPECTED_RECORDED: u64 = 5;

/// A thread's schedstat as read at a drain, and when (CLOCK_MONOTONIC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Reading {
    /// The drained generation (consecutive drains: consecutive numbers,
    /// even if one failed after its flip).
    pub generation: u32,
    pub at_ns: u64,
    pub runtime_ns: u64,
    /// Times it was switched in so far.
    pub runs: u64,
}

struct Followed {
    file: File,
    last: Reading,
}

/// A thread whose wait weighs more than 1: its process, and whether it has
/// off-CPU samples in the batch.
#[derive(Clone, Copy, Debug, Default)]
struct Candidate {
    tgid: u32,
    weight: u64,
    sampled: bool,
}

pub(in crate::collect) struct ExactOffCpu {
    proc: ProcRoot,
    threads: HashMap<u32, Followed>,
    bytes: Vec<u8>,
    /// Reused at every drain.
    candidates: HashMap<u32, Candidate>,
    picked: Vec<u32>,
    exact: HashMap<u32, u64>,
}

impl ExactOffCpu {
    pub(in crate::collect) fn new(proc: ProcRoot) -> Self {
        Self {
            proc,
            threads: HashMap::new(),
            bytes: Vec::new(),
            candidates: HashMap::new(),
            picked: Vec::new(),
            exact: HashMap::new(),
        }
    }

    /// Scales the off-CPU samples in `samples` (the batch of `generation`)
    /// of each thread whose waits were many enough, as above; `waits` is the
    /// waits map as read at this drain.
    pub(in crate::collect) fn drained(
        &mut self,
        samples: &mut [RawSample],
        waits: &[(u32, Wait)],
        generation: u32,
    ) -> OffCpuExact {
        self.drained_by(samples, waits, generation, monotonic_now_ns)
    }

    /// [`Self::drained`] with the clock given (CLOCK_MONOTONIC ns).
    fn drained_by(
        &mut self,
        samples: &mut [RawSample],
        waits: &[(u32, Wait)],
        generation: u32,
        mut clock: impl FnMut() -> u64,
    ) -> OffCpuExact {
        let mut outcome = OffCpuExact::default();
        // From the waits map first: on a machine where every switch is
        // recorded no wait weighs more than 1, and the batch is not walked.
        self.candidates.clear();
        for &(tid, wait) in waits.iter().filter(|(_, wait)| wait.weight > 1) {
            self.candidates.insert(
                tid,
                Candidate {
                    tgid: wait.tgid,
                    weight: wait.weight,
                    sampled: false,
                },
            );
        }
        if !self.candidates.is_empty() {
            for sample in samples.iter().filter(|sample| is_off_cpu(sample)) {
                if let Some(candidate) = self.candidates.get_mut(&sample.key.tid) {
                    candidate.sampled = true;
                }
            }
        }
        self.candidates.retain(|_, candidate| candidate.sampled);
        // Those followed first: their readings are the ones that can give a
        // figure now.
        self.picked.clear();
        self.picked.extend(
            self.candidates
                .keys()
                .filter(|tid| self.threads.contains_key(tid)),
        );
        self.picked.extend(
            self.candidates
                .keys()
                .filter(|tid| !self.threads.contains_key(tid)),
        );
        outcome.capped = self.picked.len().saturating_sub(MAX_THREADS) as u64;
        self.picked.truncate(MAX_THREADS);
        self.exact.clear();
        for &tid in &self.picked {
            let candidate = self.candidates[&tid];
            if let Entry::Vacant(entry) = self.threads.entry(tid) {
                let path = self
                    .proc
                    .process(candidate.tgid)
                    .join("task")
                    .join(tid.to_string())
                    .join("schedstat");
                let Ok(file) = File::open(path) else {
                    outcome.unread += 1;
                    continue;
                };
                let last = Reading {
                    // Never consecutive with this drain's.
                    generation: generation.wrapping_sub(2),
                    at_ns: 0,
                    runtime_ns: 0,
                    runs: 0,
                };
                entry.insert(Followed { file, last });
            }
            let followed = self.threads.get_mut(&tid).expect("followed, or opened above");
            let at_ns = clock();
            let Some([runtime_ns, _run_delay, runs]) = pread_numbers::<3>(&followed.file, &mut self.bytes)
            else {
                // Exited: the descriptor names the thread, not its tid.
                self.threads.remove(&tid);
                outcome.unread += 1;
                continue;
            };
            let reading = Reading {
                generation,
                at_ns,
                runtime_ns,
                runs,
            };
            if let Some(off) = off_cpu_between(followed.last, reading, candidate.weight) {
                self.exact.insert(tid, off);
            }
            followed.last = reading;
        }
        // Threads not read now: their descriptors close.
        self.threads
            .retain(|_, followed| followed.last.generation == generation);
        scale(samples, &self.exact);
        outcome.threads = self.exact.len() as u64;
        outcome
    }
}

fn is_off_cpu(sample: &RawSample) -> bool {
    matches!(
        sample.key.kind,
        sample_kind::OFF_CPU_BLOCKED | sample_kind::OFF_CPU_RUNNABLE
    )
}

/// A thread's time off CPU between readings of consecutive drains, if its
/// waits between them (one per run, and the one it may still be in) were at
/// least MIN_EXPECTED_RECORDED times `weight`; None otherwise.
pub(super) fn off_cpu_between(before: Reading, after: Reading, weight: u64) -> Option<u64> {
    if after.generation != before.generation.wrapping_add(1) {
        return None;
    }
    let waits = after.runs.saturating_sub(before.runs) + 1;
    if waits < MIN_EXPECTED_RECORDED.saturating_mul(weight) {
        return None;
    }
    let elapsed = after.at_ns.saturating_sub(before.at_ns);
    let on = after.runtime_ns.saturating_sub(before.runtime_ns);
    Some(elapsed.saturating_sub(on))
}

/// Scales each thread's off-CPU samples (amounts) to add up to its exact
/// time, keeping their proportions; counts (waits) are left as they are.
/// A thread whose samples add up to nothing is left alone: there is no
/// stack to give the time to.
pub(super) fn scale(samples: &mut [RawSample], exact: &HashMap<u32, u64>) {
    if exact.is_empty() {
        return;
    }
    let mut weighted: HashMap<u32, u64> = HashMap::with_capacity(exact.len());
    for sample in samples.iter().filter(|sample| is_off_cpu(sample)) {
        if exact.contains_key(&sample.key.tid) {
            *weighted.entry(sample.key.tid).or_default() += sample.amount;
        }
    }
    for sample in samples.iter_mut().filter(|sample| is_off_cpu(sample)) {
        let (Some(&exact), Some(&sum)) = (exact.get(&sample.key.tid), weighted.get(&sample.key.tid)) else {
            continue;
        };
        if sum == 0 {
            continue;
        }
        // Below `exact`, a u64: the product fits u128.
        sample.amount = (u128::from(sample.amount) * u128::from(exact) / u128::from(sum)) as u64;
    }
}

#[cfg(test)]
mod tests;
