//! A profile written in a request's format, and what that costs in memory.

use axum::body::Bytes;

use super::{answers::Answer, key::Format};
use crate::{
    profile::{Profile, pprof},
    serve::{index, threads, views},
    store::Filter,
};

/// Bytes an encoding holds per sample beyond its frames: the profile's own
/// sample (~72), the pprof sample with its four labels and two values
/// (~220), the encoded and compressed bytes, and the allocator's overhead.
const SAMPLE_BYTES: usize = 400;
/// Per frame of a sample's stack: a location id in the sample, and the
/// location, function and line tables a new frame adds, amortized.
const FRAME_BYTES: usize = 24;

/// Writes `profile` as `format` asks; `filter` (normalized) names it in titles.
pub fn render(format: Format, profile: &Profile, filter: &Filter) -> std::io::Result<Answer> {
    let (body, content_type, attachment) = match format {
        Format::Pprof => (pprof::encode_gzip(profile)?, "application/octet-stream", true),
        Format::Threads => (threads::render(profile)?, "application/json", false),
        Format::Folded => (views::render_folded(profile)?, "text/plain; charset=utf-8", false),
        Format::Top { json, limit } => {
            let (body, content_type) = views::render_top(profile, json, limit)?;
            (body, content_type, false)
        }
        Format::Flamegraph { icicle } => (
            views::render_flamegraph(profile, filter, icicle)?,
            "image/svg+xml",
            false,
        ),
        Format::Index { seconds } => (
            index::page(profile, filter, seconds).into_bytes(),
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

/// An upper estimate of the memory rendering `profile` takes at its peak,
/// reserved from the budget before it starts.
pub fn estimate_bytes(profile: &Profile) -> usize {
    profile
        .samples
        .iter()
        .map(|sample| SAMPLE_BYTES + FRAME_BYTES * sample.stack.locations.len())
        .sum()
}
