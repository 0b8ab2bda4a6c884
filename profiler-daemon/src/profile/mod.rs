//! Stage 4's input: a [`Profile`] (what the store answers) and the formats it
//! is written in.

pub mod flamegraph;
pub mod folded;
mod kernel_addresses;
pub mod pprof;
pub mod sites;
pub mod top;
mod window;

pub use crate::filter::Filter;
pub use window::Window;

use crate::{
    kind::{ProfileType, Scale, Value, ViewValue},
    symbolize::SymbolizedSample,
};

/// Values a sample has at most (Go's heap profile has four).
pub const MAX_VALUES: usize = 4;

/// Samples aggregated over a window, one per distinct
/// (pid, tid, comm, thread name, stack).
#[derive(Clone, Debug)]
pub struct Profile {
    /// The window asked for (open ends clipped to what the store holds).
    pub window: Window,
    /// Samples per second per CPU the sampler ran at.
    pub frequency: u64,
    /// Mean bytes between sampled allocations (0: every one recorded).
    pub alloc_interval: u64,
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
    /// amounts (waited nanoseconds, allocated bytes) for the others: the
    /// type's [`ViewValue`], scaled as its pprof values are. A value a
    /// sample takes away (a free) adds nothing to a view.
    pub fn value(&self, sample: &SymbolizedSample) -> u64 {
        let column = match self.profile_type.describe().views_count {
            ViewValue::Count => 0,
            ViewValue::Amount => 1,
        };
        u64::try_from(self.values(sample)[column]).unwrap_or(0)
    }

    /// The sample's pprof values, in its type's order (the first
    /// `sample_types().len()` are used), as recorded: see [`Profile::scaled`].
    pub fn raw_values(&self, sample: &SymbolizedSample) -> [i64; MAX_VALUES] {
        let mut values = [0; MAX_VALUES];
        let (count, amount) = (to_i64(sample.count), to_i64(sample.amount));
        for (value, adds) in values.iter_mut().zip(sample.kind.describe().values) {
            *value = match adds {
                Value::Count => count,
                Value::Amount => amount,
                Value::LessCount => -count,
                Value::LessAmount => -amount,
                Value::Nothing => 0,
            };
        }
        values
    }

    /// Recorded values (of one sample, or of samples merged) as the
    /// profile's type scales them.
    pub fn scaled(&self, values: [i64; MAX_VALUES]) -> [i64; MAX_VALUES] {
        match self.profile_type.describe().scale {
            Scale::None => values,
            Scale::SampledBytes => scale_pairs(values, self.alloc_interval),
        }
    }

    /// The sample's values, scaled.
    pub fn values(&self, sample: &SymbolizedSample) -> [i64; MAX_VALUES] {
        self.scaled(self.raw_values(sample))
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

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Scales each (count, bytes) pair of byte-sampled values as Go's
/// runtime/pprof does: a block of average size `a` was sampled with
/// probability 1 - e^(-a/interval), so each sampled one stands for
/// 1 / that many.
pub fn scale_pairs(mut values: [i64; MAX_VALUES], interval: u64) -> [i64; MAX_VALUES] {
    if interval == 0 {
        return values;
    }
    for pair in values.as_chunks_mut::<2>().0 {
        let (count, bytes) = (pair[0], pair[1]);
        if count == 0 || bytes == 0 {
            continue;
        }
        let average = bytes as f64 / count as f64;
        let scale = 1.0 / (1.0 - (-average / interval as f64).exp());
        pair[0] = (count as f64 * scale).round() as i64;
        pair[1] = (bytes as f64 * scale).round() as i64;
    }
    values
}

#[cfg(test)]
mod scale_tests {
    use super::*;

    #[test]
    fn small_blocks_stand_for_many_and_huge_ones_for_themselves() {
        // 1 KiB blocks at a 512 KiB interval: each sample stands for ~512.5.
        let scaled = scale_pairs([2, 2048, 0, 0], 512 * 1024);
        assert_eq!(scaled[0], 1025);
        assert_eq!(scaled[1], 1_049_600);
        // A 64 MiB block is always sampled: it stands for itself.
        assert_eq!(
            scale_pairs([1, 64 << 20, 1, 64 << 20], 512 * 1024),
            [1, 64 << 20, 1, 64 << 20]
        );
        assert_eq!(scale_pairs([3, 300, 1, 100], 0), [3, 300, 1, 100]);
    }

    #[test]
    fn negative_pairs_scale_like_positive_ones() {
        assert_eq!(
            scale_pairs([0, 0, -2, -2048], 512 * 1024)[2..],
            [-1025, -1_049_600]
        );
    }
}
