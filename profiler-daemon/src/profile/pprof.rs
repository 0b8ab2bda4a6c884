//! pprof (`profile.proto`) encoding of a [`Profile`], gzipped as served.
//!
//! Conventions followed (see the project notes on pprof): sample types from
//! the profile's type ([`ProfileType::sample_types`]): `[samples/count,
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

use super::Profile;
use crate::kind::ProfileType;
use builder::Builder;

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// The protobuf bytes of `profile`, uncompressed.
pub fn encode(profile: &Profile) -> Vec<u8> {
    build(profile).encode_to_vec()
}

/// The gzip-compressed protobuf, as pprof clients expect on the wire and in files.
pub fn encode_gzip(profile: &Profile) -> std::io::Result<Vec<u8>> {
    let raw = encode(profile);
    // The fastest level, as Go's runtime/pprof: it compresses profiles about
    // 4x at a fraction of the default level's CPU cost, which dominates a
    // large scrape.
    let mut encoder = GzEncoder::new(Vec::with_capacity(raw.len() / 3 + 64), Compression::fast());
    encoder.write_all(&raw)?;
    encoder.finish()
}

/// Nanoseconds between two samples of one CPU: pprof's `period`.
pub fn period_nanos(frequency: u64) -> i64 {
    to_i64(NANOS_PER_SECOND / frequency.max(1))
}

/// The pprof message for `profile`.
pub fn build(profile: &Profile) -> proto::Profile {
    let mut builder = Builder::default();
    let [count_type, time_type] =
        profile
            .profile_type
            .sample_types()
            .map(|(r#type, unit)| proto::ValueType {
                r#type: builder.string(r#type),
                unit: builder.string(unit),
            });
    let period = match profile.profile_type {
        ProfileType::Cpu => period_nanos(profile.frequency),
        ProfileType::OffCpu | ProfileType::Wall => 1,
    };
    let sample_type = vec![count_type, time_type];
    let keys = LabelKeys {
        pid: builder.string("pid"),
        comm: builder.string("comm"),
        thread_id: builder.string("thread_id"),
        thread_name: builder.string("thread_name"),
    };

    // Grouped by process and thread so a process's mappings get neighbouring
    // ids; stable, so equal inputs give equal outputs.
    let mut order: Vec<_> = profile.samples.iter().collect();
    order.sort_by_key(|sample| (sample.pid, sample.tid));
    let mut samples = Vec::with_capacity(order.len());
    for sample in order {
        let location_id = builder.stack(&sample.stack);
        let count = to_i64(sample.count);
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
        samples.push(proto::Sample {
            location_id,
            // Measured time (CPU time, or the time waited), not count × period.
            value: vec![count, to_i64(sample.ns)],
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
        period_type: Some(time_type),
        period,
        ..proto::Profile::default()
    }
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
