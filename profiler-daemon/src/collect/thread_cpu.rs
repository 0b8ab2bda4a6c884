//! CPU time a thread used where no sample landed, credited at every drain.
//!
//! The sampler credits a thread's CPU (its `se.sum_exec_runtime` since its
//! previous sample) only when a sample lands on it. A thread whose rhythm
//! beats with the sampling period (5 ms of every 10 ms at 99 Hz) can go
//! unsampled for a second, and its CPU then lands in a later window. So at
//! every drain the ledger reads the same counter, through /proc
//! (`task/TID/schedstat`, see [`read`]), for every thread of the processes it
//! follows, and makes what the drained batch carries for each thread equal
//! to what the kernel accounted to it since the previous drain:
//!
//! - more: the difference is added to the thread's stacks in this batch, or
//!   to the stacks of its latest batch with samples, in proportion to their
//!   samples; a thread never sampled gets the frame [`super::raw::UNSAMPLED_CPU`];
//! - less: its samples carry CPU an earlier drain already credited (the
//!   sampler credits since the thread's previous *sample*); it is taken off
//!   them.
//!
//! A thread that exits between two drains leaves its last time in the
//! sampler's THREAD_EXITS map (its /proc entry is gone by the drain).
//!
//! Followed: every process with a CPU sample, from the drain of its first
//! sample on; after a minute without CPU it rests (is not read) until its
//! next sample, keeping what it was credited, so nothing is credited twice.
//! A thread's CPU before its process was followed is what its samples said
//! (a thread that started since the previous drain is exact from its start);
//! a process never sampled at all (every thread's rhythm locked to the
//! sampling) is not seen.

mod process;
pub(super) mod read;
mod readings;
mod settle;

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use profiler_common::{
    COMM_LEN, SPILLED_STACK_ID_BASE, SampleKey, ThreadExit, maps::CPU_FOLLOWED_ENTRIES, sample_kind,
};

use super::raw::{CpuCredits, RawBatch};
use process::{ThreadsNow, credit_process};
pub use readings::{Changes, NewThread, ProcessReading, Readings, ThreadReading};

/// Stack ids the ledger gives kept stacks in a batch: above the spilled
/// ones (from SPILLED_STACK_ID_BASE, ~250 a drain) and below the off-CPU
/// tracker's (SPILLED_STACK_ID_BASE | 1 << 29).
const KEPT_STACK_ID_BASE: u32 = SPILLED_STACK_ID_BASE | (1 << 28);
/// Stacks kept per thread for the CPU of its drains without samples.
const KEPT_STACKS: usize = 4;
/// Threads followed at once, over every process, resting ones included:
/// each costs a /proc read a drain while its process is busy. As many
/// processes at most: the sampler's map of them holds that.
pub(super) const MAX_FOLLOWED_THREADS: usize = CPU_FOLLOWED_ENTRIES as usize;
/// A process rests (is no longer read) after this long without CPU.
const REST_AFTER_NS: u64 = 60_000_000_000;

#[derive(Debug, Default)]
pub struct CpuLedger {
    processes: HashMap<u32, Followed>,
    /// CLOCK_MONOTONIC of the previous drain's credit (at first, of the
    /// sampler's attach): an exited thread that started after it is new.
    previous_ns: u64,
    /// A batch's CPU samples by (tgid, tid) (reused).
    by_tid: HashMap<(u32, u32), Sampled>,
    /// Processes followed, and no longer, since the sampler was last told.
    started: Vec<u32>,
    stopped: Vec<u32>,
    /// (tid, credited ns) of the threads of processes evicted since.
    evicted: Vec<(u32, u64)>,
}

#[derive(Debug)]
struct Followed {
    instance: u32,
    cgroup_id: u64,
    /// Read at the previous drain: a thread it did not list started since.
    listed: bool,
    /// Not read until its next sample: no CPU for a while.
    resting: bool,
    /// Gone at the previous drain: its exited threads' samples still in the
    /// sampler's other buffer are taken back now, then it goes.
    gone: bool,
    /// CLOCK_MONOTONIC of the last drain at which a thread's time moved.
    busy_at_ns: u64,
    /// Its threads when it was first followed.
    admitted: usize,
    threads: HashMap<u32, Thread>,
}

#[derive(Debug)]
struct Thread {
    /// Its kernel CPU time as far as batches carry it.
    credited_ns: u64,
    comm: [u8; COMM_LEN],
    /// The heaviest stacks of its latest batch with samples.
    stacks: Vec<Kept>,
    /// Exited: its final time is credited; samples still in the sampler's
    /// other buffer are taken back at the next drain, then it goes.
    exited: bool,
}

#[derive(Clone, Debug)]
struct Kept {
    key: SampleKey,
    user: Option<Arc<[u64]>>,
    kernel: Option<Arc<[u64]>>,
    weight: u64,
}

/// A thread's CPU samples in the batch being credited.
#[derive(Debug, Default)]
struct Sampled {
    amount: u64,
    indices: Vec<usize>,
}

/// What crediting one thread touches.
struct Credit<'a> {
    batch: &'a mut RawBatch,
    generation: u32,
    next_id: &'a mut u32,
    credits: &'a mut CpuCredits,
}

impl CpuLedger {
    /// `attached_ns`: CLOCK_MONOTONIC when the sampler was attached.
    pub fn new(attached_ns: u64) -> Self {
        Self {
            previous_ns: attached_ns,
            ..Self::default()
        }
    }

    /// The processes to read at this drain: the busy ones followed, with the
    /// processes of this batch's CPU samples followed (or woken) from now on,
    /// within [`MAX_FOLLOWED_THREADS`] (`threads_of` counts a new process's
    /// threads; 0: unreadable, not followed).
    pub fn follow_sampled(
        &mut self,
        batch: &RawBatch,
        mut threads_of: impl FnMut(u32) -> usize,
        credits: &mut CpuCredits,
    ) -> Vec<u32> {
        let mut met = HashSet::new();
        let mut followed_threads: usize = self.processes.values().map(Followed::weight).sum();
        // Every sampled process followed wakes first: none of them may give
        // way to a new one below.
        let mut new: Vec<&SampleKey> = Vec::new();
        for sample in batch
            .samples
            .iter()
            .filter(|sample| sample.key.kind == sample_kind::CPU)
        {
            let key = &sample.key;
            let Some(followed) = self.processes.get_mut(&key.tgid) else {
                if met.insert(key.tgid) {
                    new.push(key);
                }
                continue;
            };
            followed.resting = false;
            if followed.instance != key.instance && key.instance != 0 {
                // It executed another program: the stacks kept are of code
                // no longer there.
                followed.instance = key.instance;
                followed
                    .threads
                    .values_mut()
                    .for_each(|thread| thread.stacks.clear());
            }
            followed.cgroup_id = key.cgroup_id;
        }
        for key in new {
            let threads = threads_of(key.tgid);
            if threads == 0 {
                continue;
            }
            if followed_threads + threads > MAX_FOLLOWED_THREADS {
                let resting: usize = self
                    .processes
                    .values()
                    .filter(|process| process.resting)
                    .map(Followed::weight)
                    .sum();
                // Evicting helps only if it makes room enough.
                if followed_threads - resting + threads > MAX_FOLLOWED_THREADS {
                    credits.processes_unfollowed += 1;
                    continue;
                }
                followed_threads -= self.evict_resting(followed_threads + threads - MAX_FOLLOWED_THREADS);
            }
            followed_threads += threads;
            self.started.push(key.tgid);
            self.processes.insert(
                key.tgid,
                Followed {
                    instance: key.instance,
                    cgroup_id: key.cgroup_id,
                    listed: false,
                    resting: false,
                    gone: false,
                    busy_at_ns: 0,
                    admitted: threads,
                    threads: HashMap::new(),
                },
            );
        }
        self.processes
            .iter()
            .filter(|(_, process)| !process.resting)
            .map(|(&tgid, _)| tgid)
            .collect()
    }

    /// Whether the ledger follows this thread already (else its name is read).
    pub fn knows(&self, tgid: u32, tid: u32) -> bool {
        self.processes
            .get(&tgid)
            .is_some_and(|process| process.threads.contains_key(&tid))
    }

    /// Whether the ledger follows every one of these threads of `tgid`.
    pub fn knows_all(&self, tgid: u32, mut tids: impl Iterator<Item = u32>) -> bool {
        self.processes
            .get(&tgid)
            .is_some_and(|process| tids.all(|tid| process.threads.contains_key(&tid)))
    }

    /// Credits every followed thread of `batch` (the buffer of `generation`)
    /// with what the kernel accounted since the previous drain, as `readings`
    /// say, at `now_ns` (CLOCK_MONOTONIC).
    pub fn credit(
        &mut self,
        batch: &mut RawBatch,
        generation: u32,
        readings: Readings,
        now_ns: u64,
        credits: &mut CpuCredits,
    ) {
        self.index(batch);
        let mut exits: HashMap<u32, Vec<(u32, ThreadExit)>> = HashMap::new();
        for (tid, exit) in readings.exits {
            exits.entry(exit.tgid).or_default().push((tid, exit));
        }
        let mut next_id = KEPT_STACK_ID_BASE;
        let mut ctx = Credit {
            batch,
            generation,
            next_id: &mut next_id,
            credits,
        };
        for tgid in readings.too_many {
            if self.processes.remove(&tgid).is_some() {
                self.stopped.push(tgid);
                ctx.credits.processes_unfollowed += 1;
            }
        }
        let mut read: HashMap<u32, Option<ProcessReading>> = readings.processes.into_iter().collect();
        let tgids: Vec<u32> = self.processes.keys().copied().collect();
        for tgid in tgids {
            let reading = read.remove(&tgid);
            let exited = exits.remove(&tgid).unwrap_or_default();
            let Some(mut process) = self.processes.remove(&tgid) else {
                continue;
            };
            // Resting and not read: only its exits (and nothing else moved).
            let gone = matches!(reading, Some(None));
            let rest = ThreadsNow {
                read: reading.is_some(),
                reading: reading.flatten().unwrap_or_default(),
                exits: exited,
                previous_ns: self.previous_ns,
            };
            if process.busy_at_ns == 0 {
                process.busy_at_ns = now_ns;
            }
            credit_process(&mut process, tgid, &rest, &self.by_tid, &mut ctx, now_ns);
            process.listed = rest.read && !gone;
            if rest.read && now_ns.saturating_sub(process.busy_at_ns) > REST_AFTER_NS {
                process.resting = true;
            }
            let forget = (gone && process.gone) || (process.resting && process.threads.is_empty());
            process.gone |= gone;
            if forget {
                self.stopped.push(tgid);
            } else {
                self.processes.insert(tgid, process);
            }
        }
        self.previous_ns = now_ns;
    }

    /// The processes followed, and no longer, since the last call (the
    /// sampler records the exits of the threads of those followed), and the
    /// CPU time evicted threads were credited up to.
    pub fn take_changes(&mut self) -> Changes {
        Changes {
            started: std::mem::take(&mut self.started),
            stopped: std::mem::take(&mut self.stopped),
            credited: std::mem::take(&mut self.evicted),
        }
    }

    /// Frees at least `threads` by forgetting resting processes, the
    /// longest resting first; how many it freed. What their threads were
    /// credited goes to the sampler as their baselines, so should one run
    /// again its next sample carries only what is new.
    fn evict_resting(&mut self, threads: usize) -> usize {
        let mut resting: Vec<(u64, u32)> = self
            .processes
            .iter()
            .filter(|(_, process)| process.resting)
            .map(|(&tgid, process)| (process.busy_at_ns, tgid))
            .collect();
        resting.sort_unstable();
        let mut freed = 0;
        for (_, tgid) in resting {
            if freed >= threads {
                break;
            }
            if let Some(process) = self.processes.remove(&tgid) {
                freed += process.weight();
                self.stopped.push(tgid);
                self.evicted.extend(
                    process
                        .threads
                        .iter()
                        .filter(|(_, thread)| !thread.exited)
                        .map(|(&tid, thread)| (tid, thread.credited_ns)),
                );
            }
        }
        freed
    }

    /// Groups the batch's CPU samples by thread.
    fn index(&mut self, batch: &RawBatch) {
        self.by_tid.values_mut().for_each(|sampled| {
            sampled.amount = 0;
            sampled.indices.clear();
        });
        for (index, sample) in batch.samples.iter().enumerate() {
            if sample.key.kind != sample_kind::CPU {
                continue;
            }
            let sampled = self.by_tid.entry((sample.key.tgid, sample.key.tid)).or_default();
            sampled.amount += sample.amount;
            sampled.indices.push(index);
        }
        self.by_tid.retain(|_, sampled| !sampled.indices.is_empty());
    }
}

impl Followed {
    /// What it counts against [`MAX_FOLLOWED_THREADS`]: its threads, or
    /// before it was first read, those it had when followed.
    fn weight(&self) -> usize {
        if self.listed {
            self.threads.len().max(1)
        } else {
            self.admitted.max(self.threads.len()).max(1)
        }
    }
}

#[cfg(test)]
mod tests;
