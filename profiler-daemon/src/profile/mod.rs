//! Stage 4's input: a [`Profile`] (what the store answers) and the formats it
//! is written in.

pub mod flamegraph;
pub mod folded;
pub mod pprof;
pub mod top;

use crate::{store::Window, symbolize::SymbolizedSample};

/// Samples aggregated over a window, one per distinct
/// (pid, tid, comm, thread name, stack).
#[derive(Clone, Debug)]
pub struct Profile {
    /// The window asked for (open ends clipped to what the store holds).
    pub window: Window,
    /// Samples per second per CPU the sampler ran at.
    pub frequency: u64,
    pub samples: Vec<SymbolizedSample>,
}

impl Profile {
    pub fn total_samples(&self) -> u64 {
        self.samples.iter().map(|sample| sample.count).sum()
    }
}
