use super::*;
use crate::procfs::fixture::FixtureProc;

const BLOCKED: u16 = sample_kind::OFF_CPU_BLOCKED;
const RUNNABLE: u16 = sample_kind::OFF_CPU_RUNNABLE;

fn sample(tgid: u32, tid: u32, kind: u16, amount: u64) -> RawSample {
    RawSample {
        key: Wait {
            tgid,
            kind,
            ..Wait::default()
        }
        .key(tid),
        count: 1,
        amount,
    }
}

fn wait(tgid: u32, weight: u64) -> Wait {
    Wait {
        tgid,
        weight,
        ..Wait::default()
    }
}

/// Writes `/proc/TGID/task/TID/schedstat`: CPU ns, run delay, runs.
fn schedstat(proc: &FixtureProc, tgid: u32, tid: u32, runtime_ns: u64, runs: u64) {
    proc.write(
        tgid,
        &format!("task/{tid}/schedstat"),
        &format!("{runtime_ns} 0 {runs}\n"),
    );
}

fn amounts(samples: &[RawSample]) -> Vec<u64> {
    samples.iter().map(|sample| sample.amount).collect()
}

#[test]
fn a_thread_with_many_weighted_waits_adds_up_to_its_time_off_cpu_between_consecutive_drains() {
    let proc = FixtureProc::new("exact-scaled");
    let mut exact = ExactOffCpu::new(proc.root());
    let waits = [
        (11, wait(10, 4)),
        (21, wait(20, 128)),
        (31, wait(30, 1)),
        (41, wait(40, 4)),
    ];
    // 11: many runs, weight 4; 21: blocked throughout, weight 128; 31:
    // weight 1 (never read: it has no schedstat here); 41: gone.
    schedstat(&proc, 10, 11, 1_000, 100);
    schedstat(&proc, 20, 21, 500, 7);
    let batch = || {
        vec![
            sample(10, 11, BLOCKED, 900_000_000),
            sample(10, 11, RUNNABLE, 300_000_000),
            sample(10, 11, sample_kind::ALLOC, 4096),
            sample(10, 11, sample_kind::CPU, 1_000),
            sample(20, 21, BLOCKED, 128_000_000_000),
            sample(30, 31, BLOCKED, 1_000_000_000),
            sample(40, 41, BLOCKED, 8_000_000),
        ]
    };
    let mut first = batch();
    let outcome = exact.drained_by(&mut first, &waits, 7, || 1_000_000_000);
    assert_eq!(
        amounts(&first),
        amounts(&batch()),
        "the first readings scale nothing"
    );
    assert_eq!(
        outcome,
        OffCpuExact {
            threads: 0,
            unread: 1,
            capped: 0
        },
        "41 has no schedstat"
    );

    // A second later: 11 ran 100 more times and 2,000 ns on CPU; 21 never ran.
    schedstat(&proc, 10, 11, 3_000, 200);
    let mut second = batch();
    let outcome = exact.drained_by(&mut second, &waits, 8, || 2_000_000_000);
    assert_eq!(
        amounts(&second),
        [
            749_998_500,
            249_999_500,
            4096,
            1_000,
            128_000_000_000,
            1_000_000_000,
            8_000_000
        ],
        "11's off-CPU samples scaled 3:1 to 999,998,000 ns; its allocation and CPU samples, 21 (one \
         wait, weight 128: kept weighted), 31 (weight 1) and 41 (unread) untouched"
    );
    assert_eq!(outcome.threads, 1);
    assert_eq!(outcome.unread, 1);

    // A drain skipped (generation 9 missing): nothing is consecutive.
    let mut fourth = batch();
    exact.drained_by(&mut fourth, &waits, 10, || 4_000_000_000);
    assert_eq!(
        amounts(&fourth),
        amounts(&batch()),
        "not consecutive: nothing scaled"
    );
}

#[test]
fn threads_without_weighted_samples_in_a_drain_are_no_longer_followed() {
    let proc = FixtureProc::new("exact-followed");
    let mut exact = ExactOffCpu::new(proc.root());
    schedstat(&proc, 10, 11, 1_000, 100);
    schedstat(&proc, 10, 12, 1_000, 100);
    let waits = [(11, wait(10, 4)), (12, wait(10, 4))];
    let mut both = vec![sample(10, 11, BLOCKED, 1), sample(10, 12, BLOCKED, 1)];
    exact.drained_by(&mut both, &waits, 1, || 1);
    assert_eq!(exact.threads.len(), 2);
    // 12 has no off-CPU sample in the next batch (a stale entry of the
    // waits map, still weighted): its descriptor closes.
    let mut one = vec![sample(10, 11, BLOCKED, 1), sample(10, 12, sample_kind::CPU, 1)];
    exact.drained_by(&mut one, &waits, 2, || 2);
    let followed: Vec<u32> = exact.threads.keys().copied().collect();
    assert_eq!(followed, [11]);
}

#[test]
fn off_cpu_time_between_readings_is_the_time_between_them_less_the_cpu_time() {
    let reading = |generation, at_ns, runtime_ns, runs| Reading {
        generation,
        at_ns,
        runtime_ns,
        runs,
    };
    assert_eq!(
        off_cpu_between(reading(4, 1_000, 300, 10), reading(5, 101_000, 40_300, 30), 4),
        Some(60_000)
    );
    assert_eq!(
        off_cpu_between(reading(4, 1_000, 300, 10), reading(5, 101_000, 40_300, 18), 4),
        None,
        "9 waits at a weight of 4: fewer than 5 expected recorded"
    );
    assert_eq!(
        off_cpu_between(
            reading(u32::MAX, 1_000, 300, 10),
            reading(0, 101_000, 40_300, 30),
            4
        ),
        Some(60_000),
        "generations wrap"
    );
    assert_eq!(
        off_cpu_between(reading(3, 1_000, 300, 10), reading(5, 101_000, 40_300, 30), 4),
        None,
        "not consecutive drains"
    );
    assert_eq!(
        off_cpu_between(reading(4, 1_000, 300, 10), reading(5, 2_000, 9_000, 30), 4),
        Some(0),
        "more CPU than time (the two reads are not one instant): none off CPU"
    );
}
