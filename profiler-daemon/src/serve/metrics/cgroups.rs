//! Metrics of naming the samples' cgroups.

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;

use super::{counter, gauge};
use crate::cgroup::CgroupStats;

pub fn encode(out: &mut DescriptorEncoder, stats: CgroupStats) -> fmt::Result {
    gauge(
        out,
        "cgroups_named",
        "Cgroups whose paths are known (removed ones included, within the memory bound)",
        i64::try_from(stats.known).unwrap_or(i64::MAX),
    )?;
    counter(
        out,
        "cgroup_walks",
        "Walks of the cgroup v2 hierarchy for ids no process announced",
        stats.walks,
    )?;
    counter(
        out,
        "cgroup_walks_truncated",
        "Walks stopped by their directory or depth bound",
        stats.walks_truncated,
    )?;
    counter(
        out,
        "cgroup_unresolved",
        "Sampled cgroup ids that could not be named (once per drain each); their samples have no cgroup label",
        stats.unresolved,
    )?;
    counter(
        out,
        "cgroup_names_evicted",
        "Cgroup names forgotten to stay within the memory bound",
        stats.evicted,
    )
}
