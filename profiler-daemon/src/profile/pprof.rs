//! pprof (`profile.proto`) encoding of a [`Profile`], gzipped as served.
//!
//! Conventions followed (see the project notes on pprof): sample types from
//! the profile's type ([`crate::kind::ProfileType::sample_types`]): `[samples/count,
//! cpu/nanoseconds]` for CPU, `[events/count, off_cpu/nanoseconds]` for
//! off-CPU, `[samples/count, wall/nanoseconds]` for wall; ids 1..N in table
//! order (Parca rejects anything else), `string_table[0] == ""`, locations
//! leaf first, lines innermost first, and string labels `pid`, `comm`,
//! `thread_id`, `thread_name` on every sample; `wait` (`blocked` or
//! `runnable`) on off-CPU samples; `cgroup`, `unit`, `container_id` and
//! `ns_pid` on the samples that have one.
//!
//! The period: a CPU profile's is the sampling period (`cpu/nanoseconds`,
//! 1e9 / frequency). Waits have none (each is timed whole), so off-CPU and
//! wall profiles say `period_type` = their time value, `period` = 1 ns.

mod builder;
pub mod proto;

use std::io::Write;

use flate2::{Compression, write::GzEncoder};
use prost::Message;

use std::{collections::HashMap, sync::Arc};

use super::Profile;
use crate::{
    kind::{Period, Value},
    symbolize::SymbolizedSample,
};
use builder::Builder;

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// Which labels each sample carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleLabels {
    /// Every label the sample has: what readers of this daemon get.
    All,
    /// `pid` and `comm` only.
    Process,
    /// None (a backend that would make series of them).
    None,
}

/// The protobuf bytes of `profile`, uncompressed.
pub fn encode(profile: &Profile) -> Vec<u8> {
    build(profile).encode_to_vec()
}

/// The gzip-compressed protobuf, as pprof clients expect on the wire and in files.
pub fn encode_gzip(profile: &Profile) -> std::io::Result<Vec<u8>> {
    gzip(&encode(profile))
}

/// As [`encode_gzip`], with only the sample labels `labels` keeps.
pub fn encode_gzip_with(profile: &Profile, labels: SampleLabels) -> std::io::Result<Vec<u8>> {
    gzip(&build_with(profile, labels).encode_to_vec())
}

/// Gzips encoded protobuf bytes as served.
pub fn gzip_bytes(raw: &[u8]) -> std::io::Result<Vec<u8>> {
    gzip(raw)
}

fn gzip(raw: &[u8]) -> std::io::Result<Vec<u8>> {
    // The fastest level, as Go's runtime/pprof: it compresses profiles about
    // 4x at a fraction of the default level's CPU cost, which dominates a
    // large scrape.
    let mut encoder = GzEncoder::new(Vec::with_capacity(raw.len() / 3 + 64), Compression::fast());
    encoder.write_all(raw)?;
    encoder.finish()
}

/// Nanoseconds between two samples of one CPU: pprof's `period`.
pub fn period_nanos(frequency: u64) -> i64 {
    to_i64(NANOS_PER_SECOND / frequency.max(1))
}

/// The pprof message for `profile`.
pub fn build(profile: &Profile) -> proto::Profile {
    build_with(profile, SampleLabels::All)
}

/// The pprof message for `profile`, its samples labelled as `labels` says.
pub fn build_with(profile: &Profile, labels: SampleLabels) -> proto::Profile {
    let columns = 0..profile.profile_type.sample_types().len();
    build_rows(profile, rows(profile), labels, columns)
}

/// A profile's samples as pprof rows: each with its recorded values, those
/// of one stack and thread that the type nets (an allocation's frees) as one.
pub fn rows(profile: &Profile) -> Vec<Row<'_>> {
    merged(profile)
}

/// A pprof sample to be: a sample and its recorded (unscaled) values.
pub type Row<'a> = (&'a SymbolizedSample, [i64; super::MAX_VALUES]);

/// The pprof message of `rows` (samples of `profile`'s type, window and
/// rates, valued as [`rows`] values them) with only the sample types in
/// `columns`: a pushed heap sends its allocations and its live set apart.
pub fn build_rows(
    profile: &Profile,
    rows: Vec<Row<'_>>,
    labels: SampleLabels,
    columns: std::ops::Range<usize>,
) -> proto::Profile {
    let mut builder = Builder::default();
    // `go tool pprof` names a profile after its first mapping: for one
    // program's profile, that is its executable rather than the kernel.
    if let Some(executable) = executable(profile) {
        builder.mapping(executable);
    }
    let description = profile.profile_type.describe();
    let all_types: Vec<proto::ValueType> = description
        .sample_types
        .iter()
        .map(|&(r#type, unit)| proto::ValueType {
            r#type: builder.string(r#type),
            unit: builder.string(unit),
        })
        .collect();
    let (period_type, period) = match description.period {
        Period::SamplingInterval => (all_types[1], period_nanos(profile.frequency)),
        Period::One => (all_types[1], 1),
        Period::AllocationInterval => (
            proto::ValueType {
                r#type: builder.string("space"),
                unit: builder.string("bytes"),
            },
            to_i64(profile.alloc_interval.max(1)),
        ),
    };
    let default_sample_type = description
        .default_sample_type
        .filter(|name| {
            description.sample_types[columns.clone()]
                .iter()
                .any(|(kind, _)| kind == name)
        })
        .map_or(0, |name| builder.string(name));
    let sample_type = all_types[columns.clone()].to_vec();
    let keys = LabelKeys {
        pid: builder.string("pid"),
        comm: builder.string("comm"),
        thread_id: builder.string("thread_id"),
        thread_name: builder.string("thread_name"),
    };

    // Grouped by process and thread so a process's mappings get neighbouring
    // ids; stable, so equal inputs give equal outputs.
    let mut order = rows;
    order.sort_by_key(|(sample, _)| (sample.pid, sample.tid));
    let mut samples = Vec::with_capacity(order.len());
    let some_columns = columns.len() < all_types.len();
    for (sample, values) in order {
        let values = profile.scaled(values);
        let values = &values[columns.clone()];
        // A row with nothing in the columns kept (a heap's allocations in
        // its live set's columns) is no sample.
        if some_columns && values.iter().all(|&value| value <= 0) {
            continue;
        }
        let location_id = builder.stack(&sample.stack);
        let mut label = match labels {
            SampleLabels::All => all_labels(&mut builder, &keys, sample),
            SampleLabels::Process => vec![
                builder.number_label(keys.pid, sample.pid),
                builder.label(keys.comm, &sample.comm),
            ],
            SampleLabels::None => Vec::new(),
        };
        if description.scale == crate::kind::Scale::SampledBytes
            && let Some(pair) = values.as_chunks::<2>().0.iter().find(|pair| pair[0] > 0)
        {
            // Go's heap profiles: the average block size of the sample.
            label.push(proto::Label {
                key: builder.string("bytes"),
                num: pair[1] / pair[0],
                num_unit: builder.string("bytes"),
                ..proto::Label::default()
            });
        }
        samples.push(proto::Sample {
            location_id,
            // Measured time (CPU time, or the time waited), not count × period;
            // what a free takes away from in-use never goes below nothing.
            value: values.iter().map(|&value| value.max(0)).collect(),
            label,
        });
    }

    let window = profile.window;
    proto::Profile {
        sample_type,
        sample: samples,
        mapping: builder.mappings,
        location: builder.locations,
        function: builder.functions,
        string_table: builder.strings,
        // Window times are Unix milliseconds (the store's buckets are drains).
        time_nanos: to_i64(window.start_ms.saturating_mul(1_000_000)),
        duration_nanos: to_i64(window.duration_ms().saturating_mul(1_000_000)),
        period_type: Some(period_type),
        period,
        default_sample_type,
        ..proto::Profile::default()
    }
}

/// The profile's samples with their recorded values: those of one stack
/// and thread that the type nets (an allocation's frees) as one.
fn merged(profile: &Profile) -> Vec<(&SymbolizedSample, [i64; super::MAX_VALUES])> {
    let nets = profile.profile_type.kinds().any(|kind| {
        kind.describe()
            .values
            .iter()
            .any(|value| matches!(value, Value::LessCount | Value::LessAmount))
    });
    if !nets {
        return profile
            .samples
            .iter()
            .map(|sample| (sample, profile.raw_values(sample)))
            .collect();
    }
    let mut index: HashMap<NetKey<'_>, usize> = HashMap::new();
    let mut merged: Vec<(&SymbolizedSample, [i64; super::MAX_VALUES])> = Vec::new();
    for sample in &profile.samples {
        let key = NetKey {
            stack: Arc::as_ptr(&sample.stack),
            pid: sample.pid,
            tid: sample.tid,
            comm: &sample.comm,
            thread_name: &sample.thread_name,
            cgroup: sample.cgroup.as_ref().map(|cgroup| &*cgroup.path),
            ns_pid: sample.ns_pid,
        };
        let values = profile.raw_values(sample);
        match index.get(&key) {
            Some(&at) => {
                for (total, value) in merged[at].1.iter_mut().zip(values) {
                    *total += value;
                }
            }
            None => {
                index.insert(key, merged.len());
                merged.push((sample, values));
            }
        }
    }
    // A stack with nothing to show in these values (only lifetimes, or
    // allocations all freed and none in the window) is no sample.
    merged.retain(|(_, values)| values.iter().any(|&value| value > 0));
    merged
}

/// What makes samples one in a netted profile: all but their kind.
#[derive(PartialEq, Eq, Hash)]
struct NetKey<'a> {
    stack: *const crate::symbolize::SymbolizedStack,
    pid: u32,
    tid: u32,
    comm: &'a str,
    thread_name: &'a str,
    cgroup: Option<&'a str>,
    ns_pid: Option<u32>,
}

/// The executable of a profile of one program (every sample of one process
/// name): the mapping holding the outermost user frame of most samples,
/// where `_start` and `main` are. None for a profile of several programs.
fn executable(profile: &Profile) -> Option<&crate::symbolize::Mapping> {
    let first = profile.samples.first()?;
    if profile.samples.iter().any(|sample| sample.comm != first.comm) {
        return None;
    }
    let mut weights: Vec<(&crate::symbolize::Mapping, u64)> = Vec::new();
    for sample in &profile.samples {
        let outermost = sample
            .stack
            .locations
            .iter()
            .rev()
            .find(|location| location.kind == crate::symbolize::FrameKind::User)
            .and_then(|location| location.mapping.as_deref());
        let Some(mapping) = outermost else { continue };
        match weights.iter_mut().find(|(seen, _)| *seen == mapping) {
            Some((_, weight)) => *weight += sample.count,
            None => weights.push((mapping, sample.count)),
        }
    }
    weights
        .into_iter()
        .max_by_key(|&(_, weight)| weight)
        .map(|(mapping, _)| mapping)
}

/// Every label of a sample, as this daemon serves them.
fn all_labels<'a>(
    builder: &mut Builder<'a>,
    keys: &LabelKeys,
    sample: &'a SymbolizedSample,
) -> Vec<proto::Label> {
    let mut label = vec![
        builder.number_label(keys.pid, sample.pid),
        builder.label(keys.comm, &sample.comm),
        builder.number_label(keys.thread_id, sample.tid),
        builder.label(keys.thread_name, &sample.thread_name),
    ];
    if let Some(wait) = sample.kind.wait_label() {
        let key = builder.string("wait");
        label.push(builder.label(key, wait));
    }
    // Keys interned when first used: profiles without them stay as they were.
    if let Some(cgroup) = &sample.cgroup {
        let key = builder.string("cgroup");
        label.push(builder.label(key, &cgroup.path));
        if let Some(unit) = &cgroup.unit {
            let key = builder.string("unit");
            label.push(builder.label(key, unit));
        }
        if let Some(id) = &cgroup.container_id {
            let key = builder.string("container_id");
            label.push(builder.label(key, id));
        }
    }
    if let Some(ns_pid) = sample.ns_pid {
        let key = builder.string("ns_pid");
        label.push(builder.number_label(key, ns_pid));
    }
    label
}

pub(crate) fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

struct LabelKeys {
    pid: i64,
    comm: i64,
    thread_id: i64,
    thread_name: i64,
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod type_tests;
