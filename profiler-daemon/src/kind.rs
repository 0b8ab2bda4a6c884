//! Kinds of samples, and the profile types made of them, as data.
//!
//! A [`SampleKind`] is what one recorded sample measures; a
//! [`ProfileType`] is what a reader asks for (`?type=`, `--type`, a Go
//! endpoint, a pushed series). Each is described once, here
//! ([`KindDescription`], [`TypeDescription`]): the BPF program that
//! produces it, the unit of its amount, its pprof sample and period types,
//! its Go path, whether it is part of wall-clock profiles, its push names.
//! The stages read the descriptions; the few decisions that are code are
//! exhaustive matches, so a new variant makes the compiler list them.

use profiler_common::sample_kind;

mod types;
pub use types::{Period, ProfileType, PushNames, Scale, TypeDescription, ValueName, ViewValue};

/// Which BPF program produces a kind's samples, and so what turns it on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The cpu-clock perf event on every CPU: always on.
    CpuClock,
    /// The sched_switch tracepoint: on with `--off-cpu`, where the kernel's
    /// BTF allows it.
    SchedSwitch,
    /// Uprobes on a traced process's allocator: attached per process, for
    /// a window someone asked for; loadable with table unwinding.
    AllocatorProbes,
}

impl Source {
    /// How a user turns it on, for messages about what is off.
    pub fn how_to_enable(self) -> &'static str {
        match self {
            Self::CpuClock => "it is always on",
            Self::SchedSwitch => {
                "start profilerd with --off-cpu (config file: off_cpu = true); if it was given, the log says why it is off"
            }
            Self::AllocatorProbes => {
                "start profilerd with table unwinding (--unwind auto, the default, or tables): allocation stacks are walked with the unwind tables"
            }
        }
    }
}

/// What a sample's amount is measured in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Nanoseconds,
    Bytes,
}

impl Unit {
    /// As pprof names it (the unit of a `ValueType`).
    pub fn pprof_name(self) -> &'static str {
        match self {
            Self::Nanoseconds => "nanoseconds",
            Self::Bytes => "bytes",
        }
    }

    /// As views label a column of it.
    pub fn short(self) -> &'static str {
        match self {
            Self::Nanoseconds => "ns",
            Self::Bytes => "B",
        }
    }

    /// `amount` for people: `1.250 s`.
    pub fn human(self, amount: u64) -> String {
        match self {
            Self::Nanoseconds => format!("{:.3} s", amount as f64 / 1e9),
            Self::Bytes => format!("{:.1} MiB", amount as f64 / (1u64 << 20) as f64),
        }
    }
}

/// What one recorded sample measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SampleKind {
    /// On-CPU: samples, and the CPU time the thread consumed.
    Cpu,
    /// Off-CPU, blocked (sleep, I/O, a lock, a pipe): waits and their time.
    OffCpuBlocked,
    /// Off-CPU, runnable: preempted, waiting in a run queue for a CPU.
    OffCpuRunnable,
    /// Sampled allocations: blocks and their bytes, unscaled.
    Alloc,
    /// Frees of sampled blocks, under their allocation's stack and thread.
    AllocFreed,
    /// How long the freed sampled blocks lived (for the views' table, not
    /// pprof's values).
    AllocLifetime,
}

/// What a sample adds to one value (column) of its profile type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    Count,
    Amount,
    /// Takes its count away (frees from allocations: what is still in use).
    LessCount,
    LessAmount,
    Nothing,
}

/// Everything that varies with a [`SampleKind`].
#[derive(Debug)]
pub struct KindDescription {
    /// Its value in the counts maps' keys (`SampleKey::kind`) and the spill
    /// ring's records: one of profiler-common's [`sample_kind`].
    pub bpf: u16,
    pub source: Source,
    /// What a sample's amount measures (its count is of samples or events).
    pub unit: Unit,
    /// The profile type of this kind alone (never [`ProfileType::Wall`]).
    pub profile: ProfileType,
    /// Part of wall-clock profiles.
    pub in_wall: bool,
    /// The stack ends in the scheduler's switch, which symbolization trims:
    /// a wait's place is where the thread blocked, not how it left the CPU.
    pub ends_in_switch: bool,
    /// The pprof `wait` label of its samples.
    pub wait_label: Option<&'static str>,
    /// The `/threads` field of its amount, and of its count if reported.
    pub threads_amount: &'static str,
    pub threads_count: Option<&'static str>,
    /// What it adds to each value of its profile type, in their order.
    pub values: &'static [Value],
}

impl SampleKind {
    pub const ALL: [SampleKind; 6] = [
        Self::Cpu,
        Self::OffCpuBlocked,
        Self::OffCpuRunnable,
        Self::Alloc,
        Self::AllocFreed,
        Self::AllocLifetime,
    ];

    pub const fn describe(self) -> &'static KindDescription {
        match self {
            Self::Cpu => &KindDescription {
                bpf: sample_kind::CPU,
                source: Source::CpuClock,
                unit: Unit::Nanoseconds,
                profile: ProfileType::Cpu,
                in_wall: true,
                ends_in_switch: false,
                wait_label: None,
                threads_amount: "cpu_ns",
                threads_count: Some("samples"),
                values: &[Value::Count, Value::Amount],
            },
            Self::OffCpuBlocked => &KindDescription {
                bpf: sample_kind::OFF_CPU_BLOCKED,
                source: Source::SchedSwitch,
                unit: Unit::Nanoseconds,
                profile: ProfileType::OffCpu,
                in_wall: true,
                ends_in_switch: true,
                wait_label: Some("blocked"),
                threads_amount: "off_cpu_blocked_ns",
                threads_count: None,
                values: &[Value::Count, Value::Amount],
            },
            Self::OffCpuRunnable => &KindDescription {
                bpf: sample_kind::OFF_CPU_RUNNABLE,
                source: Source::SchedSwitch,
                unit: Unit::Nanoseconds,
                profile: ProfileType::OffCpu,
                in_wall: true,
                ends_in_switch: true,
                wait_label: Some("runnable"),
                threads_amount: "off_cpu_runnable_ns",
                threads_count: None,
                values: &[Value::Count, Value::Amount],
            },
            Self::Alloc => &KindDescription {
                bpf: sample_kind::ALLOC,
                source: Source::AllocatorProbes,
                unit: Unit::Bytes,
                profile: ProfileType::Alloc,
                in_wall: false,
                ends_in_switch: false,
                wait_label: None,
                threads_amount: "alloc_bytes",
                threads_count: Some("allocs"),
                // Allocated, and in use until freed.
                values: &[Value::Count, Value::Amount, Value::Count, Value::Amount],
            },
            Self::AllocFreed => &KindDescription {
                bpf: sample_kind::ALLOC_FREED,
                source: Source::AllocatorProbes,
                unit: Unit::Bytes,
                profile: ProfileType::Alloc,
                in_wall: false,
                ends_in_switch: false,
                wait_label: None,
                threads_amount: "freed_bytes",
                threads_count: Some("frees"),
                values: &[
                    Value::Nothing,
                    Value::Nothing,
                    Value::LessCount,
                    Value::LessAmount,
                ],
            },
            Self::AllocLifetime => &KindDescription {
                bpf: sample_kind::ALLOC_LIFETIME,
                source: Source::AllocatorProbes,
                unit: Unit::Nanoseconds,
                profile: ProfileType::Alloc,
                in_wall: false,
                ends_in_switch: false,
                wait_label: None,
                threads_amount: "freed_lifetime_ns",
                threads_count: None,
                values: &[Value::Nothing; 4],
            },
        }
    }

    /// The kind of a BPF record's `kind`; None for a value this daemon does
    /// not know (a mismatched BPF object).
    pub fn from_bpf(kind: u16) -> Option<Self> {
        Self::ALL.into_iter().find(|known| known.describe().bpf == kind)
    }

    /// Its place in [`SampleKind::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    pub fn source(self) -> Source {
        self.describe().source
    }

    /// The `wait` label of off-CPU samples in pprof (None for CPU samples).
    pub fn wait_label(self) -> Option<&'static str> {
        self.describe().wait_label
    }
}

/// A set of sample kinds: those the sampler records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KindSet(u32);

impl KindSet {
    /// The kinds the given sources produce.
    pub fn produced_by(on: impl Fn(Source) -> bool) -> Self {
        let mut set = Self::default();
        for kind in SampleKind::ALL {
            if on(kind.source()) {
                set.0 |= 1 << kind.index();
            }
        }
        set
    }

    pub fn contains(self, kind: SampleKind) -> bool {
        self.0 & (1 << kind.index()) != 0
    }

    pub fn iter(self) -> impl Iterator<Item = SampleKind> {
        SampleKind::ALL
            .into_iter()
            .filter(move |&kind| self.contains(kind))
    }
}

/// Names for a message: `a, b or c` (`word` = "or").
pub fn listed(items: &[&str], word: &str) -> String {
    match items.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} {word} {last}", rest.join(", ")),
        Some((last, _)) => (*last).to_owned(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests;
