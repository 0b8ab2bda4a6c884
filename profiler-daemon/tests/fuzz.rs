//! Property tests (bounded: proptest's default 256 cases each) for the
//! places outside input reaches: query parsing, the pprof encoder and the
//! views (names come from arbitrary processes).

use std::sync::Arc;

use profilerd::{
    kind::{ProfileType, SampleKind},
    profile::Filter,
    profile::{Profile, Window, flamegraph, pprof, top},
    serve::params::{Limits, Span, parse_go_profile, parse_pprof, parse_with_options},
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
        Just("start".to_owned()),
        Just("end".to_owned()),
        Just("limit".to_owned()),
        Just("format".to_owned()),
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
        let strict = parse_pprof(Some(&query), &LIMITS).map(|params| (params.span, params.filter));
        let go = parse_go_profile(Some(&query), &LIMITS, ProfileType::Cpu)
            .map(|params| (Span::Last(params.seconds), params.filter));
        for parsed in [strict, go] {
            match parsed {
                Ok((span, filter)) => {
                    let valid = match span {
                        Span::Last(seconds) => (1..=LIMITS.max_seconds).contains(&seconds),
                        Span::Between(window) => {
                            window.start_ms < window.end_ms && window.duration_ms() <= LIMITS.max_seconds * 1000
                        }
                    };
                    prop_assert!(valid, "{query:?} -> {span:?}");
                    prop_assert!(filter.pids.iter().all(|pid| (1..=LIMITS.pid_max).contains(pid)), "{query:?}");
                    prop_assert!(filter.tids.iter().all(|tid| (1..=LIMITS.pid_max).contains(tid)), "{query:?}");
                }
                Err(err) => {
                    let message = err.to_string();
                    prop_assert!(!message.is_empty() && !message.contains('\n'), "one line: {message:?}");
                }
            }
        }
        match parse_with_options(Some(&query), &LIMITS, &["format", "limit"]) {
            Ok((_, options)) => {
                let mut names: Vec<&str> = options.iter().map(|(name, _)| *name).collect();
                prop_assert!(names.iter().all(|name| ["format", "limit"].contains(name)), "{query:?}");
                names.dedup();
                prop_assert_eq!(names.len(), options.len(), "each option at most once: {:?}", query);
            }
            Err(err) => prop_assert!(!err.to_string().contains('\n')),
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
        prop_oneof![
            Just(SampleKind::Cpu),
            Just(SampleKind::OffCpuBlocked),
            Just(SampleKind::OffCpuRunnable)
        ],
    )
        .prop_map(
            |(pid, tid, comm, thread_name, stack, count, ns, kind)| SymbolizedSample {
                kind,
                pid,
                tid,
                comm: comm.into(),
                readable_by: profilerd::collect::ReadableBy::Privileged,
                thread_name: thread_name.into(),
                stack,
                count,
                amount: ns,
                cgroup: None,
                ns_pid: None,
            },
        );
    (
        prop::collection::vec(sample, 0..12),
        any::<u64>(),
        any::<u64>(),
        0..100_000u64,
        prop_oneof![
            Just(ProfileType::Cpu),
            Just(ProfileType::OffCpu),
            Just(ProfileType::Wall),
            Just(ProfileType::Alloc)
        ],
    )
        .prop_map(|(samples, start_ms, length, frequency, profile_type)| Profile {
            window: Window {
                start_ms,
                end_ms: start_ms.saturating_add(length),
            },
            frequency,
            alloc_interval: frequency,
            profile_type,
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

/// Names a hostile or broken process might carry.
fn hostile_names() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("<script>alert(1)</script>".to_owned()),
        Just("\"><img src=x onerror=alert(1)>".to_owned()),
        Just("a\nb 5".to_owned()),
        Just("a;b\r\n".to_owned()),
        Just(String::new()),
        Just(" ".to_owned()),
        Just("]]><!--".to_owned()),
        "[\\x00-\\x1f;<>&\"' ]{0,8}",
    ]
}

proptest! {
    #[test]
    fn every_profile_renders_as_views(mut profile in profiles(), nasty in hostile_names()) {
        // Real times are bounded by real time; sums of arbitrary u64s would overflow.
        for sample in &mut profile.samples {
            sample.amount %= 1 << 40;
        }
        // any::<String>() has no control characters: add a process that names
        // itself and its function with them.
        let function = Arc::new(Function {
            name: nasty.clone().into(),
            system_name: nasty.clone().into(),
            filename: None,
        });
        profile.samples.push(SymbolizedSample {
            kind: SampleKind::Cpu,
            pid: 1,
            tid: 1,
            comm: nasty.clone().into(),
            readable_by: profilerd::collect::ReadableBy::Privileged,
            thread_name: nasty.into(),
            stack: Arc::new(SymbolizedStack {
                locations: Box::new([Location {
                    kind: FrameKind::User,
                    address: 0,
                    mapping: None,
                    lines: Arc::new([Line { function, line: 0 }]),
                    resolved: true,
                }]),
            }),
            count: 1,
            amount: 1,
            cgroup: None,
            ns_pid: None,
        });
        let costs = top::top(&profile, usize::MAX);
        let with_frames: u64 = profile
            .samples
            .iter()
            .filter(|sample| !sample.stack.locations.is_empty())
            .map(|sample| profile.value(sample))
            .sum();
        prop_assert_eq!(costs.iter().map(|cost| cost.self_value).sum::<u64>(), with_frames);
        for cost in &costs {
            prop_assert!(cost.self_value <= cost.total_value && cost.total_value <= with_frames);
        }
        let table = top::table(&profile, &costs);
        prop_assert_eq!(table.lines().count(), 2 + costs.len(), "one line per function: {}", table);

        let title = flamegraph::title(profile.profile_type, &Filter::default(), &profile.window);
        for icicle in [false, true] {
            let mut svg = Vec::new();
            flamegraph::write(&profile, &title, icicle, &mut svg).expect("every profile renders");
            let svg = String::from_utf8(svg).expect("UTF-8");
            prop_assert!(svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"));
            prop_assert!(!svg.contains("<script>alert") && !svg.contains("<img"), "names are escaped");
            prop_assert!(
                !svg.chars().any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t')),
                "only characters XML allows"
            );
        }
    }
}
