use std::{collections::HashSet, io::Read, sync::Arc};

use super::*;
use crate::{
    kind::ProfileType,
    profile::Window,
    symbolize::{FrameKind, Function, Line, Location, Mapping, SymbolizedSample, SymbolizedStack},
};

fn function(name: &str, filename: Option<&str>) -> Arc<Function> {
    Arc::new(Function {
        name: name.into(),
        system_name: format!("_Z{name}").into(),
        filename: filename.map(Into::into),
    })
}

fn mapping(path: &str, start: u64, build_id: Option<&str>) -> Arc<Mapping> {
    Arc::new(Mapping {
        start,
        limit: start + 0x1000,
        file_offset: 0x40,
        path: path.into(),
        build_id: build_id.map(Into::into),
    })
}

fn location(
    kind: FrameKind,
    address: u64,
    mapping: &Arc<Mapping>,
    lines: &[(&Arc<Function>, u32)],
    resolved: bool,
) -> Location {
    Location {
        kind,
        address,
        mapping: Some(mapping.clone()),
        lines: lines
            .iter()
            .map(|(function, line)| Line {
                function: (*function).clone(),
                line: *line,
            })
            .collect(),
        resolved,
    }
}

fn sample(pid: u32, tid: u32, comm: &str, stack: &Arc<SymbolizedStack>, count: u64) -> SymbolizedSample {
    SymbolizedSample {
        pid,
        tid,
        comm: comm.into(),
        readable_by: crate::collect::ReadableBy::Privileged,
        thread_name: format!("{comm}-t").into(),
        stack: stack.clone(),
        count,
        kind: crate::kind::SampleKind::Cpu,
        amount: count * 10_101_010,
        cgroup: None,
        ns_pid: None,
    }
}

/// Two processes sharing a library (equal but distinct `Arc`s, as two
/// symbolizer batches would produce), a kernel frame, an inlined frame and
/// an unresolved placeholder in a library of its own.
pub(super) fn fixture() -> Profile {
    let kernel = mapping("[kernel.kallsyms]", 0, None);
    let libc = mapping("/usr/lib/libc.so.6", 0x7f00_0000_0000, Some("ab12"));
    let exe = mapping("/usr/bin/busy", 0x5500_0000_0000, Some("cd34"));
    let stripped = mapping("/opt/stripped.so", 0x7e00_0000_0000, None);
    let read_zero = function("read_zero", None);
    let memset = function("memset", Some("memset.S"));
    let helper = function("helper", Some("busy.c"));
    let main = function("main", Some("busy.c"));
    let first = Arc::new(SymbolizedStack {
        locations: vec![
            location(
                FrameKind::Kernel,
                0xffff_ffff_8100_0000,
                &kernel,
                &[(&read_zero, 0)],
                true,
            ),
            location(FrameKind::User, 0x7f00_0000_0010, &libc, &[(&memset, 12)], true),
            location(
                FrameKind::User,
                0x5500_0000_0020,
                &exe,
                &[(&helper, 7), (&main, 30)],
                true,
            ),
        ]
        .into(),
    });
    let placeholder = function("[unknown] stripped.so+0x50", None);
    let second = Arc::new(SymbolizedStack {
        locations: vec![
            location(
                FrameKind::User,
                0x7e00_0000_0010,
                &stripped,
                &[(&placeholder, 0)],
                false,
            ),
            location(
                FrameKind::User,
                0x7f00_0000_0010,
                // Equal by value to `libc`, but another allocation.
                &mapping("/usr/lib/libc.so.6", 0x7f00_0000_0000, Some("ab12")),
                &[(&function("memset", Some("memset.S")), 12)],
                true,
            ),
        ]
        .into(),
    });
    Profile {
        window: Window {
            start_ms: 100_000,
            end_ms: 110_000,
        },
        frequency: 99,
        alloc_interval: 0,
        profile_type: ProfileType::Cpu,
        samples: vec![
            sample(42, 43, "busy", &first, 5),
            sample(42, 42, "busy", &first, 2),
            sample(7, 7, "other", &second, 3),
        ],
    }
}

#[test]
fn ids_run_one_to_n_in_table_order_and_every_reference_resolves() {
    let profile = build(&fixture());
    let mapping_ids: Vec<u64> = profile.mapping.iter().map(|m| m.id).collect();
    let location_ids: Vec<u64> = profile.location.iter().map(|l| l.id).collect();
    let function_ids: Vec<u64> = profile.function.iter().map(|f| f.id).collect();
    for ids in [&mapping_ids, &location_ids, &function_ids] {
        assert_eq!(*ids, (1..=ids.len() as u64).collect::<Vec<_>>());
    }
    for sample in &profile.sample {
        assert!(!sample.location_id.is_empty());
        assert!(sample.location_id.iter().all(|id| location_ids.contains(id)));
    }
    for location in &profile.location {
        assert!(location.mapping_id == 0 || mapping_ids.contains(&location.mapping_id));
        assert!(
            location
                .line
                .iter()
                .all(|line| function_ids.contains(&line.function_id))
        );
    }
    // Deduplicated by value: kernel, libc, busy, stripped.
    assert_eq!(profile.mapping.len(), 4);
    // The shared memset location and function appear once.
    assert_eq!(profile.location.len(), 4);
    assert_eq!(profile.function.len(), 5);
}

#[test]
fn string_table_starts_empty_is_unique_and_every_index_is_in_range() {
    let profile = build(&fixture());
    let table = &profile.string_table;
    assert_eq!(table[0], "");
    assert_eq!(table.iter().collect::<HashSet<_>>().len(), table.len());
    let mut indices = Vec::new();
    for value_type in profile.sample_type.iter().chain(profile.period_type.iter()) {
        indices.extend([value_type.r#type, value_type.unit]);
    }
    for sample in &profile.sample {
        for label in &sample.label {
            indices.extend([label.key, label.str, label.num_unit]);
        }
    }
    for mapping in &profile.mapping {
        indices.extend([mapping.filename, mapping.build_id]);
    }
    for function in &profile.function {
        indices.extend([function.name, function.system_name, function.filename]);
    }
    indices.extend(profile.comment.iter().copied());
    indices.extend([
        profile.drop_frames,
        profile.keep_frames,
        profile.default_sample_type,
    ]);
    assert!(
        indices
            .iter()
            .all(|&index| index >= 0 && (index as usize) < table.len())
    );
}

#[test]
fn values_labels_and_header_follow_the_cpu_convention() {
    let profile = build(&fixture());
    let s = |index: i64| profile.string_table[index as usize].as_str();
    let types: Vec<_> = profile
        .sample_type
        .iter()
        .map(|t| (s(t.r#type), s(t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    let period_type = profile.period_type.expect("period_type is set");
    assert_eq!(
        (s(period_type.r#type), s(period_type.unit)),
        ("cpu", "nanoseconds")
    );
    assert_eq!(profile.period, 1_000_000_000 / 99);
    assert_eq!(profile.time_nanos, 100_000_000_000);
    assert_eq!(profile.duration_nanos, 10_000_000_000);
    for sample in &profile.sample {
        assert_eq!(sample.value.len(), 2);
        assert_eq!(sample.value[1], sample.value[0] * profile.period);
        let labels: Vec<_> = sample.label.iter().map(|l| s(l.key)).collect();
        assert_eq!(labels, ["pid", "comm", "thread_id", "thread_name"]);
    }
    // Sorted by (pid, tid): the other process first.
    let label = |sample: &proto::Sample, index: usize| s(sample.label[index].str).to_owned();
    let first = &profile.sample[0];
    assert_eq!(
        (label(first, 0), label(first, 1), label(first, 2), label(first, 3)),
        ("7".into(), "other".into(), "7".into(), "other-t".into())
    );
    assert_eq!(profile.sample[1].value[0], 2);
    assert_eq!(label(&profile.sample[1], 2), "42");
}

#[test]
fn locations_are_leaf_first_with_inlined_lines_innermost_first() {
    let profile = build(&fixture());
    let s = |index: i64| profile.string_table[index as usize].as_str();
    let function_name = |id: u64| s(profile.function[id as usize - 1].name);
    let sample = &profile.sample[1];
    let names: Vec<Vec<&str>> = sample
        .location_id
        .iter()
        .map(|&id| {
            profile.location[id as usize - 1]
                .line
                .iter()
                .map(|line| function_name(line.function_id))
                .collect()
        })
        .collect();
    assert_eq!(names, [vec!["read_zero"], vec!["memset"], vec!["helper", "main"]]);
    let inlined = &profile.location[sample.location_id[2] as usize - 1];
    assert_eq!(
        inlined.line.iter().map(|line| line.line).collect::<Vec<_>>(),
        [7, 30]
    );
    let helper = &profile.function[inlined.line[0].function_id as usize - 1];
    assert_eq!(
        (s(helper.system_name), s(helper.filename)),
        ("_Zhelper", "busy.c")
    );
}

#[test]
fn mappings_carry_paths_build_ids_and_truthful_flags() {
    let profile = build(&fixture());
    let s = |index: i64| profile.string_table[index as usize].as_str();
    let by_path = |path: &str| {
        *profile
            .mapping
            .iter()
            .find(|mapping| s(mapping.filename) == path)
            .unwrap_or_else(|| panic!("no mapping {path}"))
    };
    let flags = |m: proto::Mapping| {
        (
            m.has_functions,
            m.has_filenames,
            m.has_line_numbers,
            m.has_inline_frames,
        )
    };
    let exe = by_path("/usr/bin/busy");
    assert_eq!(s(exe.build_id), "cd34");
    assert_eq!(
        (exe.memory_start, exe.memory_limit, exe.file_offset),
        (0x5500_0000_0000, 0x5500_0000_1000, 0x40)
    );
    assert_eq!(flags(exe), (true, true, true, true));
    assert_eq!(flags(by_path("/usr/lib/libc.so.6")), (true, true, true, false));
    let kernel = by_path("[kernel.kallsyms]");
    assert_eq!(
        (s(kernel.build_id), flags(kernel)),
        ("", (true, false, false, false))
    );
    // Only a placeholder: left for the consumer to symbolize.
    assert_eq!(flags(by_path("/opt/stripped.so")), (false, false, false, false));
}

#[test]
fn round_trips_through_prost_and_gzip() {
    let fixture = fixture();
    let raw = encode(&fixture);
    let decoded = proto::Profile::decode(raw.as_slice()).expect("decodes");
    assert_eq!(decoded, build(&fixture));
    let gzipped = encode_gzip(&fixture).expect("gzip into memory");
    assert_eq!(&gzipped[..2], &[0x1f, 0x8b]);
    let mut unzipped = Vec::new();
    flate2::read::GzDecoder::new(gzipped.as_slice())
        .read_to_end(&mut unzipped)
        .expect("gunzip");
    assert_eq!(unzipped, raw);
}

#[test]
fn an_empty_window_is_still_a_valid_non_empty_profile() {
    let profile = Profile {
        window: Window {
            start_ms: 5_000,
            end_ms: 8_000,
        },
        frequency: 99,
        alloc_interval: 0,
        profile_type: ProfileType::Cpu,
        samples: Vec::new(),
    };
    let raw = encode(&profile);
    assert!(!raw.is_empty());
    let decoded = proto::Profile::decode(raw.as_slice()).expect("decodes");
    assert_eq!(decoded.sample_type.len(), 2);
    assert_eq!(decoded.string_table[0], "");
    assert!(decoded.sample.is_empty());
    assert_eq!(decoded.duration_nanos, 3_000_000_000);
    assert!(!encode_gzip(&profile).expect("gzip").is_empty());
}

#[test]
fn extreme_windows_and_frequencies_saturate_instead_of_overflowing() {
    let profile = Profile {
        window: Window::ALL,
        frequency: 0,
        alloc_interval: 0,
        profile_type: ProfileType::Cpu,
        samples: Vec::new(),
    };
    let decoded = build(&profile);
    assert_eq!(decoded.period, 1_000_000_000);
    assert_eq!(decoded.duration_nanos, i64::MAX);
}

#[test]
fn cgroup_unit_container_and_ns_pid_labels_when_known() {
    let mut profile = fixture();
    let id = "4f1e0c2ab3d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f";
    profile.samples[0].cgroup = Some(Arc::new(crate::cgroup::Cgroup::from_path(&format!(
        "/system.slice/docker-{id}.scope"
    ))));
    profile.samples[0].ns_pid = Some(1);
    let built = build(&profile);
    let s = |index: i64| built.string_table[usize::try_from(index).expect("an index")].as_str();
    let labels = |sample: &proto::Sample| -> Vec<(String, String)> {
        sample
            .label
            .iter()
            .map(|label| (s(label.key).to_owned(), s(label.str).to_owned()))
            .collect()
    };
    let labelled: Vec<_> = built
        .sample
        .iter()
        .map(labels)
        .filter(|labels| labels.len() > 4)
        .collect();
    assert_eq!(labelled.len(), 1, "one sample has a cgroup: {labelled:?}");
    assert_eq!(
        labelled[0][4..],
        [
            ("cgroup".to_owned(), format!("/system.slice/docker-{id}.scope")),
            ("unit".to_owned(), format!("docker-{id}.scope")),
            ("container_id".to_owned(), id.to_owned()),
            ("ns_pid".to_owned(), "1".to_owned()),
        ]
    );
    // Samples without a cgroup have the four usual labels only.
    assert!(
        built
            .sample
            .iter()
            .map(labels)
            .all(|labels| labels.len() == 4 || labels.len() == 8)
    );
}
