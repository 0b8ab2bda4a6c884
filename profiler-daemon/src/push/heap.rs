//! Memory profiles pushed for the processes traced while the daemon runs
//! (`[allocations]` targets), as Go programs push their heap: each window
//! says what the processes allocated in it (`alloc_objects`,
//! `alloc_space`) and what they held at its end (`inuse_objects`,
//! `inuse_space`: allocated since tracing began and not freed), under the
//! name both backends give heaps, `memory`.
//!
//! The two halves are different quantities, and each backend is told so
//! its way:
//! - Pyroscope gets one profile with the four types and `__delta__="false"`:
//!   without it, it would take the allocations for running totals and
//!   subtract the previous window's (as it does for Go's cumulative heaps);
//! - Parca gets two: the allocations with the window's duration (a delta
//!   profile, `memory:alloc_space:bytes:space:bytes:delta`), the live set
//!   with none (a snapshot at the window's end, `memory:inuse_space:...`),
//!   as it stores the heaps it scrapes.

use std::sync::Arc;

use super::series::{self, Series};
use crate::profile::{
    MAX_VALUES, Profile,
    pprof::{self, SampleLabels, proto},
};

/// The first value of the live set's columns (after the allocations').
const LIVE: usize = 2;

/// The traced processes' memory in one pushed window.
#[derive(Clone, Debug)]
pub struct Heap {
    /// What they allocated in the window (and freed of it).
    pub allocated: Profile,
    /// Since their tracing began, to the window's end: its live set is
    /// what is in use.
    pub live: Profile,
}

/// One service's share of a window's heap.
#[derive(Debug)]
pub struct HeapSeries {
    pub service_name: Arc<str>,
    allocated: Profile,
    live: Profile,
}

/// Splits `heap` per service, as the other types' windows are.
pub fn split(heap: &Heap, labels: SampleLabels) -> Vec<HeapSeries> {
    let allocated = series::split(&heap.allocated, labels);
    let mut live = series::split(&heap.live, labels);
    let mut split: Vec<HeapSeries> = allocated
        .into_iter()
        .map(|one| {
            let at = live
                .iter()
                .position(|other| other.service_name == one.service_name);
            let live = match at {
                Some(at) => live.swap_remove(at).profile,
                None => empty_like(&heap.live),
            };
            HeapSeries {
                service_name: one.service_name,
                allocated: one.profile,
                live,
            }
        })
        .collect();
    // Services that allocated nothing in this window still hold memory.
    split.extend(live.into_iter().map(
        |Series {
             service_name,
             profile,
         }| HeapSeries {
            service_name,
            allocated: empty_like(&heap.allocated),
            live: profile,
        },
    ));
    split
}

fn empty_like(profile: &Profile) -> Profile {
    Profile {
        window: profile.window,
        frequency: profile.frequency,
        alloc_interval: profile.alloc_interval,
        profile_type: profile.profile_type,
        samples: Vec::new(),
    }
}

impl HeapSeries {
    /// For Pyroscope: one profile, allocations and live set side by side.
    pub fn together(&self) -> proto::Profile {
        let mut rows: Vec<pprof::Row<'_>> = only(pprof::rows(&self.allocated), 0..LIVE);
        rows.extend(only(pprof::rows(&self.live), LIVE..MAX_VALUES));
        pprof::build_rows(&self.allocated, rows, SampleLabels::None, 0..MAX_VALUES)
    }

    /// For Parca: the window's allocations (a delta profile), and the live
    /// set at the window's end (a snapshot: no duration); either is None
    /// when it has no sample.
    pub fn apart(&self, labels: SampleLabels) -> [Option<proto::Profile>; 2] {
        let allocated = pprof::build_rows(&self.allocated, pprof::rows(&self.allocated), labels, 0..LIVE);
        let mut live = pprof::build_rows(&self.live, pprof::rows(&self.live), labels, LIVE..MAX_VALUES);
        let end_ns =
            i64::try_from(self.allocated.window.end_ms.saturating_mul(1_000_000)).unwrap_or(i64::MAX);
        live.time_nanos = end_ns;
        live.duration_nanos = 0;
        [allocated, live].map(|profile| (!profile.sample.is_empty()).then_some(profile))
    }

    /// Allocations sampled in the window and blocks live at its end.
    pub fn samples(&self) -> u64 {
        self.allocated.total_samples() + self.live.total_samples()
    }
}

/// `rows` with their values outside `kept` zeroed.
fn only(rows: Vec<pprof::Row<'_>>, kept: std::ops::Range<usize>) -> Vec<pprof::Row<'_>> {
    rows.into_iter()
        .map(|(sample, mut values)| {
            for (column, value) in values.iter_mut().enumerate() {
                if !kept.contains(&column) {
                    *value = 0;
                }
            }
            (sample, values)
        })
        .filter(|(_, values)| values.iter().any(|&value| value > 0))
        .collect()
}

#[cfg(test)]
mod tests;
