use std::{io::Read, sync::Arc};

use prost::Message;

use super::*;
use crate::{
    kind::{ProfileType, SampleKind},
    profile::Window,
    profile::pprof::proto,
    symbolize::{SymbolizedSample, SymbolizedStack},
};

fn window_profile() -> Profile {
    let stack = SymbolizedStack::of_one_function;
    let sample =
        |pid: u32, tid: u32, comm: &str, stack: &Arc<SymbolizedStack>, count: u64| SymbolizedSample {
            kind: SampleKind::Cpu,
            pid,
            tid,
            comm: comm.into(),
            readable_by: crate::collect::ReadableBy::User(0),
            thread_name: format!("t{tid}").into(),
            stack: stack.clone(),
            count,
            amount: count * 10_101_010,
            cgroup: None,
            ns_pid: None,
        };
    let (hot, cold) = (stack("hot"), stack("cold"));
    Profile {
        window: Window {
            start_ms: 1_700_000_000_001,
            end_ms: 1_700_000_015_001,
        },
        frequency: 99,
        alloc_interval: 0,
        profile_type: ProfileType::Cpu,
        samples: vec![
            sample(10, 10, "app", &hot, 30),
            sample(10, 11, "app", &hot, 12),
            sample(11, 11, "app", &cold, 3),
            sample(20, 20, "db", &cold, 5),
        ],
    }
}

fn common() -> CommonLabels {
    CommonLabels {
        hostname: "host-1".into(),
        extra: vec![ExtraLabel::new("env", "prod").unwrap()],
    }
}

fn gunzip(bytes: &[u8]) -> proto::Profile {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(bytes).read_to_end(&mut raw).unwrap();
    proto::Profile::decode(raw.as_slice()).unwrap()
}

fn label_pairs(labels: &[LabelPair]) -> Vec<(&str, &str)> {
    labels
        .iter()
        .map(|label| (label.name.as_str(), label.value.as_str()))
        .collect()
}

#[test]
fn pyroscope_gets_a_request_per_service_without_sample_labels() {
    let encoded = encode(Backend::Pyroscope, &[window_profile()], None, &common()).unwrap();
    let counts: Vec<_> = encoded
        .iter()
        .map(|request| (request.samples, request.series))
        .collect();
    assert_eq!(
        counts,
        vec![(45, 1), (5, 1)],
        "one request per series, largest first"
    );
    let request = PushRequest::decode(encoded[0].message.clone()).unwrap();
    assert_eq!(request.series.len(), 1);
    let app = &request.series[0];
    assert_eq!(
        label_pairs(&app.labels),
        vec![
            ("__name__", "process_cpu"),
            ("env", "prod"),
            ("hostname", "host-1"),
            ("service_name", "app"),
        ],
        "expected the series labels sorted by name"
    );
    assert_eq!(app.samples.len(), 1);
    let profile = gunzip(&app.samples[0].raw_profile);
    let names = |index: i64| profile.string_table[index as usize].as_str();
    let types: Vec<_> = profile
        .sample_type
        .iter()
        .map(|t| (names(t.r#type), names(t.unit)))
        .collect();
    assert_eq!(types, vec![("samples", "count"), ("cpu", "nanoseconds")]);
    let period = profile.period_type.unwrap();
    assert_eq!(
        (names(period.r#type), names(period.unit), profile.period),
        ("cpu", "nanoseconds", 10_101_010)
    );
    assert_eq!(profile.time_nanos, 1_700_000_000_001_000_000);
    assert_eq!(profile.duration_nanos, 15_000_000_000);
    assert!(
        profile.sample.iter().all(|sample| sample.label.is_empty()),
        "Pyroscope gets no sample labels"
    );
    let total: i64 = profile.sample.iter().map(|sample| sample.value[0]).sum();
    assert_eq!(total, 45);
    assert_eq!(profile.sample.len(), 2, "threads and processes summed per stack");
}

#[test]
fn parca_requests_keep_the_process_labels() {
    let encoded = encode(Backend::Parca, &[window_profile()], None, &common()).unwrap();
    assert_eq!(encoded.len(), 1, "Parca stores a request whole: one per window");
    assert_eq!((encoded[0].samples, encoded[0].series), (50, 2));
    let request = WriteRawRequest::decode(encoded[0].message.clone()).unwrap();
    assert!(!request.normalized);
    let db = &request.series[1];
    let labels = db.labels.as_ref().unwrap();
    assert_eq!(
        label_pairs(&labels.labels),
        vec![
            ("__name__", "process_cpu"),
            ("env", "prod"),
            ("hostname", "host-1"),
            ("service_name", "db"),
        ]
    );
    let profile = gunzip(&db.samples[0].raw_profile);
    let names = |index: i64| profile.string_table[index as usize].as_str();
    let sample = &profile.sample[0];
    let labels: Vec<_> = sample
        .label
        .iter()
        .map(|label| (names(label.key), names(label.str)))
        .collect();
    assert_eq!(labels, vec![("pid", "20"), ("comm", "db")]);
}

#[test]
fn a_configured_hostname_replaces_the_machines() {
    let common = CommonLabels {
        hostname: "host-1".into(),
        extra: vec![ExtraLabel::new("hostname", "web-1.example.net").unwrap()],
    };
    let labels = series_labels("process_cpu", "app", &common);
    assert_eq!(
        label_pairs(&labels),
        vec![
            ("__name__", "process_cpu"),
            ("hostname", "web-1.example.net"),
            ("service_name", "app")
        ]
    );
}

/// A window's off-CPU profile goes with its CPU profile, under its own name
/// (in the same request for Parca); wall, which is both again, does not.
#[test]
fn every_named_type_is_pushed_under_its_own_name() {
    let cpu = window_profile();
    let mut off_cpu = window_profile();
    off_cpu.profile_type = ProfileType::OffCpu;
    for sample in &mut off_cpu.samples {
        sample.kind = SampleKind::OffCpuBlocked;
    }
    let mut wall = window_profile();
    wall.profile_type = ProfileType::Wall;
    let window = [cpu, off_cpu, wall];
    let names = |labels: &[LabelPair]| {
        labels
            .iter()
            .find(|label| label.name == "__name__")
            .map(|label| label.value.clone())
            .unwrap()
    };

    let parca = encode(Backend::Parca, &window, None, &common()).unwrap();
    assert_eq!(parca.len(), 1, "one request per window, whatever the types");
    assert_eq!((parca[0].samples, parca[0].series), (100, 4));
    let request = WriteRawRequest::decode(parca[0].message.clone()).unwrap();
    let parca_names: Vec<String> = request
        .series
        .iter()
        .map(|series| names(&series.labels.as_ref().unwrap().labels))
        .collect();
    assert_eq!(parca_names, ["process_cpu", "process_cpu", "off_cpu", "off_cpu"]);
    let off_cpu = gunzip(&request.series[2].samples[0].raw_profile);
    let types: Vec<(&str, &str)> = off_cpu
        .sample_type
        .iter()
        .map(|value| {
            (
                off_cpu.string_table[value.r#type as usize].as_str(),
                off_cpu.string_table[value.unit as usize].as_str(),
            )
        })
        .collect();
    assert_eq!(types, [("events", "count"), ("off_cpu", "nanoseconds")]);

    let pyroscope = encode(Backend::Pyroscope, &window, None, &common()).unwrap();
    let pyroscope_names: Vec<String> = pyroscope
        .iter()
        .map(|encoded| names(&PushRequest::decode(encoded.message.clone()).unwrap().series[0].labels))
        .collect();
    assert_eq!(
        pyroscope_names,
        ["process_cpu", "process_cpu", "off_cpu", "off_cpu"]
    );
}
