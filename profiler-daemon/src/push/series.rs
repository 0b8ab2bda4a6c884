//! A window's whole-machine profile (of one type) cut into the series a backend
//! stores, with a bounded number of series and of label values.
//!
//! The rule (README, "Pushing to Pyroscope or Parca"):
//! - a series per service: `service_name` is the process's systemd service
//!   (`nginx.service`) when it runs in one, else its process name (`comm`);
//!   the sessions and scopes users log in with (`session-4.scope`) would
//!   make a series per login, so they count as their process name;
//! - every series carries `__name__` (the type's name in that backend,
//!   `process_cpu` for CPU, `off_cpu` for off-CPU: `kind.rs`), `hostname`
//!   and the configured labels, and nothing else: pids and thread ids, which churn,
//!   never become series labels;
//! - past [`MAX_SERIES`] services in one window, the smallest are pushed
//!   together as `service_name="[other]"`, so one odd window (a build
//!   spawning thousands of short processes) cannot mint thousands of series;
//! - inside a series' profile, Pyroscope gets no sample labels (it would
//!   turn each string label into series labels), Parca gets `pid` and
//!   `comm` (it stores sample labels as columns, not series, as it does for
//!   a scrape of ours); thread ids and names are summed away for both.

use std::{collections::HashMap, sync::Arc};

use super::settings::Backend;
use crate::{
    kind::SampleKind,
    profile::{Profile, pprof::SampleLabels},
    symbolize::{SymbolizedSample, SymbolizedStack},
};

/// Most series in one window's push.
pub const MAX_SERIES: usize = 256;

/// The `service_name` of the services beyond [`MAX_SERIES`].
pub const OTHER_SERVICE: &str = "[other]";

/// One service's share of a window.
#[derive(Clone, Debug)]
pub struct Series {
    pub service_name: Arc<str>,
    pub profile: Profile,
}

/// What a backend keeps of each sample's labels.
pub fn sample_labels(backend: Backend) -> SampleLabels {
    match backend {
        Backend::Pyroscope => SampleLabels::None,
        Backend::Parca => SampleLabels::Process,
    }
}

/// The service a sample is counted under.
pub fn service_name(sample: &SymbolizedSample) -> Arc<str> {
    sample
        .cgroup
        .as_ref()
        .and_then(|cgroup| cgroup.unit.clone())
        .filter(|unit| unit.ends_with(".service"))
        .unwrap_or_else(|| sample.comm.clone())
}

/// Splits `profile` into one series per service, samples merged down to
/// what `labels` keeps, largest services first.
pub fn split(profile: &Profile, labels: SampleLabels) -> Vec<Series> {
    let mut by_service: HashMap<Arc<str>, Merged> = HashMap::new();
    for sample in &profile.samples {
        by_service
            .entry(service_name(sample))
            .or_default()
            .add(sample, labels);
    }
    let mut services: Vec<(Arc<str>, Merged)> = by_service.into_iter().collect();
    // Largest first; equal ones by name, so that equal windows give equal pushes.
    services.sort_by(|(a_name, a), (b_name, b)| b.total.cmp(&a.total).then_with(|| a_name.cmp(b_name)));
    if services.len() > MAX_SERIES {
        let mut other = Merged::default();
        for (_, merged) in services.drain(MAX_SERIES - 1..) {
            for sample in merged.samples.into_values() {
                other.add(&sample, labels);
            }
        }
        services.push((OTHER_SERVICE.into(), other));
    }
    services
        .into_iter()
        .map(|(service_name, merged)| Series {
            service_name,
            profile: Profile {
                window: profile.window,
                frequency: profile.frequency,
                alloc_interval: profile.alloc_interval,
                profile_type: profile.profile_type,
                samples: merged.into_samples(),
            },
        })
        .collect()
}

/// A service's samples, one per (stack, and the process if kept).
#[derive(Default)]
struct Merged {
    /// By stack, process and kind (an allocation's frees stay apart from it).
    samples: HashMap<(*const SymbolizedStack, u32, SampleKind), SymbolizedSample>,
    total: u64,
}

impl Merged {
    fn add(&mut self, sample: &SymbolizedSample, labels: SampleLabels) {
        self.total += sample.count;
        let pid = match labels {
            SampleLabels::Process | SampleLabels::All => sample.pid,
            SampleLabels::None => 0,
        };
        let key = (Arc::as_ptr(&sample.stack), pid, sample.kind);
        match self.samples.get_mut(&key) {
            Some(merged) => {
                merged.count += sample.count;
                merged.amount += sample.amount;
            }
            None => {
                let mut merged = sample.clone();
                // What is summed away is not shown as if it were one thread's.
                merged.tid = 0;
                merged.thread_name = Arc::from("");
                merged.cgroup = None;
                merged.ns_pid = None;
                if labels == SampleLabels::None {
                    // Summed over processes: no process's pid or name (which
                    // would keep an allocation and its free apart).
                    merged.pid = 0;
                    merged.comm = Arc::from("");
                }
                self.samples.insert(key, merged);
            }
        }
    }

    fn into_samples(self) -> Vec<SymbolizedSample> {
        let mut samples: Vec<_> = self.samples.into_values().collect();
        samples.sort_by_key(|sample| (sample.pid, std::cmp::Reverse(sample.count)));
        samples
    }
}

#[cfg(test)]
mod tests;
