//! A profile written in a request's format, and what that costs in memory.

use std::{collections::HashSet, sync::Arc};

use axum::body::Bytes;

use super::{answers::Answer, key::Format};
use crate::{
    kind::Scale,
    profile::Filter,
    profile::{Profile, flamegraph, folded, pprof, sites, top},
    serve::{
        index,
        threads::{self, WindowReport},
    },
    symbolize::Location,
};

// Fitted to the daemon's peak RSS over its RSS before a /pprof of 5k to 12k
// samples (10 to 300 s of a busy 2-CPU machine at 999 Hz, mostly distinct
// stacks, 6 to 12 MiB each): these overestimate it by 1.2x to 1.6x.
/// Bytes an encoding holds per sample beyond its frames: the profile's own
/// sample (~72), the pprof sample with its four labels and two values
/// (~250), its share of the encoded and compressed bytes, and the
/// allocator's overhead.
const SAMPLE_BYTES: usize = 600;
/// Per frame of a sample: its location id (8), and in the encoded bytes.
const SAMPLE_FRAME_BYTES: usize = 16;
/// Per frame of a distinct stack: what a new frame adds to the location,
/// function and string tables and the builder's indexes of them (distinct
/// stacks share most frames, so this is an upper bound).
const STACK_FRAME_BYTES: usize = 48;

/// Per frame of a distinct stack copied without kernel addresses: the
/// location, and the copy's share of the index of copies.
const COPIED_FRAME_BYTES: usize = size_of::<Location>() + 8;

/// Per entry of the store a query reads: its slot in the aggregation (~40)
/// and the profile's sample (~72, as if every entry were distinct), with the
/// allocator's overhead.
const QUERY_ENTRY_BYTES: usize = 160;

/// The memory a query of `entries` stored entries takes at most.
pub fn query_bytes(entries: usize) -> usize {
    entries.saturating_mul(QUERY_ENTRY_BYTES)
}

/// Writes `profile` as `format` asks; `filter` (normalized) names it in titles.
pub fn render(format: Format, profile: &Profile, filter: &Filter) -> std::io::Result<Answer> {
    let (body, content_type, attachment) = match format {
        Format::Pprof => (pprof::encode_gzip(profile)?, "application/octet-stream", true),
        Format::Threads => (render_threads(profile)?, "application/json", false),
        Format::Folded => (render_folded(profile)?, "text/plain; charset=utf-8", false),
        Format::Top { json, limit } => {
            let (body, content_type) = render_top(profile, json, limit)?;
            (body, content_type, false)
        }
        Format::Flamegraph { icicle } => (
            render_flamegraph(profile, filter, icicle)?,
            "image/svg+xml",
            false,
        ),
        Format::Index { span, kinds } => (
            index::page(profile, filter, span, kinds).into_bytes(),
            "text/html; charset=utf-8",
            false,
        ),
    };
    Ok(Answer {
        body: Bytes::from(body),
        content_type,
        attachment,
    })
}

/// `/top?format=json`.
#[derive(serde::Serialize)]
struct TopReport {
    window: WindowReport,
    /// `cpu`, `offcpu` or `wall`.
    #[serde(rename = "type")]
    profile_type: &'static str,
    /// What `self` and `total` count: `samples` or `ns`.
    unit: &'static str,
    functions: Vec<top::FunctionCost>,
}

/// The SVG of `/flamegraph.svg`.
fn render_flamegraph(profile: &Profile, filter: &Filter, icicle: bool) -> std::io::Result<Vec<u8>> {
    let title = flamegraph::title(profile.profile_type, filter, &profile.window);
    let mut out = Vec::new();
    flamegraph::write(profile, &title, icicle, &mut out)?;
    Ok(out)
}

/// `/top?type=alloc&format=json`.
#[derive(serde::Serialize)]
struct SitesReport {
    window: WindowReport,
    #[serde(rename = "type")]
    profile_type: &'static str,
    /// Mean bytes between sampled allocations (0: every one recorded).
    sample_bytes: u64,
    sites: Vec<sites::Site>,
}

/// The body and type of `/top`: functions, or for allocations their sites.
fn render_top(profile: &Profile, json: bool, limit: usize) -> std::io::Result<(Vec<u8>, &'static str)> {
    if profile.profile_type.describe().scale == Scale::SampledBytes {
        let sites = sites::sites(profile, limit);
        if json {
            let report = SitesReport {
                window: profile.window.into(),
                profile_type: profile.profile_type.name(),
                sample_bytes: profile.alloc_interval,
                sites,
            };
            return Ok((serde_json::to_vec(&report)?, "application/json"));
        }
        return Ok((
            sites::table(profile, &sites).into_bytes(),
            "text/plain; charset=utf-8",
        ));
    }
    let functions = top::top(profile, limit);
    if json {
        let report = TopReport {
            window: profile.window.into(),
            profile_type: profile.profile_type.name(),
            unit: profile.value_unit(),
            functions,
        };
        return Ok((serde_json::to_vec(&report)?, "application/json"));
    }
    Ok((
        top::table(profile, &functions).into_bytes(),
        "text/plain; charset=utf-8",
    ))
}

/// The text of `/folded`.
fn render_folded(profile: &Profile) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    folded::write(profile, &mut out)?;
    Ok(out)
}

/// The JSON of `/threads`.
fn render_threads(profile: &Profile) -> std::io::Result<Vec<u8>> {
    Ok(serde_json::to_vec(&threads::report(profile))?)
}

/// An upper estimate of the memory rendering `profile` takes at its peak,
/// reserved from the budget before it starts. Without `kernel_addresses`
/// each distinct stack is copied first (see [`Profile::hide_kernel_addresses`]).
pub fn estimate_bytes(profile: &Profile, kernel_addresses: bool) -> usize {
    let copy_frame_bytes = if kernel_addresses { 0 } else { COPIED_FRAME_BYTES };
    // The store interns stacks: samples of one stack share its Arc.
    let mut stacks = HashSet::new();
    profile
        .samples
        .iter()
        .map(|sample| {
            let depth = sample.stack.locations.len();
            let new = stacks.insert(Arc::as_ptr(&sample.stack));
            SAMPLE_BYTES
                + SAMPLE_FRAME_BYTES * depth
                + if new {
                    (STACK_FRAME_BYTES + copy_frame_bytes) * depth
                } else {
                    0
                }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        kind::{ProfileType, SampleKind},
        profile::Window,
        symbolize::{FrameKind, Function, Line, Location, SymbolizedSample, SymbolizedStack},
    };

    fn stack(depth: u64) -> Arc<SymbolizedStack> {
        let function = Arc::new(Function {
            name: "f".into(),
            system_name: "f".into(),
            filename: None,
        });
        Arc::new(SymbolizedStack {
            locations: (0..depth)
                .map(|address| Location {
                    kind: FrameKind::User,
                    address,
                    mapping: None,
                    lines: Arc::from([Line {
                        function: function.clone(),
                        line: 0,
                    }]),
                    resolved: true,
                })
                .collect(),
        })
    }

    fn profile(stacks: &[Arc<SymbolizedStack>]) -> Profile {
        Profile {
            window: Window::ALL,
            frequency: 99,
            alloc_interval: 0,
            profile_type: ProfileType::Cpu,
            samples: stacks
                .iter()
                .enumerate()
                .map(|(tid, stack)| SymbolizedSample {
                    kind: SampleKind::Cpu,
                    pid: 1,
                    tid: tid as u32,
                    comm: "c".into(),
                    readable_by: crate::collect::ReadableBy::User(0),
                    thread_name: "t".into(),
                    stack: stack.clone(),
                    count: 1,
                    amount: 1,
                    cgroup: None,
                    ns_pid: None,
                })
                .collect(),
        }
    }

    #[test]
    fn a_stack_shared_by_samples_counts_its_frames_once() {
        let shared = stack(10);
        let one = estimate_bytes(&profile(std::slice::from_ref(&shared)), true);
        assert_eq!(one, SAMPLE_BYTES + 10 * (SAMPLE_FRAME_BYTES + STACK_FRAME_BYTES));
        let twice = estimate_bytes(&profile(&[shared.clone(), shared.clone()]), true);
        assert_eq!(twice, one + SAMPLE_BYTES + 10 * SAMPLE_FRAME_BYTES);
        let distinct = estimate_bytes(&profile(&[stack(10), stack(10)]), true);
        assert_eq!(distinct, 2 * one);
        assert_eq!(estimate_bytes(&profile(&[]), true), 0);
        // Hiding kernel addresses copies each distinct stack once.
        let copied = estimate_bytes(&profile(&[shared.clone(), shared]), false);
        assert_eq!(copied, twice + 10 * COPIED_FRAME_BYTES);
    }
}
