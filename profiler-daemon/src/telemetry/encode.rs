//! One metric family each, from values read at scrape time (constant
//! metrics: a collector encodes what it read, nothing is kept).

use std::fmt;

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeCounterValue, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

pub fn counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> fmt::Result {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

pub fn float_counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: f64) -> fmt::Result {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

pub fn float_gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: f64) -> fmt::Result {
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

pub fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: i64) -> fmt::Result {
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// A gauge family with one label, a series per value.
pub fn labelled_gauges(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: &[(&str, i64)],
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (value_label, value) in values {
        let labels = [(label, *value_label)];
        ConstGauge::new(*value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A counter family with one label, a series per value (u64 or f64).
pub fn labelled_counters<N: EncodeCounterValue + Copy>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: &[(&str, N)],
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (value_label, value) in values {
        let labels = [(label, *value_label)];
        ConstCounter::new(*value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// What each owner lost to the bound of a shared resource (issue 30, see
/// `crate::shares`): a counter family labelled `uid` and `reason`, counts
/// only, no name, path or stack of anyone. `series` holds (uid label,
/// index into `reasons`, count).
pub fn losses(
    out: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    reasons: &[&str],
    series: &[(String, usize, u64)],
) -> fmt::Result {
    let mut family = out.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (uid, reason, count) in series {
        let Some(reason) = reasons.get(*reason) else {
            continue;
        };
        let labels = [("uid", uid.as_str()), ("reason", *reason)];
        ConstCounter::new(*count).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}
