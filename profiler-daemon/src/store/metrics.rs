//! The store's metrics: its size against the bound, the samples through it
//! by fate, and what each owner lost to the bound.
//!
//! The store is an actor; a scrape reads the figures it last published
//! ([`SharedStats`]) rather than asking it over its channel, so that
//! /metrics never waits behind a query being aggregated.

use std::{
    fmt,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
};

use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};

use super::{LOSS_REASONS, StoreLosses, StoreStats};
use crate::telemetry::{Telemetry, gauge, labelled_counters, losses};

/// The store's figures as of its last change, written by the store task
/// only.
#[derive(Debug, Default)]
pub struct SharedStats {
    samples_ingested: AtomicU64,
    samples_expired: AtomicU64,
    samples_evicted: AtomicU64,
    bytes: AtomicU64,
    buckets: AtomicU64,
    stacks: AtomicU64,
    /// Locked only to replace them (when they changed) or copy them out,
    /// never across anything else.
    losses: Mutex<StoreLosses>,
}

impl SharedStats {
    pub(super) fn publish(&self, stats: &StoreStats) {
        self.samples_ingested.store(stats.samples_ingested, Relaxed);
        self.samples_expired.store(stats.samples_expired, Relaxed);
        self.samples_evicted.store(stats.samples_evicted, Relaxed);
        self.bytes.store(stats.bytes as u64, Relaxed);
        self.buckets.store(stats.buckets as u64, Relaxed);
        self.stacks.store(stats.stacks as u64, Relaxed);
        // A poisoned lock only means a panic elsewhere mid-copy: the counts stand.
        let mut losses = self
            .losses
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Losses change only when the store is full: most publishes copy nothing.
        if *losses != stats.losses {
            losses.clone_from(&stats.losses);
        }
    }

    /// (uid label, reason, count): see [`LOSS_REASONS`].
    fn loss_series(&self) -> Vec<(String, usize, u64)> {
        self.losses
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .series()
    }
}

/// Registers the store's collector over the figures its store publishes.
pub fn register(telemetry: &mut Telemetry, stats: Arc<SharedStats>) {
    telemetry.register_collector(StoreMetrics(stats));
}

#[derive(Debug)]
struct StoreMetrics(Arc<SharedStats>);

impl Collector for StoreMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let stats = &self.0;
        let out = &mut encoder;
        let as_i64 = |value: &AtomicU64| i64::try_from(value.load(Relaxed)).unwrap_or(i64::MAX);
        gauge(
            out,
            "store_bytes",
            "Approximate memory held by the sample store",
            as_i64(&stats.bytes),
        )?;
        gauge(
            out,
            "store_buckets",
            "Buckets (drains) held by the sample store",
            as_i64(&stats.buckets),
        )?;
        gauge(
            out,
            "store_stacks",
            "Distinct stacks held by the sample store",
            as_i64(&stats.stacks),
        )?;
        labelled_counters(
            out,
            "store_samples",
            "Samples through the store, by fate",
            "fate",
            &[
                ("ingested", stats.samples_ingested.load(Relaxed)),
                ("expired", stats.samples_expired.load(Relaxed)),
                ("evicted", stats.samples_evicted.load(Relaxed)),
            ],
        )?;
        losses(
            out,
            "store_losses",
            "Samples an owner lost to the store's bound, by uid (\"privileged\": root and unknown owners) and reason: \
             over_share (its oldest, while over its share of a full store), store_full (the oldest drain, nobody over \
             their share), refused (no room left for it)",
            &LOSS_REASONS,
            &stats.loss_series(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{
        Store, StoreConfig,
        tests::{sample, stack},
    };

    /// What /metrics shows of the store is what the store counted, read
    /// without asking it.
    #[test]
    fn a_scrape_reads_what_the_store_last_published() {
        let mut store = Store::new(
            StoreConfig {
                // Room for a few entries: the later ones evict the earlier.
                max_bytes: 2048,
                ..StoreConfig::default()
            },
            99,
        );
        let mut telemetry = Telemetry::new();
        register(&mut telemetry, store.shared_stats());
        for second in 0..20 {
            let samples: Vec<_> = (0..4)
                .map(|pid| {
                    let function = format!("f{second}_{pid}");
                    sample(pid, pid, "worker", &stack(&[function.as_str()]), 3)
                })
                .collect();
            store.ingest(1_000_000 + second * 1000, &samples);
        }
        let stats = store.stats();
        assert!(
            !stats.losses.series().is_empty(),
            "the bound was reached: {stats:?}"
        );
        let text = telemetry.encode().expect("encoding");
        let mut expected = vec![
            format!("profilerd_store_bytes {}", stats.bytes),
            format!("profilerd_store_buckets {}", stats.buckets),
            format!("profilerd_store_stacks {}", stats.stacks),
            format!(
                "profilerd_store_samples_total{{fate=\"ingested\"}} {}",
                stats.samples_ingested
            ),
            format!(
                "profilerd_store_samples_total{{fate=\"evicted\"}} {}",
                stats.samples_evicted
            ),
        ];
        for (uid, reason, count) in stats.losses.series() {
            expected.push(format!(
                "profilerd_store_losses_total{{uid=\"{uid}\",reason=\"{}\"}} {count}",
                LOSS_REASONS[reason]
            ));
        }
        for line in expected {
            assert!(text.lines().any(|got| got == line), "{line} in:\n{text}");
        }
    }
}
