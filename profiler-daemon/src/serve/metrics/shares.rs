//! What each owner lost to the bounds of shared resources (issue 30), by
//! uid and reason: counts only, no name, path or stack of anyone.

use std::fmt;

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter},
};

/// A counter family labelled `uid` and `reason`; `series` holds (uid label,
/// index into `reasons`, count).
pub fn encode_losses(
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
