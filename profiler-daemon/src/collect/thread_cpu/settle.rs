//! Making a batch carry what a thread is owed: CPU added to its stacks
//! (this batch's, or its latest kept ones, or the placeholder frame), or
//! taken off its samples.

use std::{collections::HashMap, sync::Arc};

use profiler_common::{SampleKey, sample_kind};

use super::{Credit, KEPT_STACKS, Kept, Sampled, Thread};
use crate::collect::raw::{RawBatch, RawSample, UNSAMPLED_CPU_STACK_ID};

/// The thread a credit is for, and what its placeholder sample is keyed by.
#[derive(Clone, Copy, Debug)]
pub(super) struct Who {
    pub tgid: u32,
    pub tid: u32,
    pub instance: u32,
    pub cgroup_id: u64,
}

/// Makes the batch carry `owed` more (or less) CPU for the thread `who`.
pub(super) fn settle(who: Who, thread: &Thread, owed: i128, sampled: &Sampled, ctx: &mut Credit<'_>) {
    let samples = &mut ctx.batch.samples;
    if owed < 0 {
        let mut take = u64::try_from(-owed).unwrap_or(u64::MAX);
        for &index in &sampled.indices {
            let taken = take.min(samples[index].amount);
            samples[index].amount -= taken;
            ctx.credits.taken_back_ns += taken;
            take -= taken;
        }
        ctx.credits.excess_ns += take;
        return;
    }
    let owed = u64::try_from(owed).unwrap_or(u64::MAX);
    if owed == 0 {
        return;
    }
    ctx.credits.added_ns += owed;
    if !sampled.indices.is_empty() {
        // In proportion to the samples (not their amounts: a thread's first
        // sample may carry all its earlier CPU).
        let weights: Vec<u64> = sampled
            .indices
            .iter()
            .map(|&index| samples[index].count)
            .collect();
        for (share, &index) in shares(owed, &weights).into_iter().zip(&sampled.indices) {
            samples[index].amount += share;
        }
        return;
    }
    if thread.stacks.is_empty() {
        ctx.credits.unplaced_ns += owed;
        let key = SampleKey {
            tgid: who.tgid,
            tid: who.tid,
            instance: who.instance,
            user_stack_id: UNSAMPLED_CPU_STACK_ID,
            kernel_stack_id: UNSAMPLED_CPU_STACK_ID,
            comm: thread.comm,
            kind: sample_kind::CPU,
            reserved: 0,
            generation: ctx.generation,
            reserved2: 0,
            cgroup_id: who.cgroup_id,
        };
        samples.push(RawSample {
            key,
            count: 0,
            amount: owed,
        });
        return;
    }
    let weights: Vec<u64> = thread.stacks.iter().map(|kept| kept.weight).collect();
    for (share, kept) in shares(owed, &weights).into_iter().zip(&thread.stacks) {
        if share == 0 {
            continue;
        }
        let mut key = kept.key;
        key.generation = ctx.generation;
        key.user_stack_id = place(
            &mut ctx.batch.user_stacks,
            key.user_stack_id,
            &kept.user,
            ctx.next_id,
        );
        key.kernel_stack_id = place(
            &mut ctx.batch.kernel_stacks,
            key.kernel_stack_id,
            &kept.kernel,
            ctx.next_id,
        );
        ctx.batch.samples.push(RawSample {
            key,
            count: 0,
            amount: share,
        });
    }
}

/// `total` split in proportion to `weights` (equally when they are all 0);
/// the shares add up to `total`.
fn shares(total: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u128 = weights.iter().map(|&weight| u128::from(weight)).sum();
    let mut out: Vec<u64> = weights
        .iter()
        .map(|&weight| match sum {
            0 => total / weights.len().max(1) as u64,
            _ => (u128::from(total) * u128::from(weight) / sum) as u64,
        })
        .collect();
    let given: u64 = out.iter().sum();
    if let Some(first) = out.first_mut() {
        *first += total - given;
    }
    out
}

/// The heaviest stacks of the thread's samples in this batch, kept for its
/// drains without samples.
pub(super) fn keep_stacks(thread: &mut Thread, sampled: &Sampled, batch: &RawBatch) {
    if sampled.indices.is_empty() {
        return;
    }
    let mut heaviest: Vec<usize> = sampled.indices.clone();
    heaviest.sort_by_key(|&index| std::cmp::Reverse(batch.samples[index].count));
    heaviest.truncate(KEPT_STACKS);
    thread.stacks = heaviest
        .into_iter()
        .map(|index| {
            let sample = batch.samples[index];
            Kept {
                key: sample.key,
                user: stack(&batch.user_stacks, sample.key.user_stack_id),
                kernel: stack(&batch.kernel_stacks, sample.key.kernel_stack_id),
                weight: sample.count,
            }
        })
        .collect();
    thread.comm = batch.samples[sampled.indices[0]].key.comm;
}

fn stack(stacks: &HashMap<u32, Arc<[u64]>>, id: i32) -> Option<Arc<[u64]>> {
    u32::try_from(id).ok().and_then(|id| stacks.get(&id)).cloned()
}

/// A kept stack under a fresh id of this batch; a kept negative id (the
/// sampler's "no stack" errno) as it was.
fn place(
    stacks: &mut HashMap<u32, Arc<[u64]>>,
    id: i32,
    kept: &Option<Arc<[u64]>>,
    next_id: &mut u32,
) -> i32 {
    match kept {
        Some(frames) if id >= 0 => {
            let fresh = *next_id;
            *next_id += 1;
            stacks.insert(fresh, frames.clone());
            fresh as i32
        }
        _ => id.min(-1),
    }
}

#[cfg(test)]
mod tests {
    use super::shares;

    #[test]
    fn shares_add_up_to_the_total() {
        assert_eq!(shares(10, &[1, 1, 1]), vec![4, 3, 3]);
        assert_eq!(shares(10, &[0, 0]), vec![5, 5]);
        let total: u128 = shares(u64::MAX, &[u64::MAX, 1])
            .iter()
            .map(|&share| u128::from(share))
            .sum();
        assert_eq!(total, u128::from(u64::MAX));
    }
}
