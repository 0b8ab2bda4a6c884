//! Sampled blocks: remembered until freed, and their frees counted under
//! their allocation's key and stack, from whichever thread frees them.

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    helpers::bpf_ktime_get_ns,
    macros::map,
    maps::HashMap,
};
use profiler_common::{
    AllocBlock, AllocBlockKey, AllocStackKey, Counter, SampleKey, UnwoundStack, maps::*, sample_kind,
};

use super::{ALLOC_THREADS, ALLOC_TRACED};
use crate::{BUFFER_0, BUFFER_1, Buffer, atomic_add, bump, generation, stored_stack_id};

const EFAULT: i32 = 14;
const ENOENT: i32 = 2;

/// Sampled blocks not yet freed.
#[map]
pub(super) static ALLOC_BLOCKS: HashMap<AllocBlockKey, AllocBlock> =
    HashMap::with_max_entries(DEFAULT_ALLOC_BLOCKS_ENTRIES, BPF_F_NO_PREALLOC);
/// The stacks of sampled blocks, for their frees after a drain has cleared
/// the buffer that held them.
#[map]
pub(super) static ALLOC_STACKS: HashMap<AllocStackKey, UnwoundStack> =
    HashMap::with_max_entries(DEFAULT_ALLOC_STACKS_ENTRIES, BPF_F_NO_PREALLOC);

/// `address` of process `tgid` is freed: if it is a sampled block, its
/// free is counted under its allocation's key. `inside_call`: from free's
/// own probe, which may fire inside another allocator call.
#[inline(always)]
pub(super) fn freed(inside_call: bool, tgid: u32, tid: u32, address: u64) {
    if address == 0 {
        return;
    }
    let block_key = AllocBlockKey {
        tgid,
        reserved: 0,
        address,
    };
    // SAFETY: the value is copied out before the entry is removed.
    let Some(block) = (unsafe { ALLOC_BLOCKS.get(&block_key) }).copied() else {
        return;
    };
    // A free inside an allocator call (realloc(p, 0) calls free): the
    // outer call accounts for its block when it returns.
    // SAFETY: the value is only read.
    if inside_call && unsafe { ALLOC_THREADS.get(&tid) }.is_some_and(|thread| thread.depth > 0) {
        return;
    }
    if ALLOC_BLOCKS.remove(&block_key).is_err() {
        // Another CPU freed it first (a double free in the process).
        return;
    }
    let generation = generation();
    let buffer = if generation & 1 == 1 { BUFFER_1 } else { BUFFER_0 };
    let user_stack_id = if block.generation == generation || block.user_stack_id < 0 {
        block.user_stack_id
    } else {
        let stack_key = AllocStackKey {
            tgid,
            reserved: 0,
            hash: block.stack_hash,
        };
        // SAFETY: the value is only read.
        match unsafe { ALLOC_STACKS.get(&stack_key) } {
            Some(stack) => stored_stack_id(stack, buffer.unwound_stacks),
            None => {
                bump(Counter::AllocStackLost);
                -ENOENT
            }
        }
    };
    let key = SampleKey {
        tgid,
        tid: block.tid,
        instance: block.instance,
        user_stack_id,
        kernel_stack_id: -EFAULT,
        comm: block.comm,
        kind: sample_kind::ALLOC_FREED,
        reserved: 0,
        generation,
        reserved2: 0,
        cgroup_id: block.cgroup_id,
    };
    add_to(&buffer, &key, block.size);
    // SAFETY: a helper without arguments.
    let lived = unsafe { bpf_ktime_get_ns() }.saturating_sub(block.allocated_ns);
    let lifetime = SampleKey {
        kind: sample_kind::ALLOC_LIFETIME,
        ..key
    };
    add_to(&buffer, &lifetime, lived);
    bump(Counter::AllocFreed);
    if let Some(traced) = ALLOC_TRACED.get_ptr_mut(&tgid) {
        // SAFETY: a live map value, added to atomically (adding 2^64 - 1
        // takes one away).
        unsafe {
            atomic_add(&mut (*traced).freed, 1);
            atomic_add(&mut (*traced).live, u64::MAX);
        }
    }
}

/// Adds one to `key`'s count and `size` to its amount. Atomically: frees are
/// counted under the allocating thread's key from whichever thread frees.
#[inline(always)]
pub(super) fn add_to(buffer: &Buffer, key: &SampleKey, size: u64) {
    if let Some(value) = buffer.counts.get_ptr_mut(key) {
        // SAFETY: a live map value; other CPUs may add to it, hence atomics.
        unsafe {
            atomic_add(&mut (*value).count, 1);
            atomic_add(&mut (*value).amount, size);
        }
        return;
    }
    let value = profiler_common::SampleValue {
        count: 1,
        amount: size,
    };
    if let Err(err) = buffer.counts.insert(key, &value, BPF_NOEXIST as u64) {
        if -err == crate::EEXIST {
            // Another CPU created it first: add to theirs.
            if let Some(value) = buffer.counts.get_ptr_mut(key) {
                // SAFETY: as above.
                unsafe {
                    atomic_add(&mut (*value).count, 1);
                    atomic_add(&mut (*value).amount, size);
                }
            }
        } else {
            bump(Counter::CountsMapFull);
        }
    }
}
