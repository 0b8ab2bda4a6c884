//! The daemon's own metrics: one registry, built at start-up, into which
//! each stage registers the collectors of its figures as it is built
//! (`collect/metrics.rs`, `symbolize/metrics.rs`, ...). `/metrics` only
//! encodes it ([`Telemetry::encode`]); the text formats are `serve`'s.
//!
//! Most figures are counters a stage keeps anyway (atomics, the BPF maps,
//! the pipeline's status), so a stage registers a [`Collector`] that reads
//! them at scrape time rather than mirroring them into registered metrics.
//! The helpers below encode one family each.

mod encode;

use std::fmt;

use prometheus_client::{collector::Collector, registry::Metric, registry::Registry};

pub use self::encode::{
    counter, float_counter, float_gauge, gauge, labelled_counters, labelled_gauges, losses,
};

/// Every metric name starts with this (`profilerd_samples`).
const PREFIX: &str = "profilerd";

/// The registry every stage registers into. Families are encoded in the
/// order they were registered (registered metrics before collectors), so
/// the order in which the daemon builds its stages is the order of
/// `/metrics`.
#[derive(Debug)]
pub struct Telemetry {
    registry: Registry,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::new()
    }
}

impl Telemetry {
    pub fn new() -> Self {
        Self {
            registry: Registry::with_prefix(PREFIX),
        }
    }

    /// A metric the caller updates itself (e.g. a request counter).
    pub fn register(&mut self, name: &str, help: &str, metric: impl Metric) {
        self.registry.register(name, help, metric);
    }

    /// Figures read at every scrape.
    pub fn register_collector(&mut self, collector: impl Collector) {
        self.registry.register_collector(Box::new(collector));
    }

    /// The whole exposition in OpenMetrics 1.0.0 text, ending in `# EOF`.
    pub fn encode(&self) -> Result<String, fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// Figures a stage keeps but another part publishes (the pipeline sends
/// the drain and symbolize stages' status over one channel), read at scrape
/// time. A closure rather than the publisher's type, so that the stage
/// defining the figures does not depend on the part wiring it.
pub struct Live<T>(Box<dyn Fn() -> T + Send + Sync>);

impl<T> Live<T> {
    pub fn new(read: impl Fn() -> T + Send + Sync + 'static) -> Self {
        Self(Box::new(read))
    }

    pub fn get(&self) -> T {
        (self.0)()
    }
}

impl<T> fmt::Debug for Live<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Live")
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::{encoding::DescriptorEncoder, metrics::counter::Counter};

    use super::*;

    #[derive(Debug)]
    struct Stage(&'static str, Live<u64>);

    impl Collector for Stage {
        fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
            counter(&mut encoder, self.0, "A stage's count", self.1.get())?;
            labelled_gauges(
                &mut encoder,
                &format!("{}_sizes", self.0),
                "Sizes",
                "of",
                &[("a", 1), ("b", -2)],
            )
        }
    }

    /// Stages' families come in the order they registered, after the
    /// metrics registered as such, every name prefixed; collectors read
    /// their figures at each encoding.
    #[test]
    fn the_registry_encodes_in_registration_order() {
        let mut telemetry = Telemetry::new();
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(1));
        let read = seen.clone();
        telemetry.register_collector(Stage(
            "first",
            Live::new(move || read.load(std::sync::atomic::Ordering::Relaxed)),
        ));
        telemetry.register_collector(Stage("second", Live::new(|| 7)));
        let requests: Counter = Counter::default();
        requests.inc();
        telemetry.register("requests", "Requests", requests);
        seen.store(5, std::sync::atomic::Ordering::Relaxed);
        let text = telemetry.encode().expect("encoding");
        let types: Vec<_> = text.lines().filter(|line| line.starts_with("# TYPE")).collect();
        assert_eq!(
            types,
            [
                "# TYPE profilerd_requests counter",
                "# TYPE profilerd_first counter",
                "# TYPE profilerd_first_sizes gauge",
                "# TYPE profilerd_second counter",
                "# TYPE profilerd_second_sizes gauge",
            ]
        );
        for line in [
            "profilerd_requests_total 1",
            "profilerd_first_total 5",
            "profilerd_first_sizes{of=\"b\"} -2",
            "profilerd_second_total 7",
        ] {
            assert!(text.lines().any(|got| got == line), "{line} in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
