//! Pyroscope's Push API as published, read independently of the daemon:
//! `push.v1.PushRequest` (api/push/v1/push.proto and types/v1/types.proto
//! of grafana/pyroscope v2.2.1) and the pprof `Profile` it carries
//! (api/google/v1/profile.proto), walked field by field with
//! [`crate::protowire`], and the rules the server applies to what it is
//! sent (see notes/pyroscope-contract.md for where each comes from).

use std::{collections::HashSet, io::Read};

use crate::protowire::{Field, bytes_of, checked, packed_varints, string_of, varint_of};

/// `max_label_names_per_series`, `max_label_name_length`,
/// `max_label_value_length` (pkg/validation/limits.go).
pub const MAX_LABEL_NAMES: usize = 30;
pub const MAX_LABEL_NAME_BYTES: usize = 1024;
pub const MAX_LABEL_VALUE_BYTES: usize = 2048;
/// `max_profile_stacktrace_samples`.
pub const MAX_SAMPLES: usize = 16_000;
/// `ingestion_burst_size_mb`: a larger profile is always refused (429).
pub const MAX_UNCOMPRESSED_PROFILE: usize = 2 << 20;

/// `push.v1.PushRequest`.
#[derive(Clone, Debug)]
pub struct PushRequest {
    pub series: Vec<Series>,
}

/// `push.v1.RawProfileSeries`.
#[derive(Clone, Debug)]
pub struct Series {
    pub labels: Vec<(String, String)>,
    pub samples: Vec<RawSample>,
}

impl Series {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

/// `push.v1.RawSample`.
#[derive(Clone, Debug)]
pub struct RawSample {
    pub raw_profile: Vec<u8>,
    pub id: String,
}

/// Decodes `PushRequest { repeated RawProfileSeries series = 1; }`,
/// `RawProfileSeries { repeated LabelPair labels = 1; repeated RawSample
/// samples = 2; repeated ProfileAnnotation annotations = 3; }`,
/// `LabelPair { string name = 1; string value = 2; }` and
/// `RawSample { bytes raw_profile = 1; string ID = 2; }`; panics on any
/// field the schema does not have.
pub fn decode_push_request(body: &[u8]) -> PushRequest {
    let request = checked("PushRequest", body, &[(1, 2)], &[1]);
    let series = bytes_of(&request, 1)
        .into_iter()
        .map(|series| {
            let fields = checked("RawProfileSeries", series, &[(1, 2), (2, 2), (3, 2)], &[1, 2, 3]);
            assert!(
                bytes_of(&fields, 3).is_empty(),
                "expected no annotations (the Push API drops them), got {}",
                bytes_of(&fields, 3).len()
            );
            let labels = bytes_of(&fields, 1)
                .into_iter()
                .map(|pair| {
                    let pair = checked("LabelPair", pair, &[(1, 2), (2, 2)], &[]);
                    (string_of("LabelPair", &pair, 1), string_of("LabelPair", &pair, 2))
                })
                .collect();
            let samples = bytes_of(&fields, 2)
                .into_iter()
                .map(|sample| {
                    let sample = checked("RawSample", sample, &[(1, 2), (2, 2)], &[]);
                    RawSample {
                        raw_profile: bytes_of(&sample, 1)
                            .first()
                            .map_or_else(Vec::new, |raw| raw.to_vec()),
                        id: string_of("RawSample.ID", &sample, 2),
                    }
                })
                .collect();
            Series { labels, samples }
        })
        .collect();
    PushRequest { series }
}

/// Checks every series-label rule: `__name__="process_cpu"`, a non-empty
/// `service_name`, `hostname`, the `expected` extra labels; no empty value;
/// names as Prometheus's `[a-zA-Z_][a-zA-Z0-9_]*` (valid whether or not the
/// server sanitizes), no `__` name but `__name__` (the server gives the
/// others meanings of its own), within the length limits, at most 30, none
/// twice; no two series with the same label set.
pub fn check_series_labels(request: &PushRequest, hostname: &str, expected: &[(&str, &str)]) {
    assert!(
        !request.series.is_empty(),
        "expected at least one series, got none"
    );
    let mut label_sets = HashSet::new();
    for series in &request.series {
        let labels = &series.labels;
        let shown = format!("{labels:?}");
        assert!(
            labels.len() <= MAX_LABEL_NAMES,
            "expected at most {MAX_LABEL_NAMES} labels per series, got {}: {shown}",
            labels.len()
        );
        let mut names = HashSet::new();
        for (name, value) in labels {
            assert!(
                names.insert(name.as_str()),
                "expected label {name} once in {shown}"
            );
            assert!(
                is_prometheus_label_name(name),
                "expected label names matching [a-zA-Z_][a-zA-Z0-9_]*, got {name:?} in {shown}"
            );
            assert!(
                !name.starts_with("__") || name == "__name__",
                "expected no reserved `__` label but __name__, got {name} in {shown}"
            );
            assert!(
                !value.is_empty(),
                "expected no empty label value, got {name}=\"\" in {shown}"
            );
            assert!(
                name.len() <= MAX_LABEL_NAME_BYTES && value.len() <= MAX_LABEL_VALUE_BYTES,
                "expected names of at most {MAX_LABEL_NAME_BYTES} bytes and values of at most {MAX_LABEL_VALUE_BYTES}, got {name}={value:?}"
            );
        }
        assert_eq!(
            series.label("__name__"),
            Some("process_cpu"),
            "expected __name__=\"process_cpu\" in {shown}"
        );
        assert!(
            series.label("service_name").is_some_and(|name| !name.is_empty()),
            "expected a non-empty service_name in {shown}"
        );
        assert_eq!(
            series.label("hostname"),
            Some(hostname),
            "expected hostname={hostname:?} in {shown}"
        );
        for (name, value) in expected {
            assert_eq!(
                series.label(name),
                Some(*value),
                "expected {name}={value:?} in {shown}"
            );
        }
        let mut set = labels.clone();
        set.sort();
        assert!(
            label_sets.insert(set),
            "expected no two series with the same labels, got {shown} twice"
        );
    }
}

fn is_prometheus_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `RawSample.ID`: optional; when set, a UUID (the server logs it as one).
pub fn check_sample_id(id: &str) {
    if id.is_empty() {
        return;
    }
    let groups: Vec<&str> = id.split('-').collect();
    let lengths: Vec<usize> = groups.iter().map(|group| group.len()).collect();
    assert!(
        lengths == [8, 4, 4, 4, 12] && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-'),
        "expected RawSample.ID empty or a UUID, got {id:?}"
    );
}

/// Gunzips a `raw_profile`, which must be gzip (as Go and Alloy send; the
/// server reads a short plain payload as a broken gzip).
pub fn gunzip_profile(raw_profile: &[u8]) -> Vec<u8> {
    assert!(
        raw_profile.starts_with(&[0x1f, 0x8b]),
        "expected raw_profile to be gzip (1f 8b), got {} bytes starting {:02x?}",
        raw_profile.len(),
        &raw_profile[..raw_profile.len().min(4)]
    );
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(raw_profile)
        .read_to_end(&mut plain)
        .unwrap_or_else(|err| panic!("expected raw_profile to gunzip: {err}"));
    plain
}

/// What [`check_pprof`] read of a profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProfileTimes {
    pub time_nanos: i64,
    pub duration_nanos: i64,
}

/// Checks an uncompressed pprof `Profile` against what the server
/// validates (pkg/validation/validate.go `ValidateProfile`, pkg/pprof
/// `Normalize`): string_table[0] == "" and every string UTF-8 and in range,
/// sample types whose type has no `-`, `period_type` set, every sample with
/// one value per sample type and no label with a string value, location
/// and function ids not 0, at most 16000 samples; returns its times.
pub fn check_pprof(profile: &[u8]) -> ProfileTimes {
    // Profile: sample_type 1, sample 2, mapping 3, location 4, function 5,
    // string_table 6, drop_frames 7, keep_frames 8, time_nanos 9,
    // duration_nanos 10, period_type 11, period 12, comment 13,
    // default_sample_type 14, doc_url 15.
    let allowed = [
        (1, 2),
        (2, 2),
        (3, 2),
        (4, 2),
        (5, 2),
        (6, 2),
        (7, 0),
        (8, 0),
        (9, 0),
        (10, 0),
        (11, 2),
        (12, 0),
        (13, 0),
        (13, 2),
        (14, 0),
        (15, 0),
    ];
    let fields = checked("pprof Profile", profile, &allowed, &[1, 2, 3, 4, 5, 6, 13]);
    let strings: Vec<String> = bytes_of(&fields, 6)
        .into_iter()
        .map(|bytes| {
            String::from_utf8(bytes.to_vec())
                .unwrap_or_else(|err| panic!("expected pprof strings to be UTF-8: {err}"))
        })
        .collect();
    assert_eq!(
        strings.first().map(String::as_str),
        Some(""),
        "expected string_table[0] == \"\""
    );
    let string = |index: u64| -> &str {
        strings
            .get(usize::try_from(index).unwrap_or(usize::MAX))
            .unwrap_or_else(|| panic!("expected string index {index} within {} strings", strings.len()))
    };
    let value_type = |bytes: &[u8]| -> (String, String) {
        let fields = checked("pprof ValueType", bytes, &[(1, 0), (2, 0)], &[]);
        (
            string(varint_of(&fields, 1)).to_owned(),
            string(varint_of(&fields, 2)).to_owned(),
        )
    };
    let sample_types: Vec<(String, String)> = bytes_of(&fields, 1).into_iter().map(value_type).collect();
    assert!(
        !sample_types.is_empty(),
        "expected sample types, got none (an empty profile)"
    );
    for (r#type, _) in &sample_types {
        assert!(!r#type.contains('-'), "expected no `-` in sample type {type:?}");
    }
    let period_type = bytes_of(&fields, 11);
    assert_eq!(
        period_type.len(),
        1,
        "expected period_type set (the server dereferences it)"
    );
    let samples = bytes_of(&fields, 2);
    assert!(
        samples.len() <= MAX_SAMPLES,
        "expected at most {MAX_SAMPLES} samples, got {}",
        samples.len()
    );
    for sample in samples {
        check_sample(sample, sample_types.len(), &string);
    }
    for (kind, number) in [("location", 4), ("function", 5), ("mapping", 3)] {
        for message in bytes_of(&fields, number) {
            let fields: Vec<Field> = crate::protowire::fields(message)
                .unwrap_or_else(|err| panic!("expected a valid pprof {kind}: {err}"));
            assert_ne!(
                varint_of(&fields, 1),
                0,
                "expected every {kind} id to be non-zero"
            );
        }
    }
    let signed = |number| i64::try_from(varint_of(&fields, number)).unwrap_or(i64::MAX);
    ProfileTimes {
        time_nanos: signed(9),
        duration_nanos: signed(10),
    }
}

fn check_sample<'s>(sample: &[u8], values: usize, string: &impl Fn(u64) -> &'s str) {
    // Sample: location_id 1, value 2 (packed or not), label 3.
    let fields = checked(
        "pprof Sample",
        sample,
        &[(1, 0), (1, 2), (2, 0), (2, 2), (3, 2)],
        &[1, 2, 3],
    );
    let value = packed_varints(&fields, 2).unwrap_or_else(|err| panic!("expected sample values: {err}"));
    assert_eq!(
        value.len(),
        values,
        "expected one value per sample type in every sample, got {value:?}"
    );
    for label in bytes_of(&fields, 3) {
        // Label: key 1, str 2, num 3, num_unit 4.
        let label = checked("pprof Label", label, &[(1, 0), (2, 0), (3, 0), (4, 0)], &[]);
        let key = string(varint_of(&label, 1));
        assert_eq!(
            varint_of(&label, 2),
            0,
            "expected no string sample label (Pyroscope makes series of them), got {key}={:?}",
            string(varint_of(&label, 2))
        );
    }
}
