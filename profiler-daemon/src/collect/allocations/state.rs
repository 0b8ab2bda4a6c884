//! The daemon's side of the allocation probes' maps: which processes are
//! traced (and what it cost them), and forgetting what the kernel held for
//! a process when its tracing starts and ends.

use aya::maps::{Array, HashMap, MapData};
use profiler_common::{
    ALLOC_DRAW_COUNT, AllocBlock, AllocBlockKey, AllocStackKey, AllocThread, AllocTraced, UnwoundStack, maps,
};

use crate::{collect::CollectError, procfs::ProcRoot};

pub struct AllocationMaps {
    traced: HashMap<MapData, u32, AllocTraced>,
    threads: HashMap<MapData, u32, AllocThread>,
    blocks: HashMap<MapData, AllocBlockKey, AllocBlock>,
    stacks: HashMap<MapData, AllocStackKey, UnwoundStack>,
    /// Held, not read again: the programs, loaded later, use it.
    _draws: Array<MapData, u64>,
    proc_root: ProcRoot,
}

/// The allocation probes' maps, as taken out of the loaded object (see
/// `Sampler::take_allocation_maps`).
pub struct AllocationMapHandles {
    pub traced: HashMap<MapData, u32, AllocTraced>,
    pub threads: HashMap<MapData, u32, AllocThread>,
    pub blocks: HashMap<MapData, AllocBlockKey, AllocBlock>,
    pub stacks: HashMap<MapData, AllocStackKey, UnwoundStack>,
    pub draws: Array<MapData, u64>,
}

impl AllocationMaps {
    /// Keeps the maps and fills the sampling table for a mean interval of
    /// `interval` bytes.
    pub fn new(
        handles: AllocationMapHandles,
        interval: u64,
        proc_root: ProcRoot,
    ) -> Result<Self, CollectError> {
        let AllocationMapHandles {
            traced,
            threads,
            blocks,
            stacks,
            mut draws,
        } = handles;
        for (index, draw) in exponential_draws(interval).into_iter().enumerate() {
            draws
                .set(index as u32, &draw, 0)
                .map_err(|source| CollectError::Map {
                    name: maps::ALLOC_DRAWS,
                    source,
                })?;
        }
        Ok(Self {
            traced,
            threads,
            blocks,
            stacks,
            _draws: draws,
            proc_root,
        })
    }

    /// Makes the probes record `pid`.
    pub fn trace(&mut self, pid: u32) -> Result<(), String> {
        self.traced
            .insert(&pid, &AllocTraced::default(), 0)
            .map_err(|err| format!("the traced-process map: {err}"))
    }

    /// Makes the probes ignore `pid` from now on.
    pub fn untrace(&mut self, pid: u32) {
        let _ = self.traced.remove(&pid);
    }

    /// What tracing `pid` has counted; None when it is not traced (any
    /// more: its exec ends it in the kernel).
    pub fn figures(&self, pid: u32) -> Option<AllocTraced> {
        self.traced.get(&pid, 0).ok()
    }

    /// Removes the live blocks, stacks and thread states of `pid`.
    pub fn forget(&mut self, pid: u32) {
        // The kernel restarts a listing from the first key when the key it
        // continues from was deleted meanwhile (by the probes of another
        // traced process): bounded, so a busy one cannot hold the drain
        // thread here. An entry missed stays until this pid's next start.
        let bound = 2 * maps::DEFAULT_ALLOC_BLOCKS_ENTRIES as usize;
        let blocks: Vec<AllocBlockKey> = self
            .blocks
            .keys()
            .take(bound)
            .flatten()
            .filter(|key| key.tgid == pid)
            .collect();
        for key in blocks {
            let _ = self.blocks.remove(&key);
        }
        let stacks: Vec<AllocStackKey> = self
            .stacks
            .keys()
            .take(2 * maps::DEFAULT_ALLOC_STACKS_ENTRIES as usize)
            .flatten()
            .filter(|key| key.tgid == pid)
            .collect();
        for key in stacks {
            let _ = self.stacks.remove(&key);
        }
        // A thread detached in the middle of a call would stay "inside" it.
        if let Ok(tasks) = std::fs::read_dir(self.proc_root.file(pid, "task")) {
            for tid in tasks
                .flatten()
                .filter_map(|task| task.file_name().to_str()?.parse::<u32>().ok())
            {
                let _ = self.threads.remove(&tid);
            }
        }
    }
}

/// `ALLOC_DRAW_COUNT` exponential draws of mean `interval` (quantiles of the
/// distribution, in a random order's stead: the program picks one at random).
pub fn exponential_draws(interval: u64) -> Vec<u64> {
    let count = ALLOC_DRAW_COUNT as usize;
    let raw: Vec<f64> = (0..count)
        .map(|index| -((index as f64 + 0.5) / count as f64).ln())
        .collect();
    // Quantiles' mean is a little under 1: scaled to exactly the interval.
    let mean = raw.iter().sum::<f64>() / count as f64;
    raw.into_iter()
        .map(|draw| (draw / mean * interval as f64).round() as u64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_average_the_interval() {
        let draws = exponential_draws(512 * 1024);
        assert_eq!(draws.len(), ALLOC_DRAW_COUNT as usize);
        let mean = draws.iter().sum::<u64>() as f64 / draws.len() as f64;
        assert!((mean - 512.0 * 1024.0).abs() < 512.0, "mean {mean}");
        // Exponential: about 63% of the draws are below the mean.
        let below = draws.iter().filter(|&&draw| draw < 512 * 1024).count();
        assert!((150..=175).contains(&below), "{below} of 256 below the mean");
        assert!(exponential_draws(0).iter().all(|&draw| draw == 0));
    }
}
