//! Property tests (bounded: proptest's default 256 cases each) for the two
//! places outside input reaches: query parsing and the pprof encoder.

use std::sync::Arc;

use profilerd::{
    profile::{Profile, pprof},
    serve::params::{Limits, parse_go_profile, parse_pprof},
    store::Window,
    symbolize::{FrameKind, Function, Line, Location, Mapping, SymbolizedSample, SymbolizedStack},
};
use proptest::prelude::*;
use prost::Message;

const LIMITS: Limits = Limits {
    pid_max: 4_194_304,
    max_seconds: 300,
};

/// Query strings: arbitrary bytes, and ones shaped like the real thing.
fn queries() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("pid".to_owned()),
        Just("tid".to_owned()),
        Just("comm".to_owned()),
        Just("seconds".to_owned()),
        "[a-z%=&]{0,6}",
    ];
    let value = prop_oneof![
        "-?[0-9]{0,22}",
        "[0-9,]{0,12}",
        "[a-z0-9%+.e-]{0,12}",
        any::<String>().prop_map(|s| s.chars().take(20).collect()),
    ];
    prop_oneof![
        any::<String>(),
        prop::collection::vec((key, value), 0..6).prop_map(|pairs| {
            pairs
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("&")
        }),
    ]
}

proptest! {
    #[test]
    fn query_parsing_never_panics_and_only_accepts_valid_values(query in queries()) {
        for parsed in [parse_pprof(Some(&query), &LIMITS), parse_go_profile(Some(&query), &LIMITS)] {
            match parsed {
                Ok(params) => {
                    prop_assert!((1..=LIMITS.max_seconds).contains(&params.seconds), "{query:?} -> {params:?}");
                    prop_assert!(params.filter.pids.iter().all(|pid| (1..=LIMITS.pid_max).contains(pid)), "{query:?}");
                    prop_assert!(params.filter.tids.iter().all(|tid| (1..=LIMITS.pid_max).contains(tid)), "{query:?}");
                }
                Err(err) => {
                    let message = err.to_string();
                    prop_assert!(!message.is_empty() && !message.contains('\n'), "one line: {message:?}");
                }
            }
        }
    }
}

fn function() -> impl Strategy<Value = Arc<Function>> {
    (any::<String>(), prop::option::of("[a-z/._]{1,12}")).prop_map(|(name, file)| {
        Arc::new(Function {
            name: name.clone().into(),
            system_name: format!("_Z{name}").into(),
            filename: file.map(Into::into),
        })
    })
}

fn location(mappings: Vec<Arc<Mapping>>) -> impl Strategy<Value = Location> {
    (
        prop::bool::ANY,
        any::<u64>(),
        prop::option::of(prop::sample::select(mappings)),
        prop::collection::vec((function(), any::<u32>()), 1..4),
    )
        .prop_map(|(kernel, address, mapping, lines)| Location {
            kind: if kernel {
                FrameKind::Kernel
            } else {
                FrameKind::User
            },
            address,
            mapping,
            lines: lines
                .into_iter()
                .map(|(function, line)| Line { function, line })
                .collect(),
            resolved: true,
        })
}

fn profiles() -> impl Strategy<Value = Profile> {
    let mappings: Vec<Arc<Mapping>> = (0..3u64)
        .map(|i| {
            Arc::new(Mapping {
                start: i << 20,
                limit: (i + 1) << 20,
                file_offset: 0,
                path: format!("/lib/m{i}.so").into(),
                build_id: (i % 2 == 0).then(|| Arc::from("abcdef")),
            })
        })
        .collect();
    let stack = prop::collection::vec(location(mappings), 0..8).prop_map(|locations| {
        Arc::new(SymbolizedStack {
            locations: locations.into(),
        })
    });
    let sample = (
        any::<u32>(),
        any::<u32>(),
        any::<String>(),
        any::<String>(),
        stack,
        1..1000u64,
        any::<u64>(),
    )
        .prop_map(
            |(pid, tid, comm, thread_name, stack, count, cpu_ns)| SymbolizedSample {
                pid,
                tid,
                comm: comm.into(),
                thread_name: thread_name.into(),
                stack,
                count,
                cpu_ns,
            },
        );
    (
        prop::collection::vec(sample, 0..12),
        any::<u64>(),
        any::<u64>(),
        0..100_000u64,
    )
        .prop_map(|(samples, start_ms, length, frequency)| Profile {
            window: Window {
                start_ms,
                end_ms: start_ms.saturating_add(length),
            },
            frequency,
            samples,
        })
}

proptest! {
    #[test]
    fn every_profile_encodes_to_a_valid_pprof(profile in profiles()) {
        let bytes = pprof::encode(&profile);
        prop_assert!(!bytes.is_empty());
        let decoded = pprof::proto::Profile::decode(bytes.as_slice()).expect("our own encoding decodes");
        let strings = decoded.string_table.len() as i64;
        prop_assert_eq!(decoded.string_table.first().map(String::as_str), Some(""));
        for (index, mapping) in decoded.mapping.iter().enumerate() {
            prop_assert_eq!(mapping.id, index as u64 + 1, "mapping ids run 1..N in order");
        }
        for (index, function) in decoded.function.iter().enumerate() {
            prop_assert_eq!(function.id, index as u64 + 1, "function ids run 1..N in order");
            prop_assert!((0..strings).contains(&function.name) && (0..strings).contains(&function.system_name));
        }
        for (index, location) in decoded.location.iter().enumerate() {
            prop_assert_eq!(location.id, index as u64 + 1, "location ids run 1..N in order");
            prop_assert!(location.mapping_id <= decoded.mapping.len() as u64);
            for line in &location.line {
                prop_assert!(line.function_id >= 1 && line.function_id <= decoded.function.len() as u64);
            }
        }
        prop_assert_eq!(decoded.sample.len(), profile.samples.len());
        for sample in &decoded.sample {
            prop_assert_eq!(sample.value.len(), decoded.sample_type.len());
            for &id in &sample.location_id {
                prop_assert!(id >= 1 && id <= decoded.location.len() as u64);
            }
            for label in &sample.label {
                prop_assert!((0..strings).contains(&label.key) && (0..strings).contains(&label.str));
            }
        }
    }
}
