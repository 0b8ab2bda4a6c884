//! The schema of each profile type: sample and period types, and the `wait` label.

use super::{tests::fixture, *};
use crate::kind::{ProfileType, SampleKind};

fn names(profile: &proto::Profile, value_type: &proto::ValueType) -> (String, String) {
    let s = |index: i64| profile.string_table[usize::try_from(index).expect("an index")].clone();
    (s(value_type.r#type), s(value_type.unit))
}

/// The fixture as `profile_type`, its first sample an off-CPU wait of `kind`.
fn typed(profile_type: ProfileType, kind: SampleKind) -> Profile {
    let mut profile = fixture();
    profile.profile_type = profile_type;
    profile.samples[0].kind = kind;
    profile.samples[0].amount = 2_500_000_000;
    profile
}

#[test]
fn each_type_names_its_values_and_period() {
    let cases = [
        (
            ProfileType::Cpu,
            [("samples", "count"), ("cpu", "nanoseconds")],
            1_000_000_000 / 99,
        ),
        (
            ProfileType::OffCpu,
            [("events", "count"), ("off_cpu", "nanoseconds")],
            1,
        ),
        (
            ProfileType::Wall,
            [("samples", "count"), ("wall", "nanoseconds")],
            1,
        ),
    ];
    for (profile_type, expected, period) in cases {
        let mut profile = fixture();
        profile.profile_type = profile_type;
        let built = build(&profile);
        let sample_types: Vec<_> = built
            .sample_type
            .iter()
            .map(|value_type| names(&built, value_type))
            .collect();
        let expected: Vec<_> = expected
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect();
        assert_eq!(sample_types, expected, "{profile_type}");
        let period_type = built.period_type.as_ref().expect("period_type is set");
        assert_eq!(
            names(&built, period_type),
            expected[1],
            "{profile_type}: the period is in the time value"
        );
        assert_eq!(built.period, period, "{profile_type}");
        assert!(
            built.sample.iter().all(|sample| sample.value.len() == 2),
            "{profile_type}: one value per sample type"
        );
    }
}

#[test]
fn off_cpu_samples_carry_a_wait_label_and_their_time() {
    for (kind, wait) in [
        (SampleKind::OffCpuBlocked, "blocked"),
        (SampleKind::OffCpuRunnable, "runnable"),
    ] {
        let built = build(&typed(ProfileType::Wall, kind));
        let s = |index: i64| built.string_table[usize::try_from(index).expect("an index")].as_str();
        let waits: Vec<(&str, i64)> = built
            .sample
            .iter()
            .filter_map(|sample| {
                sample
                    .label
                    .iter()
                    .find(|label| s(label.key) == "wait")
                    .map(|label| (s(label.str), sample.value[1]))
            })
            .collect();
        assert_eq!(
            waits,
            [(wait, 2_500_000_000)],
            "only the off-CPU sample is labelled, with its waited ns"
        );
    }
}

#[test]
fn cpu_profiles_intern_no_wait_key() {
    let built = build(&typed(ProfileType::Cpu, SampleKind::Cpu));
    assert!(
        !built.string_table.iter().any(|string| string == "wait"),
        "a CPU profile has no off-CPU samples, so no `wait` string"
    );
}

/// Allocations: Go's heap schema; a stack's frees net against its
/// allocations into one sample (in use = allocated - freed, never below
/// nothing); values scaled by the byte interval as Go scales them.
#[test]
fn allocations_are_gos_heap_profile_with_frees_netted_and_values_scaled() {
    let mut profile = fixture();
    profile.profile_type = ProfileType::Alloc;
    profile.alloc_interval = 512 * 1024;
    // The first sample: 4 blocks of 1 KiB allocated, 3 freed (the same
    // stack and thread); the second: 1 block of 64 MiB, never freed.
    let mut freed = profile.samples[0].clone();
    profile.samples[0].kind = SampleKind::Alloc;
    (profile.samples[0].count, profile.samples[0].amount) = (4, 4096);
    freed.kind = SampleKind::AllocFreed;
    (freed.count, freed.amount) = (3, 3072);
    profile.samples[1].kind = SampleKind::Alloc;
    (profile.samples[1].count, profile.samples[1].amount) = (1, 64 << 20);
    profile.samples.truncate(2);
    profile.samples.push(freed);
    let built = build(&profile);
    let sample_types: Vec<_> = built
        .sample_type
        .iter()
        .map(|value_type| names(&built, value_type).0)
        .collect();
    assert_eq!(
        sample_types,
        ["alloc_objects", "alloc_space", "inuse_objects", "inuse_space"]
    );
    let period_type = built.period_type.as_ref().expect("period_type is set");
    assert_eq!(names(&built, period_type), ("space".into(), "bytes".into()));
    assert_eq!(built.period, 512 * 1024);
    let default = usize::try_from(built.default_sample_type).expect("an index");
    assert_eq!(built.string_table[default], "alloc_space");
    assert_eq!(
        built.sample.len(),
        2,
        "the frees merged into their allocations' sample"
    );
    let mut values: Vec<Vec<i64>> = built.sample.iter().map(|sample| sample.value.clone()).collect();
    values.sort();
    // 1 KiB blocks at 512 KiB: each stands for 1 / (1 - e^(-1/512)) = 512.5.
    let scale = |n: f64| (n / (1.0 - (-1.0f64 / 512.0).exp())).round() as i64;
    assert_eq!(
        values,
        [
            vec![1, 64 << 20, 1, 64 << 20],
            vec![scale(4.0), scale(4096.0), scale(1.0), scale(1024.0)],
        ]
    );
    for sample in &built.sample {
        let bytes = sample
            .label
            .iter()
            .find(|label| built.string_table[usize::try_from(label.key).expect("an index")] == "bytes")
            .expect("a bytes label");
        assert_eq!(bytes.num, sample.value[1] / sample.value[0], "the average block");
    }
}
