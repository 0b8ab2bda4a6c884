use std::sync::Arc;

use profiler_common::{COMM_LEN, sample_kind};

use super::*;

const MS: u64 = 1_000_000;

fn wait(since_ns: u64, generation: u32, user: i32, kernel: i32) -> Wait {
    Wait {
        since_ns,
        tgid: 10,
        instance: 7,
        user_stack_id: user,
        kernel_stack_id: kernel,
        generation,
        kind: sample_kind::OFF_CPU_BLOCKED,
        recorded_ns: 0,
        comm: [b'w'; COMM_LEN],
        cgroup_id: 1,
        weight: 1,
    }
}

/// The completion the sampler adds when the wait ends: the whole wait,
/// weighted, under the stacks (and generation) it began with.
fn ended(wait: &Wait, tid: u32, ended_ns: u64, weight: u64) -> RawSample {
    RawSample {
        key: wait.key(tid),
        count: weight,
        amount: (ended_ns - wait.since_ns) * weight,
    }
}

fn batch_with_stacks(user: &[(u32, &[u64])], kernel: &[(u32, &[u64])]) -> RawBatch {
    let mut batch = RawBatch::default();
    for (id, frames) in user {
        batch.user_stacks.insert(*id, Arc::from(*frames));
    }
    for (id, frames) in kernel {
        batch.kernel_stacks.insert(*id, Arc::from(*frames));
    }
    batch
}

fn frames(batch: &RawBatch, sample: &RawSample) -> (Option<Vec<u64>>, Option<Vec<u64>>) {
    let get = |stacks: &StdHashMap<u32, Arc<[u64]>>, id: i32| {
        u32::try_from(id)
            .ok()
            .and_then(|id| stacks.get(&id))
            .map(|s| s.to_vec())
    };
    (
        get(&batch.user_stacks, sample.key.user_stack_id),
        get(&batch.kernel_stacks, sample.key.kernel_stack_id),
    )
}

fn total_ns(batches: &[&RawBatch], tid: u32) -> u64 {
    batches
        .iter()
        .flat_map(|batch| batch.samples.iter())
        .filter(|sample| sample.key.tid == tid)
        .map(|sample| sample.amount)
        .sum()
}

#[test]
fn a_wait_across_drains_is_counted_once_with_its_stacks_in_every_window() {
    let mut tracker = WaitTracker::new(0);
    let blocked = wait(100 * MS, 0, 3, 4);
    // Drain of generation 0 at 1000 ms: the wait (begun at 100 ms) goes on.
    let mut first = batch_with_stacks(&[(3, &[0x10, 0x20])], &[(4, &[0xf_fff1])]);
    tracker.drained(&mut first, 0, 1000 * MS, &[(42, blocked)]);
    assert_eq!(
        first.samples.len(),
        1,
        "one credit for the ongoing wait: {:?}",
        first.samples
    );
    assert_eq!(
        first.samples[0].amount,
        900 * MS,
        "credited from its start to the flip"
    );
    assert_eq!(first.samples[0].count, 0, "a wait is counted once, when it ends");
    // Generation 1 at 2000 ms: still blocked; its stacks are no longer in
    // the drained buffer, the tracker kept them.
    let mut second = RawBatch::default();
    tracker.drained(&mut second, 1, 2000 * MS, &[(42, blocked)]);
    assert_eq!(second.samples.len(), 1);
    assert_eq!(second.samples[0].amount, 1000 * MS, "the next second only");
    assert_eq!(
        frames(&second, &second.samples[0]),
        (Some(vec![0x10, 0x20]), Some(vec![0xf_fff1])),
        "the kept stacks, under ids of this batch"
    );
    // It ends at 2500 ms: the sampler counts all 2400 ms in generation 2.
    let mut third = RawBatch::default();
    third.samples.push(ended(&blocked, 42, 2500 * MS, 1));
    tracker.drained(
        &mut third,
        2,
        3000 * MS,
        &[(
            42,
            Wait {
                since_ns: 0,
                ..blocked
            },
        )],
    );
    assert_eq!(third.samples.len(), 1);
    assert_eq!(
        third.samples[0].amount,
        500 * MS,
        "only what was not credited before"
    );
    assert_eq!(third.samples[0].count, 1);
    assert_eq!(frames(&third, &third.samples[0]).0, Some(vec![0x10, 0x20]));
    assert_eq!(
        total_ns(&[&first, &second, &third], 42),
        2400 * MS,
        "the whole wait, once"
    );
    assert_eq!(third.wait_stacks_lost, 0);
}

#[test]
fn a_wait_that_ends_right_after_a_flip_finds_the_previous_batchs_stacks() {
    let mut tracker = WaitTracker::new(0);
    // Begun in generation 5; ended after the flip and before the waits were read.
    let short = wait(900 * MS, 5, 8, -14);
    let mut first = batch_with_stacks(&[(8, &[0xabc])], &[]);
    tracker.drained(&mut first, 5, 1000 * MS, &[(7, Wait { since_ns: 0, ..short })]);
    assert!(first.samples.is_empty(), "nothing ongoing: {:?}", first.samples);
    let mut second = RawBatch::default();
    second.samples.push(ended(&short, 7, 1010 * MS, 1));
    tracker.drained(&mut second, 6, 2000 * MS, &[]);
    assert_eq!(second.samples[0].amount, 110 * MS);
    assert_eq!(frames(&second, &second.samples[0]), (Some(vec![0xabc]), None));
    assert_eq!(second.wait_stacks_lost, 0);
}

#[test]
fn a_wait_of_the_drained_buffer_timed_from_after_the_flip_keeps_its_stacks() {
    let mut tracker = WaitTracker::new(0);
    // Its buffer picked before the flip, its time taken after it.
    let late = wait(1001 * MS, 3, 5, 6);
    let mut first = batch_with_stacks(&[(5, &[0x55])], &[(6, &[0xf_ff66])]);
    tracker.drained(&mut first, 3, 1000 * MS, &[(9, late)]);
    assert!(
        first.samples.is_empty(),
        "nothing to credit yet: {:?}",
        first.samples
    );
    // Two drains on, still going: credited under the stacks kept.
    let mut second = RawBatch::default();
    tracker.drained(&mut second, 4, 2000 * MS, &[(9, late)]);
    let mut third = RawBatch::default();
    tracker.drained(&mut third, 5, 3000 * MS, &[(9, late)]);
    for batch in [&second, &third] {
        assert_eq!(batch.samples.len(), 1, "{:?}", batch.samples);
        assert_eq!(
            frames(batch, &batch.samples[0]),
            (Some(vec![0x55]), Some(vec![0xf_ff66])),
            "the stacks kept at the drain of their buffer"
        );
        assert_eq!(batch.wait_stacks_lost, 0);
    }
    assert_eq!(total_ns(&[&first, &second, &third], 9), 1999 * MS);
}

#[test]
fn each_wait_s_weight_scales_its_credit_and_short_waits_are_left_to_the_sampler() {
    let mut tracker = WaitTracker::new(50 * MS);
    let long = Wait {
        weight: 4,
        ..wait(100 * MS, 0, 1, 2)
    };
    let unweighted = Wait {
        weight: 0,
        ..wait(200 * MS, 0, 1, 2)
    };
    let young = Wait {
        weight: 8,
        ..wait(990 * MS, 0, 1, 2)
    };
    let mut batch = batch_with_stacks(&[(1, &[1])], &[(2, &[2])]);
    tracker.drained(
        &mut batch,
        0,
        1000 * MS,
        &[(1, long), (3, unweighted), (2, young)],
    );
    let credited: Vec<(u32, u64)> = batch
        .samples
        .iter()
        .map(|sample| (sample.key.tid, sample.amount))
        .collect();
    assert_eq!(
        credited,
        [(1, 4 * 900 * MS), (3, 800 * MS)],
        "each wait weighted by its own odds (0 taken as 1); the 10 ms wait may still be dropped as short"
    );
}

#[test]
fn cpu_samples_and_current_generation_waits_pass_untouched() {
    let mut tracker = WaitTracker::new(0);
    let current = wait(1500 * MS, 3, 1, 2);
    let mut batch = batch_with_stacks(&[(1, &[1])], &[(2, &[2])]);
    let mut cpu = ended(&current, 5, 1600 * MS, 1);
    cpu.key.kind = sample_kind::CPU;
    cpu.key.generation = 1;
    let completed = ended(&current, 6, 1600 * MS, 1);
    batch.samples.extend([cpu, completed]);
    tracker.drained(&mut batch, 3, 2000 * MS, &[]);
    assert_eq!(batch.samples, vec![cpu, completed]);
}

#[test]
fn a_lost_stack_is_counted_and_the_time_kept() {
    let mut tracker = WaitTracker::new(0);
    // Begun in a generation the tracker never saw (before it started).
    let orphan = wait(100 * MS, 9, 1, 2);
    let mut batch = RawBatch::default();
    batch.samples.push(ended(&orphan, 3, 600 * MS, 1));
    tracker.drained(&mut batch, 11, 1000 * MS, &[]);
    assert_eq!(batch.wait_stacks_lost, 1);
    assert_eq!(batch.samples[0].amount, 500 * MS, "the time stays");
    assert_eq!(frames(&batch, &batch.samples[0]), (None, None));
}
