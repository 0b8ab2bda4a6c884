//! The allocation sites of an allocation profile, as DHAT tabulates its
//! program points: per site (the function that called the allocator), the
//! bytes and blocks allocated, their average size, the bytes still in use
//! at the end of the window, and how long the freed ones lived on average.
//! Estimated from samples, scaled as the pprof values are.

use std::collections::HashMap;

use serde::Serialize;

use super::Profile;
use crate::{kind::SampleKind, symbolize::FrameKind};

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Site {
    /// The function that called the allocator (the stack's leaf).
    pub name: String,
    pub bytes: u64,
    pub blocks: u64,
    pub average_bytes: u64,
    /// Allocated in the window and not freed by its end.
    pub live_bytes: u64,
    pub live_blocks: u64,
    /// Of the blocks freed in the window; None if none was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub average_lifetime_ns: Option<u64>,
}

/// Sites by bytes allocated (then name), at most `limit`.
pub fn sites(profile: &Profile, limit: usize) -> Vec<Site> {
    #[derive(Default)]
    struct Totals {
        values: [i64; super::MAX_VALUES],
        frees: u64,
        lived_ns: u64,
    }
    let mut by_site: HashMap<String, Totals> = HashMap::new();
    for sample in &profile.samples {
        let name = sample
            .stack
            .frames_root_first()
            .filter(|(_, kind, _)| *kind == FrameKind::User)
            .last()
            .map_or_else(|| "[unknown]".to_owned(), |(name, _, _)| name.to_owned());
        let totals = by_site.entry(name).or_default();
        if sample.kind == SampleKind::AllocLifetime {
            totals.frees += sample.count;
            totals.lived_ns += sample.amount;
            continue;
        }
        for (total, value) in totals.values.iter_mut().zip(profile.raw_values(sample)) {
            *total += value;
        }
    }
    let mut sites: Vec<Site> = by_site
        .into_iter()
        .map(|(name, totals)| {
            let [blocks, bytes, live_blocks, live_bytes] =
                profile.scaled(totals.values).map(|value| value.max(0) as u64);
            Site {
                name,
                bytes,
                blocks,
                average_bytes: bytes.checked_div(blocks).unwrap_or(0),
                live_bytes,
                live_blocks,
                average_lifetime_ns: totals.lived_ns.checked_div(totals.frees),
            }
        })
        .filter(|site| site.blocks > 0 || site.average_lifetime_ns.is_some())
        .collect();
    sites.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    sites.truncate(limit);
    sites
}

/// A text table, DHAT's columns.
pub fn table(profile: &Profile, sites: &[Site]) -> String {
    let total: u64 = sites.iter().map(|site| site.bytes).sum();
    let live: u64 = sites.iter().map(|site| site.live_bytes).sum();
    let mut out = format!(
        "# allocation sites (the function calling the allocator), {} allocated, {} still in use at the end of the window\n\
         # estimated from allocations sampled every {} bytes on average (0: every one)\n\
         {:>7} {:>14} {:>11} {:>9} {:>14} {:>12}  {}\n",
        human_bytes(total),
        human_bytes(live),
        profile.alloc_interval,
        "bytes%",
        "bytes",
        "blocks",
        "avg size",
        "live bytes",
        "avg lifetime",
        "site"
    );
    for site in sites {
        let lifetime = site
            .average_lifetime_ns
            .map_or_else(|| "-".to_owned(), |ns| format!("{:.3} ms", ns as f64 / 1e6));
        out.push_str(&format!(
            "{:>6.2}% {:>14} {:>11} {:>9} {:>14} {:>12}  {}\n",
            site.bytes as f64 * 100.0 / total.max(1) as f64,
            site.bytes,
            site.blocks,
            site.average_bytes,
            site.live_bytes,
            lifetime,
            site.name.escape_default()
        ));
    }
    out
}

fn human_bytes(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

#[cfg(test)]
mod tests;
