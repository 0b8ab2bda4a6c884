//! Each sampled thread's off-CPU time made exact from the kernel's own
//! accounting.
//!
//! A recorded wait weighs one over the odds it was recorded with (one in
//! `--off-cpu-sample-every`, halved under `--off-cpu-budget`). Summed, the
//! weights are right on average, not for one thread: a thread blocked in a
//! single wait shows 0 or the weight times its length, and on a storm of
//! microsecond waits a recorded wait also carries what recording it cost the
//! thread that ran meanwhile (cooled caches), times its weight.
//!
//! So at every drain, for each thread whose current wait weighs more than 1
//! (and once more after it no longer does), this reads the kernel's count of its CPU time (`task/TID/schedstat`, held
//! open) with the clock. Between two consecutive drains its time off CPU is
//! the time between the reads less the CPU time between them, and its
//! off-CPU samples in the batch are scaled to add up to that. Where it
//! waited (the split between its stacks, blocked and runnable) stays what
//! the sampled waits say; how long it waited in all is the kernel's.
//!
//! A thread read for the first time, or not at the previous drain, keeps
//! its weighted figure this time; so does one that exited (its /proc entry
//! is gone). What other users control here is their thread ids (bounded:
//! MAX_THREADS read a drain); the files are the kernel's.

use std::{
    collections::{HashMap, hash_map::Entry},
    fs::File,
};

use profiler_common::{Wait, sample_kind};

use super::super::{
    clock::monotonic_now_ns,
    raw::{OffCpuExact, RawSample},
    thread_cpu::read::pread_first_number,
};
use crate::procfs::ProcRoot;

/// Threads read at one drain, at most: each costs a pread (~2 us) and holds
/// a descriptor.
const MAX_THREADS: usize = 1024;

/// A thread's CPU time (ns) as read at a drain, and when (CLOCK_MONOTONIC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Reading {
    pub drain: u64,
    pub at_ns: u64,
    pub runtime_ns: u64,
}

struct Followed {
    file: File,
    last: Option<Reading>,
}

pub(in crate::collect) struct ExactOffCpu {
    proc: ProcRoot,
    drains: u64,
    threads: HashMap<u32, Followed>,
    bytes: Vec<u8>,
    /// tid -> its exact off-CPU ns since the previous drain (reused).
    exact: HashMap<u32, u64>,
    /// The (tid, tgid) read at a drain (reused).
    picked: Vec<(u32, u32)>,
}

impl ExactOffCpu {
    pub(in crate::collect) fn new(proc: ProcRoot) -> Self {
        Self {
            proc,
            drains: 0,
            threads: HashMap::new(),
            bytes: Vec::new(),
            exact: HashMap::new(),
            picked: Vec::new(),
        }
    }

    /// Scales the off-CPU samples in `samples` of each thread whose current
    /// wait (`waits`, the waits map as read at this drain) weighs more than
    /// 1: the threads scaled, and those whose reading failed (gone ones
    /// included).
    pub(in crate::collect) fn drained(
        &mut self,
        samples: &mut [RawSample],
        waits: &[(u32, Wait)],
    ) -> OffCpuExact {
        self.drains += 1;
        self.exact.clear();
        let mut failed = 0;
        // A thread read at the previous drain is read once more even if its
        // current wait weighs 1: the batch may still hold the end of its
        // last weighted one.
        let threads = &self.threads;
        self.picked.clear();
        self.picked.extend(
            waits
                .iter()
                .filter(|(tid, wait)| wait.weight > 1 || threads.contains_key(tid))
                .take(MAX_THREADS)
                .map(|&(tid, wait)| (tid, wait.tgid)),
        );
        for &(tid, tgid) in &self.picked {
            let followed = match self.threads.entry(tid) {
                Entry::Occupied(entry) => entry.into_mut(),
                Entry::Vacant(entry) => {
                    let path = self
                        .proc
                        .process(tgid)
                        .join("task")
                        .join(tid.to_string())
                        .join("schedstat");
                    match File::open(path) {
                        Ok(file) => entry.insert(Followed { file, last: None }),
                        Err(_) => {
                            failed += 1;
                            continue;
                        }
                    }
                }
            };
            let at_ns = monotonic_now_ns();
            let Some(runtime_ns) = pread_first_number(&followed.file, &mut self.bytes) else {
                // Exited: the descriptor names the thread, not its tid.
                self.threads.remove(&tid);
                failed += 1;
                continue;
            };
            let reading = Reading {
                drain: self.drains,
                at_ns,
                runtime_ns,
            };
            if let Some(off) = followed.last.and_then(|last| off_cpu_between(last, reading)) {
                self.exact.insert(tid, off);
            }
            followed.last = Some(reading);
        }
        // Threads not read now: their descriptors close.
        let drains = self.drains;
        self.threads
            .retain(|_, followed| followed.last.is_some_and(|last| last.drain == drains));
        scale(samples, &self.exact);
        OffCpuExact {
            threads: self.exact.len() as u64,
            unread: failed,
        }
    }
}

/// A thread's time off CPU between two readings of consecutive drains; None
/// when they are not (its wait weighed 1 at a drain between, or it was
/// not read).
pub(super) fn off_cpu_between(before: Reading, after: Reading) -> Option<u64> {
    if after.drain != before.drain + 1 {
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
    let is_off_cpu = |sample: &RawSample| sample.key.kind != sample_kind::CPU;
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
mod tests {
    use super::*;

    fn sample(tid: u32, kind: u16, amount: u64) -> RawSample {
        RawSample {
            key: Wait {
                kind,
                ..Wait::default()
            }
            .key(tid),
            count: 1,
            amount,
        }
    }

    #[test]
    fn a_thread_s_off_cpu_samples_add_up_to_its_exact_time_in_their_proportions() {
        let blocked = sample_kind::OFF_CPU_BLOCKED;
        let runnable = sample_kind::OFF_CPU_RUNNABLE;
        let mut samples = vec![
            // tid 1: weighted 128 times one wait of 1 s, really 1 s.
            sample(1, blocked, 128_000_000_000),
            // tid 2: 3:1 between two stacks, 8% too much in all.
            sample(2, blocked, 810_000_000),
            sample(2, runnable, 270_000_000),
            sample(2, sample_kind::CPU, 500_000_000),
            // tid 3: no exact figure.
            sample(3, blocked, 42),
            // tid 4: an exact figure but no time in its samples.
            sample(4, blocked, 0),
        ];
        let exact = HashMap::from([(1, 1_000_000_000), (2, 1_000_000_000), (4, 5), (9, 7)]);
        scale(&mut samples, &exact);
        let amounts: Vec<u64> = samples.iter().map(|sample| sample.amount).collect();
        assert_eq!(
            amounts,
            [1_000_000_000, 750_000_000, 250_000_000, 500_000_000, 42, 0],
            "each thread's off-CPU samples scaled to its exact time, 3:1 kept; CPU samples, threads \
             without a figure and samples of nothing untouched"
        );
        assert!(samples.iter().all(|sample| sample.count == 1), "counts untouched");
    }

    #[test]
    fn off_cpu_time_between_readings_is_the_time_between_them_less_the_cpu_time() {
        let reading = |drain, at_ns, runtime_ns| Reading {
            drain,
            at_ns,
            runtime_ns,
        };
        assert_eq!(
            off_cpu_between(reading(4, 1_000, 300), reading(5, 101_000, 40_300)),
            Some(60_000)
        );
        assert_eq!(
            off_cpu_between(reading(3, 1_000, 300), reading(5, 101_000, 40_300)),
            None,
            "not consecutive drains"
        );
        assert_eq!(
            off_cpu_between(reading(4, 1_000, 300), reading(5, 2_000, 9_000)),
            Some(0),
            "more CPU than time (the two reads are not one instant): none off CPU"
        );
    }
}
