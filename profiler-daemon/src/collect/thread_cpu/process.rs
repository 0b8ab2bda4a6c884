//! Crediting one followed process's threads at a drain: which threads
//! there are (listed, exited), what a thread met for the first time is
//! taken to have been credited, and what each is owed.

use std::collections::{HashMap, HashSet, hash_map::Entry};

use profiler_common::{COMM_LEN, ThreadExit};

use super::{
    Credit, Followed, NewThread, ProcessReading, Sampled, Thread,
    settle::{Who, keep_stacks, settle},
};

/// What is known of a process's threads at a drain.
pub(super) struct ThreadsNow {
    /// Its /proc was read (it is not resting).
    pub read: bool,
    pub reading: ProcessReading,
    pub exits: Vec<(u32, ThreadExit)>,
    pub previous_ns: u64,
}

/// The time a thread met for the first time is taken to have been credited
/// up to: 0 if it started since the previous drain (all its CPU is new);
/// else its runtime at its last sample before this batch's (what its
/// samples carry from there on, and the rest up to now, is this drain's);
/// else, without samples, its runtime now (its CPU before is no window's).
fn opening_credit(
    started_since_previous: bool,
    sampled_ns: Option<u64>,
    runtime_ns: u64,
    batch_ns: u64,
) -> u64 {
    match sampled_ns {
        _ if started_since_previous => 0,
        Some(sampled_ns) if batch_ns > 0 => sampled_ns.saturating_sub(batch_ns),
        _ => runtime_ns.saturating_sub(batch_ns),
    }
}

pub(super) fn credit_process(
    process: &mut Followed,
    tgid: u32,
    now: &ThreadsNow,
    by_tid: &HashMap<(u32, u32), Sampled>,
    ctx: &mut Credit<'_>,
    now_ns: u64,
) {
    let none = Sampled::default();
    let mut seen: HashSet<u32> = HashSet::with_capacity(now.reading.threads.len() + now.exits.len());
    let exited_tids: HashSet<u32> = now.exits.iter().map(|&(tid, _)| tid).collect();
    let listed_before = process.listed;
    // Threads listed now, and threads that exited since the previous drain.
    let exited = now.exits.iter().map(|(tid, exit)| {
        let new = NewThread {
            comm: exit.comm,
            started_since_previous: Some(exit.start_ns != 0 && exit.start_ns >= now.previous_ns),
            sampled_ns: (exit.sampled_ns != 0).then_some(exit.sampled_ns),
        };
        (*tid, Some(exit.runtime_ns), Some(new), true)
    });
    let listed = now
        .reading
        .threads
        .iter()
        .filter(|thread| !exited_tids.contains(&thread.tid))
        .map(|thread| (thread.tid, thread.runtime_ns, thread.new, false));
    for (tid, runtime_ns, new, is_exit) in listed.chain(exited) {
        seen.insert(tid);
        let sampled = by_tid.get(&(tgid, tid)).unwrap_or(&none);
        let Some(runtime_ns) = runtime_ns else {
            // Listed, its time unreadable this once: its samples stand, and
            // are what it is taken to have run.
            if let Some(thread) = process.threads.get_mut(&tid) {
                thread.credited_ns += sampled.amount;
                keep_stacks(thread, sampled, ctx.batch);
            }
            continue;
        };
        let thread = match process.threads.entry(tid) {
            Entry::Occupied(entry) => {
                let thread = entry.into_mut();
                if thread.exited && !is_exit && runtime_ns < thread.credited_ns {
                    // Its tid went to a new thread (a zombie leader still
                    // listed keeps its time, and stays as it was).
                    thread.credited_ns = 0;
                    thread.stacks.clear();
                }
                thread
            }
            Entry::Vacant(entry) => {
                let new = new.unwrap_or(NewThread {
                    comm: [0; COMM_LEN],
                    started_since_previous: None,
                    sampled_ns: None,
                });
                // Not in the previous listing of its process: started since.
                let started = new.started_since_previous.unwrap_or(listed_before);
                entry.insert(Thread {
                    credited_ns: opening_credit(started, new.sampled_ns, runtime_ns, sampled.amount),
                    comm: new.comm,
                    stacks: Vec::new(),
                    exited: false,
                })
            }
        };
        if runtime_ns != thread.credited_ns {
            process.busy_at_ns = now_ns;
        }
        let owed = i128::from(runtime_ns) - i128::from(thread.credited_ns) - i128::from(sampled.amount);
        thread.credited_ns = thread.credited_ns.max(runtime_ns);
        thread.exited |= is_exit;
        let who = Who {
            tgid,
            tid,
            instance: process.instance,
            cgroup_id: process.cgroup_id,
        };
        settle(who, thread, owed, sampled, ctx);
        keep_stacks(thread, sampled, ctx.batch);
    }
    // Threads neither listed nor exited now.
    process.threads.retain(|&tid, thread| {
        if seen.contains(&tid) {
            return true;
        }
        let sampled = by_tid.get(&(tgid, tid)).unwrap_or(&none);
        if thread.exited {
            // Samples taken before its exit, in the buffer drained now: its
            // final time was credited already.
            let who = Who {
                tgid,
                tid,
                instance: process.instance,
                cgroup_id: process.cgroup_id,
            };
            settle(who, thread, -i128::from(sampled.amount), sampled, ctx);
            return false;
        }
        if !now.read {
            // Resting: not listed, still there.
            return true;
        }
        // Gone without a record (the exits map was full): its samples stand.
        ctx.credits.exits_unrecorded += 1;
        false
    });
}
