use super::*;

#[test]
fn types_parse_their_names_and_aliases_and_include_their_kinds() {
    for profile_type in ProfileType::ALL {
        assert_eq!(ProfileType::parse(profile_type.name()), Some(profile_type));
        for alias in profile_type.describe().aliases {
            assert_eq!(ProfileType::parse(alias), Some(profile_type));
        }
    }
    assert_eq!(ProfileType::parse("heap"), None);
    assert!(ProfileType::Cpu.includes(SampleKind::Cpu));
    assert!(!ProfileType::Cpu.includes(SampleKind::OffCpuBlocked));
    assert!(ProfileType::OffCpu.includes(SampleKind::OffCpuRunnable));
    assert!(!ProfileType::OffCpu.includes(SampleKind::Cpu));
    assert!(
        ProfileType::Wall.includes(SampleKind::Cpu) && ProfileType::Wall.includes(SampleKind::OffCpuBlocked)
    );
    assert!(
        ProfileType::Alloc.includes(SampleKind::Alloc) && ProfileType::Alloc.includes(SampleKind::AllocFreed)
    );
    assert!(!ProfileType::Wall.includes(SampleKind::Alloc));
    assert_eq!(ProfileType::parse("allocs"), Some(ProfileType::Alloc));
    assert_eq!(ProfileType::accepted(), "cpu, offcpu, wall or alloc");
}

#[test]
fn bpf_kinds_map_one_to_one() {
    assert_eq!(SampleKind::from_bpf(sample_kind::CPU), Some(SampleKind::Cpu));
    assert_eq!(
        SampleKind::from_bpf(sample_kind::OFF_CPU_RUNNABLE),
        Some(SampleKind::OffCpuRunnable)
    );
    assert_eq!(SampleKind::from_bpf(99), None);
    for (index, kind) in SampleKind::ALL.into_iter().enumerate() {
        assert_eq!(kind.index(), index, "ALL is in declaration order");
        assert_eq!(SampleKind::from_bpf(kind.describe().bpf), Some(kind));
    }
}

/// What the descriptions must agree on, so that a new kind or type that
/// contradicts another is caught here rather than in a profile.
#[test]
fn descriptions_agree_with_each_other() {
    for kind in SampleKind::ALL {
        let description = kind.describe();
        assert_ne!(
            description.profile,
            ProfileType::Wall,
            "{kind:?}: wall is not a kind's own type"
        );
        assert!(description.profile.includes(kind));
        assert_eq!(
            description.values.len(),
            description.profile.describe().sample_types.len(),
            "{kind:?}: a contribution to each of its type's values"
        );
        // A kind adding to its type's values measures what they do (the
        // lifetimes of freed blocks add to none: the views read them).
        if description.values.iter().any(|value| *value != Value::Nothing) {
            assert_eq!(
                description.unit,
                description.profile.describe().unit,
                "{kind:?} and its type measure the same"
            );
        }
        if description.in_wall {
            assert_eq!(description.unit, ProfileType::Wall.describe().unit);
        }
    }
    let mut names = Vec::new();
    let mut paths = Vec::new();
    for profile_type in ProfileType::ALL {
        let description = profile_type.describe();
        assert!(profile_type.kinds().next().is_some(), "{profile_type}: no kinds");
        assert_eq!(description.sample_types[1].1, description.unit.pprof_name());
        names.push(description.name);
        names.extend(description.aliases);
        paths.push(description.go_path);
        assert!(description.go_path.starts_with("/debug/pprof/"));
    }
    let (all_names, all_paths) = (names.len(), paths.len());
    names.sort_unstable();
    names.dedup();
    paths.sort_unstable();
    paths.dedup();
    assert_eq!(
        (names.len(), paths.len()),
        (all_names, all_paths),
        "names and paths are unique"
    );
    let thread_fields: Vec<&str> = SampleKind::ALL
        .iter()
        .flat_map(|kind| {
            [
                Some(kind.describe().threads_amount),
                kind.describe().threads_count,
            ]
        })
        .chain(ProfileType::ALL.iter().map(|t| t.describe().threads_total))
        .flatten()
        .collect();
    let mut unique = thread_fields.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(
        unique.len(),
        thread_fields.len(),
        "/threads fields are unique: {thread_fields:?}"
    );
}

#[test]
fn a_type_is_available_when_all_its_kinds_are_recorded() {
    let cpu_only = KindSet::produced_by(|source| source == Source::CpuClock);
    let all = KindSet::produced_by(|_| true);
    assert_eq!(cpu_only.iter().collect::<Vec<_>>(), [SampleKind::Cpu]);
    assert_eq!(ProfileType::Cpu.available(cpu_only), Ok(()));
    assert_eq!(ProfileType::OffCpu.available(cpu_only), Err(Source::SchedSwitch));
    assert_eq!(ProfileType::Wall.available(cpu_only), Err(Source::SchedSwitch));
    for profile_type in ProfileType::ALL {
        assert_eq!(profile_type.available(all), Ok(()));
    }
}
