//! Metrics of pushing, per target (`target="backend URL"`): attempts by
//! outcome, what was accepted, the queue, and the windows given up.

use std::{fmt, sync::Arc};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use super::{TargetSnapshot, TargetStats};
use crate::telemetry::Telemetry;

/// Registers the targets' collector (one per push; without targets there
/// is no push, and no push family on /metrics).
pub fn register(telemetry: &mut Telemetry, targets: Vec<Arc<TargetStats>>) {
    telemetry.register_collector(PushMetrics(targets));
}

#[derive(Debug)]
struct PushMetrics(Vec<Arc<TargetStats>>);

impl Collector for PushMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let targets: Vec<_> = self.0.iter().map(|target| target.snapshot()).collect();
        encode(&mut encoder, &targets)
    }
}

fn encode(out: &mut DescriptorEncoder, targets: &[TargetSnapshot]) -> fmt::Result {
    if targets.is_empty() {
        return Ok(());
    }
    let now_ms = crate::unix_now_ms();
    counters(
        out,
        "push_attempts",
        "Push attempts by target and outcome: accepted, failed (retried later) or refused (dropped)",
        targets,
        |target| {
            vec![
                ("accepted", target.accepted),
                ("failed", target.failed),
                ("refused", target.refused),
            ]
        },
    )?;
    counters(
        out,
        "push_bytes",
        "Request bytes the target accepted",
        targets,
        |target| vec![("", target.bytes)],
    )?;
    counters(
        out,
        "push_samples",
        "Samples in the windows the target accepted",
        targets,
        |target| vec![("", target.samples)],
    )?;
    counters(
        out,
        "push_dropped_windows",
        "Requests given up (a window, or for Pyroscope one series of it), by reason: spool_full (the oldest, past the spool's bound) or refused (by the target)",
        targets,
        |target| {
            vec![
                ("spool_full", target.dropped_full),
                ("refused", target.dropped_refused),
            ]
        },
    )?;
    counters(
        out,
        "push_dropped_samples",
        "Samples in the requests given up",
        targets,
        |target| vec![("", target.dropped_samples)],
    )?;
    float_counters(
        out,
        "push_encode_cpu_seconds",
        "CPU time encoding the windows for the target (shared by targets of one backend: a window is encoded once per backend)",
        targets,
        |target| target.encode_cpu_ns as f64 / 1e9,
    )?;
    int_gauges(
        out,
        "push_queue_windows",
        "Requests waiting to be pushed: one per window, for Pyroscope one per series of a window",
        targets,
        |target| target.queued_windows,
    )?;
    int_gauges(
        out,
        "push_queue_bytes",
        "Bytes of the requests waiting to be pushed (the one being sent included)",
        targets,
        |target| target.queued_bytes,
    )?;
    gauges(
        out,
        "push_oldest_queued_window_age_seconds",
        "Age of the start of the oldest window waiting to be pushed (0 with none)",
        targets,
        |target| match target.oldest_queued_ms {
            0 => 0.0,
            start => now_ms.saturating_sub(start) as f64 / 1000.0,
        },
    )?;
    gauges(
        out,
        "push_last_accepted_timestamp_seconds",
        "When the target last accepted a push (Unix seconds; 0 before the first)",
        targets,
        |target| target.last_accepted_ms as f64 / 1000.0,
    )
}

/// A counter family with a `target` label and, when `values` names them,
/// an `outcome` or `reason` label per value.
fn counters(
    out: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    targets: &[TargetSnapshot],
    values: impl Fn(&TargetSnapshot) -> Vec<(&'static str, u64)>,
) -> fmt::Result {
    let second_label = match name {
        "push_attempts" => "outcome",
        _ => "reason",
    };
    let mut family = out.encode_descriptor(name, help, None, MetricType::Counter)?;
    for target in targets {
        for (value_name, value) in values(target) {
            let counter = ConstCounter::new(value);
            if value_name.is_empty() {
                let labels = [("target", target.name.as_str())];
                counter.encode(family.encode_family(&labels)?)?;
            } else {
                let labels = [("target", target.name.as_str()), (second_label, value_name)];
                counter.encode(family.encode_family(&labels)?)?;
            }
        }
    }
    Ok(())
}

fn int_gauges(
    out: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    targets: &[TargetSnapshot],
    value: impl Fn(&TargetSnapshot) -> u64,
) -> fmt::Result {
    let mut family = out.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for target in targets {
        let labels = [("target", target.name.as_str())];
        ConstGauge::new(i64::try_from(value(target)).unwrap_or(i64::MAX))
            .encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn float_counters(
    out: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    targets: &[TargetSnapshot],
    value: impl Fn(&TargetSnapshot) -> f64,
) -> fmt::Result {
    let mut family = out.encode_descriptor(name, help, None, MetricType::Counter)?;
    for target in targets {
        let labels = [("target", target.name.as_str())];
        ConstCounter::new(value(target)).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn gauges(
    out: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    targets: &[TargetSnapshot],
    value: impl Fn(&TargetSnapshot) -> f64,
) -> fmt::Result {
    let mut family = out.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for target in targets {
        let labels = [("target", target.name.as_str())];
        ConstGauge::new(value(target)).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}
