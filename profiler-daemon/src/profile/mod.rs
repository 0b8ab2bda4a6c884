//! Stage 4's input: a [`Profile`] (what the store answers) and the formats it
//! is written in.

mod filter;
pub mod flamegraph;
pub mod folded;
mod kernel_addresses;
pub mod pprof;
pub mod top;
mod window;

pub use filter::Filter;
pub use window::Window;

use crate::{kind::ProfileType, symbolize::SymbolizedSample};

/// Samples aggregated over a window, one per distinct
/// (pid, tid, comm, thread name, stack).
#[derive(Clone, Debug)]
pub struct Profile {
    /// The window asked for (open ends clipped to what the store holds).
    pub window: Window,
    /// Samples per second per CPU the sampler ran at.
    pub frequency: u64,
    /// Which kinds of samples it holds (the store keeps only those), and so
    /// the schema its encoders write.
    pub profile_type: ProfileType,
    pub samples: Vec<SymbolizedSample>,
}

impl Profile {
    /// Samples, or waits, or both (wall): the count-like value.
    pub fn total_samples(&self) -> u64 {
        self.samples.iter().map(|sample| sample.count).sum()
    }

    /// What the views add up for `sample`: samples for a CPU profile,
    /// nanoseconds for the others (see [`ProfileType::counts_time`]).
    pub fn value(&self, sample: &SymbolizedSample) -> u64 {
        if self.profile_type.counts_time() {
            sample.ns
        } else {
            sample.count
        }
    }

    pub fn total_value(&self) -> u64 {
        self.samples.iter().map(|sample| self.value(sample)).sum()
    }

    /// The unit of [`Profile::value`]: `samples` or `ns`.
    pub fn value_unit(&self) -> &'static str {
        if self.profile_type.counts_time() {
            "ns"
        } else {
            "samples"
        }
    }
}
