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

use crate::{
    kind::{ProfileType, ViewValue},
    symbolize::SymbolizedSample,
};

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
    /// amounts (waited nanoseconds) for the others: the type's
    /// [`ViewValue`].
    pub fn value(&self, sample: &SymbolizedSample) -> u64 {
        match self.profile_type.describe().views_count {
            ViewValue::Count => sample.count,
            ViewValue::Amount => sample.amount,
        }
    }

    pub fn total_value(&self) -> u64 {
        self.samples.iter().map(|sample| self.value(sample)).sum()
    }

    /// The unit of [`Profile::value`]: `samples`, or the amount's (`ns`).
    pub fn value_unit(&self) -> &'static str {
        let description = self.profile_type.describe();
        match description.views_count {
            ViewValue::Count => "samples",
            ViewValue::Amount => description.unit.short(),
        }
    }
}
