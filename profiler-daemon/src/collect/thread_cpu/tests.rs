use std::sync::Arc;

use super::*;
use crate::collect::raw::{RawSample, UNSAMPLED_CPU_STACK_ID};

const MS: u64 = 1_000_000;
const TGID: u32 = 10;
const SECOND: u64 = 1_000_000_000;

fn key(tid: u32, user: i32) -> SampleKey {
    SampleKey {
        tgid: TGID,
        tid,
        instance: 7,
        user_stack_id: user,
        kernel_stack_id: -14,
        comm: [b't'; COMM_LEN],
        kind: sample_kind::CPU,
        reserved: 0,
        generation: 0,
        reserved2: 0,
        cgroup_id: 1,
    }
}

/// A batch whose user stack `id` is the one frame `id * 0x100`, with CPU
/// samples (tid, user stack id, count, amount).
fn batch(samples: &[(u32, i32, u64, u64)]) -> RawBatch {
    let mut batch = RawBatch::default();
    for &(tid, user, count, amount) in samples {
        batch
            .user_stacks
            .insert(user as u32, Arc::from([user as u64 * 0x100]));
        batch.samples.push(RawSample {
            key: key(tid, user),
            count,
            amount,
        });
    }
    batch
}

fn reading(threads: &[(u32, u64)]) -> Readings {
    Readings {
        processes: vec![(
            TGID,
            Some(ProcessReading {
                threads: threads
                    .iter()
                    .map(|&(tid, runtime_ns)| ThreadReading {
                        tid,
                        runtime_ns: Some(runtime_ns),
                        new: Some(NewThread {
                            comm: [b'n'; COMM_LEN],
                            started_since_previous: Some(true),
                            sampled_ns: None,
                        }),
                    })
                    .collect(),
            }),
        )],
        exits: Vec::new(),
        too_many: Vec::new(),
    }
}

/// One drain: the ledger follows the batch's processes, then credits it.
fn drain(ledger: &mut CpuLedger, batch: &mut RawBatch, readings: Readings, at_ns: u64) -> CpuCredits {
    let mut credits = CpuCredits::default();
    let tgids = ledger.follow_sampled(batch, |_| 1, &mut credits);
    assert_eq!(tgids, vec![TGID]);
    ledger.credit(batch, 1, readings, at_ns, &mut credits);
    credits
}

fn cpu_of(batch: &RawBatch, tid: u32) -> u64 {
    batch
        .samples
        .iter()
        .filter(|sample| sample.key.tid == tid)
        .map(|sample| sample.amount)
        .sum()
}

/// The frame of each sample of `tid` with its amount (UNSAMPLED: 0).
fn placed(batch: &RawBatch, tid: u32) -> Vec<(u64, u64)> {
    batch
        .samples
        .iter()
        .filter(|sample| sample.key.tid == tid)
        .map(|sample| {
            let frame = u32::try_from(sample.key.user_stack_id)
                .ok()
                .and_then(|id| batch.user_stacks.get(&id))
                .map_or(0, |stack| stack[0]);
            (frame, sample.amount)
        })
        .collect()
}

#[test]
fn a_thread_gets_what_the_kernel_accounted_in_each_drain_whatever_its_samples_carried() {
    let mut ledger = CpuLedger::new(0);
    // First drain: its first sample carried all its time (30 ms); it ran 50 ms.
    let mut first = batch(&[(11, 1, 3, 30 * MS)]);
    drain(&mut ledger, &mut first, reading(&[(11, 50 * MS)]), SECOND);
    assert_eq!(cpu_of(&first, 11), 50 * MS);

    // Second drain: no sample landed, it ran 40 ms more: on its stack.
    let mut second = batch(&[(12, 2, 1, MS)]);
    let credits = drain(
        &mut ledger,
        &mut second,
        reading(&[(11, 90 * MS), (12, MS)]),
        2 * SECOND,
    );
    assert_eq!(placed(&second, 11), vec![(0x100, 40 * MS)]);
    assert_eq!(credits.added_ns, 40 * MS);

    // Third: its next sample carries 25 ms since its previous sample (at 30
    // ms): 20 ms of it the ledger credited already; it ran 5 ms more.
    let mut third = batch(&[(11, 3, 1, 65 * MS)]);
    let credits = drain(
        &mut ledger,
        &mut third,
        reading(&[(11, 95 * MS), (12, MS)]),
        3 * SECOND,
    );
    assert_eq!(cpu_of(&third, 11), 5 * MS);
    assert_eq!(credits.taken_back_ns, 60 * MS);
    assert_eq!(credits.excess_ns, 0);
}

#[test]
fn cpu_added_goes_to_the_stacks_of_the_batch_in_proportion_to_their_samples() {
    let mut ledger = CpuLedger::new(0);
    let mut first = batch(&[(11, 1, 3, 3 * MS), (11, 2, 1, MS)]);
    drain(&mut ledger, &mut first, reading(&[(11, 8 * MS)]), SECOND);
    let mut split = placed(&first, 11);
    split.sort();
    assert_eq!(split, vec![(0x100, 6 * MS), (0x200, 2 * MS)]);

    // Without samples the next time: the same proportions, on the kept stacks.
    let mut second = batch(&[]);
    drain(&mut ledger, &mut second, reading(&[(11, 16 * MS)]), 2 * SECOND);
    let mut split = placed(&second, 11);
    split.sort();
    assert_eq!(split, vec![(0x100, 6 * MS), (0x200, 2 * MS)]);
    assert!(second.samples.iter().all(|sample| sample.count == 0));
}

#[test]
fn a_thread_never_sampled_has_its_cpu_under_a_frame_that_says_so() {
    let mut ledger = CpuLedger::new(0);
    let mut first = batch(&[(11, 1, 1, MS)]);
    // Thread 12, of the same process, started under the sampler: its 7 ms.
    let credits = drain(
        &mut ledger,
        &mut first,
        reading(&[(11, MS), (12, 7 * MS)]),
        SECOND,
    );
    let unplaced: Vec<_> = first
        .samples
        .iter()
        .filter(|sample| sample.key.tid == 12)
        .collect();
    assert_eq!(unplaced.len(), 1);
    assert_eq!(unplaced[0].key.user_stack_id, UNSAMPLED_CPU_STACK_ID);
    assert_eq!(unplaced[0].key.comm, [b'n'; COMM_LEN]);
    assert_eq!((unplaced[0].count, unplaced[0].amount), (0, 7 * MS));
    assert_eq!(credits.unplaced_ns, 7 * MS);
}

#[test]
fn a_thread_older_than_the_sampler_is_credited_from_the_drain_that_first_reads_it() {
    let mut ledger = CpuLedger::new(0);
    let mut readings = reading(&[(11, 5 * SECOND)]);
    if let Some(reading) = &mut readings.processes[0].1 {
        reading.threads[0].new = Some(NewThread {
            comm: [0; COMM_LEN],
            started_since_previous: Some(false),
            sampled_ns: Some(5 * SECOND - 5 * MS),
        });
    }
    // Its first sample (5 ms before the read) carries one period (all that
    // is known): from there on, its CPU is this window's.
    let mut first = batch(&[(11, 1, 1, 10 * MS)]);
    drain(&mut ledger, &mut first, readings, SECOND);
    assert_eq!(
        cpu_of(&first, 11),
        15 * MS,
        "its hours of CPU before are not this window's"
    );
    let mut second = batch(&[]);
    drain(
        &mut ledger,
        &mut second,
        reading(&[(11, 5 * SECOND + 30 * MS)]),
        2 * SECOND,
    );
    assert_eq!(cpu_of(&second, 11), 30 * MS);
}

#[test]
fn a_thread_that_exits_between_drains_has_its_last_cpu_in_the_window_it_exited_in() {
    let mut ledger = CpuLedger::new(0);
    let mut first = batch(&[(11, 1, 1, 10 * MS), (12, 2, 1, 10 * MS)]);
    drain(
        &mut ledger,
        &mut first,
        reading(&[(11, 10 * MS), (12, 10 * MS)]),
        SECOND,
    );

    // 12 ran 30 ms more unsampled and exited; one sample of it (carrying 5
    // ms) is still in the other buffer, drained next time.
    let mut second = batch(&[]);
    let mut readings = reading(&[(11, 10 * MS)]);
    readings.exits.push((
        12,
        ThreadExit {
            runtime_ns: 40 * MS,
            tgid: TGID,
            comm: [b't'; COMM_LEN],
            ..ThreadExit::default()
        },
    ));
    drain(&mut ledger, &mut second, readings, 2 * SECOND);
    assert_eq!(cpu_of(&second, 12), 30 * MS);

    let mut third = batch(&[(12, 2, 1, 5 * MS), (11, 1, 1, MS)]);
    drain(&mut ledger, &mut third, reading(&[(11, 11 * MS)]), 3 * SECOND);
    assert_eq!(cpu_of(&third, 12), 0, "credited when it exited");
    assert_eq!(cpu_of(&third, 11), MS);
    assert!(!ledger.knows(TGID, 12));
}

#[test]
fn a_process_gone_is_credited_its_exits_then_takes_back_what_the_other_buffer_held() {
    let mut ledger = CpuLedger::new(0);
    let mut first = batch(&[(11, 1, 1, 10 * MS)]);
    drain(&mut ledger, &mut first, reading(&[(11, 10 * MS)]), SECOND);
    let exit = ThreadExit {
        runtime_ns: 12 * MS,
        tgid: TGID,
        ..ThreadExit::default()
    };
    let gone = |exits| Readings {
        processes: vec![(TGID, None)],
        exits,
        too_many: Vec::new(),
    };
    let mut second = batch(&[]);
    drain(&mut ledger, &mut second, gone(vec![(11, exit)]), 2 * SECOND);
    assert_eq!(cpu_of(&second, 11), 2 * MS);
    // A sample taken before it exited, in the buffer drained next.
    let mut third = batch(&[(11, 1, 1, MS)]);
    drain(&mut ledger, &mut third, gone(Vec::new()), 3 * SECOND);
    assert_eq!(cpu_of(&third, 11), 0);
    let mut credits = CpuCredits::default();
    assert!(ledger.follow_sampled(&batch(&[]), |_| 1, &mut credits).is_empty());
    let changes = ledger.take_changes();
    assert_eq!((changes.started, changes.stopped), (vec![TGID], vec![TGID]));
}

#[test]
fn a_process_rests_after_a_minute_idle_and_wakes_without_crediting_anything_twice() {
    let mut ledger = CpuLedger::new(0);
    let mut first = batch(&[(11, 1, 1, 10 * MS)]);
    drain(&mut ledger, &mut first, reading(&[(11, 10 * MS)]), SECOND);
    let mut credits = CpuCredits::default();
    let mut idle = batch(&[]);
    assert_eq!(ledger.follow_sampled(&idle, |_| 1, &mut credits), vec![TGID]);
    ledger.credit(&mut idle, 1, reading(&[(11, 10 * MS)]), 62 * SECOND, &mut credits);
    assert!(
        ledger.follow_sampled(&idle, |_| 1, &mut credits).is_empty(),
        "resting: not read"
    );
    assert!(ledger.knows(TGID, 11), "what it was credited is kept");
    // Awake again: a sample carries 25 ms since its last sample; it ran 30.
    let mut awake = batch(&[(11, 1, 1, 25 * MS)]);
    drain(&mut ledger, &mut awake, reading(&[(11, 40 * MS)]), 70 * SECOND);
    assert_eq!(cpu_of(&awake, 11), 30 * MS);
}

#[test]
fn a_zombie_leader_still_listed_is_not_credited_again() {
    let mut ledger = CpuLedger::new(0);
    let mut first = batch(&[(TGID, 1, 1, 10 * MS)]);
    drain(&mut ledger, &mut first, reading(&[(TGID, 10 * MS)]), SECOND);
    let mut second = batch(&[]);
    let mut readings = reading(&[(TGID, 10 * MS)]);
    readings.exits.push((
        TGID,
        ThreadExit {
            runtime_ns: 11 * MS,
            tgid: TGID,
            ..ThreadExit::default()
        },
    ));
    drain(&mut ledger, &mut second, readings, 2 * SECOND);
    assert_eq!(cpu_of(&second, TGID), MS);
    let mut third = batch(&[]);
    drain(&mut ledger, &mut third, reading(&[(TGID, 11 * MS)]), 3 * SECOND);
    assert_eq!(cpu_of(&third, TGID), 0);
}

#[test]
fn a_thread_whose_time_cannot_be_read_is_left_as_it_was() {
    let mut ledger = CpuLedger::new(0);
    let mut first = batch(&[(11, 1, 1, 10 * MS)]);
    drain(&mut ledger, &mut first, reading(&[(11, 10 * MS)]), SECOND);
    let mut second = batch(&[(11, 1, 1, 5 * MS)]);
    let mut readings = reading(&[(11, 0)]);
    if let Some(reading) = &mut readings.processes[0].1 {
        reading.threads[0].runtime_ns = None;
    }
    drain(&mut ledger, &mut second, readings, 2 * SECOND);
    assert_eq!(cpu_of(&second, 11), 5 * MS);
    let mut third = batch(&[]);
    drain(&mut ledger, &mut third, reading(&[(11, 20 * MS)]), 3 * SECOND);
    assert_eq!(
        cpu_of(&third, 11),
        5 * MS,
        "15 ms since the last read, 10 of them in the samples"
    );
}

#[test]
fn processes_beyond_the_bound_on_threads_are_not_followed_and_counted() {
    let mut ledger = CpuLedger::new(0);
    let mut credits = CpuCredits::default();
    let big = batch(&[(11, 1, 1, MS)]);
    assert!(
        ledger
            .follow_sampled(&big, |_| MAX_FOLLOWED_THREADS + 1, &mut credits)
            .is_empty()
    );
    assert_eq!(credits.processes_unfollowed, 1);
}

#[test]
fn a_resting_process_gives_way_to_a_new_one_and_leaves_its_credit_as_the_baseline() {
    let mut ledger = CpuLedger::new(0);
    let mut first = batch(&[(11, 1, 1, 10 * MS)]);
    drain(&mut ledger, &mut first, reading(&[(11, 30 * MS)]), SECOND);
    let mut credits = CpuCredits::default();
    let mut idle = batch(&[]);
    ledger.follow_sampled(&idle, |_| 1, &mut credits);
    ledger.credit(&mut idle, 1, reading(&[(11, 30 * MS)]), 62 * SECOND, &mut credits);
    ledger.take_changes();
    // A process of as many threads as may be followed: the resting one goes.
    let mut big = batch(&[(21, 1, 1, MS)]);
    big.samples[0].key.tgid = 20;
    let tgids = ledger.follow_sampled(&big, |_| MAX_FOLLOWED_THREADS, &mut credits);
    assert_eq!(tgids, vec![20]);
    let changes = ledger.take_changes();
    assert_eq!(changes.started, vec![20]);
    assert_eq!(changes.stopped, vec![TGID]);
    assert_eq!(changes.credited, vec![(11, 30 * MS)]);
    // One more is refused, without evicting anything.
    let mut another = batch(&[(31, 1, 1, MS)]);
    another.samples[0].key.tgid = 30;
    assert_eq!(ledger.follow_sampled(&another, |_| 1, &mut credits), vec![20]);
    assert_eq!(credits.processes_unfollowed, 1);
}

#[test]
fn a_process_grown_past_what_may_be_read_is_no_longer_followed() {
    let mut ledger = CpuLedger::new(0);
    let mut first = batch(&[(11, 1, 1, 10 * MS)]);
    drain(&mut ledger, &mut first, reading(&[(11, 10 * MS)]), SECOND);
    ledger.take_changes();
    let mut second = batch(&[]);
    let mut credits = CpuCredits::default();
    ledger.follow_sampled(&second, |_| 1, &mut credits);
    let readings = Readings {
        too_many: vec![TGID],
        ..Readings::default()
    };
    ledger.credit(&mut second, 1, readings, 2 * SECOND, &mut credits);
    assert_eq!(credits.processes_unfollowed, 1);
    assert!(!ledger.knows(TGID, 11));
    assert_eq!(ledger.take_changes().stopped, vec![TGID]);
}

/// What lets a drain read a process's threads without listing them again
/// (read.rs, `read_unchanged`): every thread held is one the ledger follows.
#[test]
fn the_ledger_knows_all_of_a_set_only_when_it_follows_each_thread() {
    let mut ledger = CpuLedger::new(0);
    let mut first = batch(&[(11, 1, 1, 10 * MS), (12, 2, 1, 10 * MS)]);
    drain(
        &mut ledger,
        &mut first,
        reading(&[(11, 10 * MS), (12, 10 * MS)]),
        SECOND,
    );
    assert!(ledger.knows_all(TGID, [11, 12].into_iter()));
    assert!(ledger.knows_all(TGID, [12].into_iter()));
    assert!(
        !ledger.knows_all(TGID, [11, 13].into_iter()),
        "13 is not followed"
    );
    assert!(
        !ledger.knows_all(TGID + 1, [11].into_iter()),
        "nor is another process"
    );
}
