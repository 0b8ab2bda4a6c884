//! Metrics of shared scrapes: how answers were had, the refusals by reason,
//! and the queue and memory in use against their bounds.

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;

use crate::serve::scrape::{ScrapeStats, admission::Refusal};
use crate::telemetry::{gauge, labelled_counters};

pub fn encode(out: &mut DescriptorEncoder, stats: &ScrapeStats) -> fmt::Result {
    labelled_counters(
        out,
        "scrape_answers",
        "Profile answers served, by how they were had: computed, joined while another request computed it, or found kept",
        "source",
        &[
            ("computed", stats.computed),
            ("joined", stats.joined),
            ("cached", stats.cached),
        ],
    )?;
    let refused: Vec<_> = Refusal::REASONS.iter().copied().zip(stats.refused).collect();
    labelled_counters(
        out,
        "scrape_refused",
        "Profile requests refused with 503, by reason (queue_full, timeout, too_large, contended)",
        "reason",
        &refused,
    )?;
    labelled_counters(
        out,
        "scrape_drains",
        "Drains scrapes were answered from: asked for by the request, or shared with requests that arrived together",
        "drain",
        &[("own", stats.drains_own), ("shared", stats.drains_shared)],
    )?;
    let as_i64 = |value: usize| i64::try_from(value).unwrap_or(i64::MAX);
    gauge(
        out,
        "scrapes_running",
        "Profiles being computed now",
        as_i64(stats.running),
    )?;
    gauge(
        out,
        "scrapes_waiting",
        "Profiles waiting for their turn now",
        as_i64(stats.waiting),
    )?;
    gauge(
        out,
        "scrape_memory_reserved_bytes",
        "Memory reserved by the profiles being encoded now (estimated)",
        as_i64(stats.reserved_bytes),
    )?;
    gauge(
        out,
        "scrape_cache_bytes",
        "Bytes of the answers kept for requests that ask for the same",
        as_i64(stats.cache_bytes),
    )?;
    let limits = stats.limits.unwrap_or_default();
    gauge(
        out,
        "scrape_memory_budget_bytes",
        "Memory for encoding and kept answers (scrape_memory_mb)",
        as_i64(limits.memory_bytes),
    )
}
