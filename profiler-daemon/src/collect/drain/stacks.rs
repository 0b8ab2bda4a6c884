//! The drained buffer's stacks: the kernel's stack-trace maps (kernel
//! stacks, and user stacks in frame-pointer mode) and the sampler's own
//! unwound stacks with their tails, each read and deleted.

use std::{
    collections::{HashMap as StdHashMap, HashSet},
    sync::Arc,
};

use aya::maps::{HashMap, IterableMap, MapData, MapError, StackTraceMap};
use profiler_common::{MAX_STACK_DEPTH, SampleKey, UnwoundStack};

use crate::collect::{
    batch::{self, Taken},
    raw::RawSample,
};

/// Reads and deletes every stack of a stack-trace map.
pub(super) struct StackTaker {
    ids: Vec<u32>,
    used: HashSet<u32>,
    frames: Box<[u64; MAX_STACK_DEPTH]>,
    /// This kernel cannot read and delete a stack trace in one call: each
    /// is read, then deleted.
    apart: bool,
}

// `frames` is a stack-trace map's value: aya-ebpf's `StackTrace` holds
// PERF_MAX_STACK_DEPTH frames.
const _: () = assert!(MAX_STACK_DEPTH == aya_obj::generated::PERF_MAX_STACK_DEPTH as usize);

impl Default for StackTaker {
    fn default() -> Self {
        Self {
            ids: Vec::new(),
            used: HashSet::new(),
            frames: Box::new([0; MAX_STACK_DEPTH]),
            apart: false,
        }
    }
}

impl StackTaker {
    /// Every stack of `map` into `out`, the map left empty; returns the
    /// error count. `used`: the ids the drained samples name, taken first
    /// by id, one call each; the rest (the stacks of waits still going on,
    /// of samples lost after their walk, and any pass 1 could not take)
    /// are listed, two calls each.
    pub(super) fn drain(
        &mut self,
        map: &mut StackTraceMap<MapData>,
        used: impl Iterator<Item = i32>,
        out: &mut StdHashMap<u32, Arc<[u64]>>,
    ) -> u64 {
        let mut errors = 0;
        self.used.clear();
        self.used.extend(used.filter_map(|id| u32::try_from(id).ok()));
        if !self.apart {
            // Out of `self` while `take` borrows it; put back to be reused.
            let mut used = std::mem::take(&mut self.used);
            for id in used.drain() {
                // A failure here is left to the listing below, which tries
                // the stack again and counts what fails there.
                match self.take(map, id, out) {
                    Ok(Taken::Read | Taken::Absent) | Err(_) => {}
                    Ok(Taken::Unsupported) => break,
                }
            }
            self.used = used;
        }
        self.ids.clear();
        self.ids
            .extend(map.stack_ids().filter_map(|id| id.map_err(|_| errors += 1).ok()));
        for index in 0..self.ids.len() {
            let id = self.ids[index];
            if !self.apart {
                match self.take(map, id, out) {
                    Ok(Taken::Read) => continue,
                    // Deleted between listing and reading: nothing to keep.
                    Ok(Taken::Absent) => continue,
                    Ok(Taken::Unsupported) => {}
                    Err(err) => tracing::debug!("taking stack {id}: {err}; reading and deleting it apart"),
                }
            }
            match map.get(&id, 0) {
                Ok(stack) => {
                    out.insert(id, stack.frames().iter().map(|frame| frame.ip).collect());
                }
                Err(MapError::KeyNotFound) => {}
                Err(_) => errors += 1,
            }
            if map.remove(&id).is_err() {
                errors += 1;
            }
        }
        errors
    }

    /// One stack read and deleted in one call, into `out`.
    fn take(
        &mut self,
        map: &StackTraceMap<MapData>,
        id: u32,
        out: &mut StdHashMap<u32, Arc<[u64]>>,
    ) -> std::io::Result<Taken> {
        // SAFETY: a stack-trace map's key is a u32 and its value
        // MAX_STACK_DEPTH u64 (asserted above).
        let taken = unsafe { batch::take(map.map(), &id, &mut *self.frames) }?;
        match taken {
            Taken::Read => {
                out.insert(id, frames_of(&self.frames));
            }
            Taken::Absent => {}
            Taken::Unsupported => {
                tracing::debug!("this kernel reads and deletes stack traces in two calls");
                self.apart = true;
            }
        }
        Ok(taken)
    }
}

/// The stack ids the samples name in the maps of `generation` (the waits
/// that ended now name the maps of the generation they began in).
pub(super) fn stacks_named(
    samples: &[RawSample],
    generation: u32,
    id: impl Fn(&SampleKey) -> i32,
) -> impl Iterator<Item = i32> {
    samples
        .iter()
        .filter(move |sample| sample.key.generation == generation)
        .map(move |sample| id(&sample.key))
}

/// A stack trace's frames: up to its first 0 (the kernel zeroes the rest).
fn frames_of(frames: &[u64; MAX_STACK_DEPTH]) -> Arc<[u64]> {
    let len = frames.iter().position(|&ip| ip == 0).unwrap_or(frames.len());
    frames[..len].into()
}

/// Reads and deletes every stack of an unwound-stacks map and its tails
/// map; returns the error count.
pub(super) fn drain_unwound(
    maps: [&HashMap<MapData, u32, UnwoundStack>; 2],
    ids: [&mut Vec<u32>; 2],
    read: [&mut Vec<UnwoundStack>; 2],
    out: &mut StdHashMap<u32, Arc<[u64]>>,
) -> u64 {
    let [stack_ids, tail_ids] = ids;
    let [stacks, tails] = read;
    let mut read_ok = [true; 2];
    let pairs = [
        (maps[0], &mut *stack_ids, &mut *stacks),
        (maps[1], &mut *tail_ids, &mut *tails),
    ];
    for ((map, ids, values), ok) in pairs.into_iter().zip(&mut read_ok) {
        if let Err(err) = batch::read_all(map.map(), true, ids, values) {
            tracing::debug!("reading an unwound-stacks map: {err}");
            *ok = false;
        }
    }
    let mut errors = read_ok.iter().filter(|ok| !**ok).count() as u64;
    let tails: StdHashMap<u32, &UnwoundStack> = tail_ids.iter().copied().zip(tails.iter()).collect();
    for (id, stack) in stack_ids.iter().zip(stacks.iter()) {
        let tail = tails.get(id).copied();
        if read_ok[1]
            && stack.len as usize > MAX_STACK_DEPTH
            && !tail.is_some_and(|tail| tail.hash == stack.hash)
        {
            // The sampler stores the tail before the stack: only a read that
            // failed (counted once, above) can lose it.
            errors += 1;
        }
        out.insert(*id, whole_stack(stack, tail));
    }
    errors
}

/// The frames of an unwound stack, with its tail's when it is deeper than
/// `MAX_STACK_DEPTH` and `tail` is its own (same hash); without a tail of
/// its own it keeps its leaf-most `MAX_STACK_DEPTH`.
fn whole_stack(stack: &UnwoundStack, tail: Option<&UnwoundStack>) -> Arc<[u64]> {
    let len = stack.len as usize;
    let head = &stack.frames[..len.min(MAX_STACK_DEPTH)];
    match tail.filter(|tail| len > MAX_STACK_DEPTH && tail.hash == stack.hash) {
        Some(tail) => {
            let rest = (len - MAX_STACK_DEPTH)
                .min(tail.len as usize)
                .min(MAX_STACK_DEPTH);
            head.iter().chain(&tail.frames[..rest]).copied().collect()
        }
        None => head.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(hash: u64, first: u64, len: usize, frames: usize) -> UnwoundStack {
        let mut stack = UnwoundStack {
            hash,
            len: len as u32,
            end: 0,
            frames: [0; MAX_STACK_DEPTH],
        };
        for (i, frame) in stack.frames.iter_mut().take(frames).enumerate() {
            *frame = first + i as u64;
        }
        stack
    }

    #[test]
    fn a_deep_stack_is_joined_to_its_own_tail_only() {
        let head = stack(7, 1000, MAX_STACK_DEPTH + 3, MAX_STACK_DEPTH);
        let tail = stack(7, 5000, 3, 3);
        let whole = whole_stack(&head, Some(&tail));
        assert_eq!(whole.len(), MAX_STACK_DEPTH + 3);
        assert_eq!(whole[0], 1000);
        assert_eq!(whole[MAX_STACK_DEPTH - 1], 1000 + MAX_STACK_DEPTH as u64 - 1);
        assert_eq!(&whole[MAX_STACK_DEPTH..], &[5000, 5001, 5002]);
        // Another stack's tail (the key's low bits collided): the leaf-most part.
        let other = stack(8, 5000, 3, 3);
        assert_eq!(whole_stack(&head, Some(&other)).len(), MAX_STACK_DEPTH);
        assert_eq!(whole_stack(&head, None).len(), MAX_STACK_DEPTH);
        // A tail claiming more than it holds, or a shallow stack with a stray tail.
        let forged = stack(7, 5000, 500, 3);
        assert_eq!(whole_stack(&head, Some(&forged)).len(), MAX_STACK_DEPTH + 3);
        let shallow = stack(7, 1, 5, 5);
        assert_eq!(&*whole_stack(&shallow, Some(&tail)), &[1, 2, 3, 4, 5]);
        let beyond = stack(7, 1000, 10_000, MAX_STACK_DEPTH);
        let full_tail = stack(7, 5000, MAX_STACK_DEPTH, MAX_STACK_DEPTH);
        assert_eq!(whole_stack(&beyond, Some(&full_tail)).len(), 2 * MAX_STACK_DEPTH);
    }
}
