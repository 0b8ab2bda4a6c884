//! How useful each file's table is: the samples whose user stacks went
//! through the file, halved at every drain. Tables are loaded most useful
//! first and evicted least useful per chunk of room first; a table never
//! evicts one that is more useful per chunk than itself.

use std::{collections::HashMap, hash::Hash, sync::Arc};

/// What one drain sampled: (tgid, count, user stack id) and the user stacks.
#[derive(Debug, Default)]
pub struct SampledStacks {
    pub samples: Vec<(u32, u64, i32)>,
    pub stacks: HashMap<u32, Arc<[u64]>>,
}

/// Samples through a file, decayed by half per drain since `drain`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    value: f64,
    drain: u64,
}

impl Usage {
    pub fn at(&self, drain: u64) -> f64 {
        let halvings = drain.saturating_sub(self.drain).min(1023) as i32;
        self.value * 0.5f64.powi(halvings)
    }

    pub fn add(&mut self, drain: u64, samples: f64) {
        self.value = self.at(drain) + samples;
        self.drain = drain;
    }
}

/// Samples per file in one drain: a sample counts once for every file its
/// user stack passes through. `file_of(tgid, pc)` names the file mapped at
/// `pc` in that process.
pub fn attribute<K: Copy + Eq + Hash>(
    sampled: &SampledStacks,
    file_of: impl Fn(u32, u64) -> Option<K>,
) -> HashMap<K, u64> {
    let mut per_file = HashMap::new();
    let mut seen: Vec<K> = Vec::new();
    for &(tgid, count, stack_id) in &sampled.samples {
        let Some(stack) = u32::try_from(stack_id)
            .ok()
            .and_then(|id| sampled.stacks.get(&id))
        else {
            continue;
        };
        seen.clear();
        for &pc in stack.iter() {
            if let Some(file) = file_of(tgid, pc)
                && !seen.contains(&file)
            {
                seen.push(file);
                *per_file.entry(file).or_default() += count;
            }
        }
    }
    per_file
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_halves_every_drain() {
        let mut usage = Usage::default();
        usage.add(10, 8.0);
        assert_eq!(usage.at(10), 8.0);
        assert_eq!(usage.at(12), 2.0);
        usage.add(12, 1.0);
        assert_eq!(usage.at(13), 1.5);
        assert!(
            usage.at(u64::MAX) < 1e-300,
            "no overflow however long it was idle"
        );
    }

    #[test]
    fn a_sample_counts_once_per_file_of_its_stack() {
        let sampled = SampledStacks {
            samples: vec![(1, 3, 7), (1, 2, 8), (2, 5, -14)],
            stacks: HashMap::from([
                (7, Arc::from([0x10, 0x11, 0x20, 0x12].as_slice())),
                (8, Arc::from([0x20].as_slice())),
            ]),
        };
        // Files are the pc's high nibble; pid 2's sample has no user stack.
        let per_file = attribute(&sampled, |_, pc| Some(pc >> 4));
        assert_eq!(per_file, HashMap::from([(1, 3), (2, 5)]));
    }
}
