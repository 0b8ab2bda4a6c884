use std::{io::Read, sync::Arc};

use prost::Message;

use super::*;
use crate::{
    kind::{ProfileType, SampleKind},
    profile::Window,
    push::{
        CommonLabels, encode,
        proto::{PushRequest, WriteRawRequest},
        settings::Backend,
    },
    symbolize::{SymbolizedSample, SymbolizedStack},
};

const START_MS: u64 = 1_700_000_010_001;
const END_MS: u64 = 1_700_000_020_001;

fn stack(name: &str) -> Arc<SymbolizedStack> {
    SymbolizedStack::of_one_function(name)
}

fn sample(kind: SampleKind, stack: &Arc<SymbolizedStack>, count: u64, amount: u64) -> SymbolizedSample {
    SymbolizedSample {
        kind,
        pid: 10,
        tid: 11,
        comm: "app".into(),
        readable_by: crate::collect::ReadableBy::User(0),
        thread_name: "worker".into(),
        stack: stack.clone(),
        count,
        amount,
        cgroup: None,
        ns_pid: None,
    }
}

/// Site `a` allocated 4 blocks (4 KiB) in the window and freed one of
/// them; since tracing began it allocated 10 (10 KiB) and freed 2, and
/// `b` allocated 3 blocks (3000 bytes) before the window and kept them.
fn heap() -> Heap {
    let (a, b) = (stack("a"), stack("b"));
    let profile = |window, samples| Profile {
        window,
        frequency: 99,
        alloc_interval: 0,
        profile_type: ProfileType::Alloc,
        samples,
    };
    Heap {
        allocated: profile(
            Window {
                start_ms: START_MS,
                end_ms: END_MS,
            },
            vec![
                sample(SampleKind::Alloc, &a, 4, 4096),
                sample(SampleKind::AllocFreed, &a, 1, 1024),
            ],
        ),
        live: profile(
            Window {
                start_ms: START_MS - 60_000,
                end_ms: END_MS,
            },
            vec![
                sample(SampleKind::Alloc, &a, 10, 10_240),
                sample(SampleKind::AllocFreed, &a, 2, 2048),
                sample(SampleKind::Alloc, &b, 3, 3000),
            ],
        ),
    }
}

fn common() -> CommonLabels {
    CommonLabels {
        hostname: "host-1".into(),
        extra: Vec::new(),
    }
}

fn gunzip(bytes: &[u8]) -> proto::Profile {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(bytes).read_to_end(&mut raw).unwrap();
    proto::Profile::decode(raw.as_slice()).unwrap()
}

/// Each sample as (its function, its values), sorted.
fn values(profile: &proto::Profile) -> Vec<(String, Vec<i64>)> {
    let mut values: Vec<_> = profile
        .sample
        .iter()
        .map(|sample| {
            let location = &profile.location[sample.location_id[0] as usize - 1];
            let function = &profile.function[location.line[0].function_id as usize - 1];
            (
                profile.string_table[function.name as usize].clone(),
                sample.value.clone(),
            )
        })
        .collect();
    values.sort();
    values
}

fn types(profile: &proto::Profile) -> Vec<&str> {
    profile
        .sample_type
        .iter()
        .map(|t| profile.string_table[t.r#type as usize].as_str())
        .collect()
}

#[test]
fn pyroscope_gets_the_window_allocations_and_the_live_set_as_one_non_delta_profile() {
    let heap = heap();
    let encoded = encode(Backend::Pyroscope, &[], Some(&heap), &common()).unwrap();
    assert_eq!(encoded.len(), 1, "one series: the one service");
    let request = PushRequest::decode(encoded[0].message.clone()).unwrap();
    let series = &request.series[0];
    let labels: Vec<_> = series
        .labels
        .iter()
        .map(|label| (label.name.as_str(), label.value.as_str()))
        .collect();
    assert_eq!(
        labels,
        [
            ("__delta__", "false"),
            ("__name__", "memory"),
            ("hostname", "host-1"),
            ("service_name", "app"),
        ]
    );
    let profile = gunzip(&series.samples[0].raw_profile);
    assert_eq!(
        types(&profile),
        ["alloc_objects", "alloc_space", "inuse_objects", "inuse_space"]
    );
    assert_eq!(
        values(&profile),
        [
            ("a".to_owned(), vec![0, 0, 8, 8192]),
            ("a".to_owned(), vec![4, 4096, 0, 0]),
            ("b".to_owned(), vec![0, 0, 3, 3000]),
        ],
        "allocations from the window, the live set since tracing began"
    );
    assert_eq!(profile.time_nanos, (START_MS * 1_000_000) as i64);
}

#[test]
fn parca_gets_a_delta_profile_of_allocations_and_a_snapshot_of_the_live_set() {
    let heap = heap();
    let encoded = encode(Backend::Parca, &[], Some(&heap), &common()).unwrap();
    assert_eq!(encoded.len(), 1, "Parca stores a request whole: one per window");
    assert_eq!(encoded[0].samples, 5 + 15);
    let request = WriteRawRequest::decode(encoded[0].message.clone()).unwrap();
    assert_eq!(request.series.len(), 2);
    let allocated = gunzip(&request.series[0].samples[0].raw_profile);
    assert_eq!(types(&allocated), ["alloc_objects", "alloc_space"]);
    assert_eq!(values(&allocated), [("a".to_owned(), vec![4, 4096])]);
    assert_eq!(allocated.duration_nanos, 10_000_000_000, "a delta profile");
    let live = gunzip(&request.series[1].samples[0].raw_profile);
    assert_eq!(types(&live), ["inuse_objects", "inuse_space"]);
    assert_eq!(
        values(&live),
        [("a".to_owned(), vec![8, 8192]), ("b".to_owned(), vec![3, 3000])]
    );
    assert_eq!(live.duration_nanos, 0, "a snapshot");
    assert_eq!(
        live.time_nanos,
        (END_MS * 1_000_000) as i64,
        "taken at the window's end"
    );
    assert!(
        live.sample.iter().all(|sample| sample
            .label
            .iter()
            .any(|label| live.string_table[label.key as usize] == "pid"
                && live.string_table[label.str as usize] == "10")),
        "each sample says its process"
    );
}

#[test]
fn a_service_that_allocated_nothing_in_the_window_still_sends_its_live_set() {
    let mut heap = heap();
    heap.allocated.samples.clear();
    let split = split(&heap, SampleLabels::Process);
    assert_eq!(split.len(), 1);
    let [allocated, live] = split[0].apart(SampleLabels::Process);
    assert!(allocated.is_none(), "no allocation: no delta profile");
    assert_eq!(values(&live.unwrap()).len(), 2);
}
