//! Kinds of samples, and the profile types made of them: data, not code
//! paths. A sample carries its kind and two values (a count and nanoseconds)
//! from the BPF key to the encoders; a profile type says which kinds it adds
//! up and how its values are named. A new kind of profile is a new variant
//! here, a mapping from its BPF value, and (if it is new) a schema.

use std::fmt;

use profiler_common::sample_kind;

/// What one recorded sample measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SampleKind {
    /// On-CPU: samples, and the CPU time the thread consumed.
    Cpu,
    /// Off-CPU, blocked (sleep, I/O, a lock, a pipe): waits and their time.
    OffCpuBlocked,
    /// Off-CPU, runnable: preempted, waiting in a run queue for a CPU.
    OffCpuRunnable,
}

impl SampleKind {
    /// The kind of a counts-map key (`SampleKey::kind`); None for a value
    /// this daemon does not know (a mismatched BPF object).
    pub fn from_bpf(kind: u16) -> Option<Self> {
        match kind {
            sample_kind::CPU => Some(Self::Cpu),
            sample_kind::OFF_CPU_BLOCKED => Some(Self::OffCpuBlocked),
            sample_kind::OFF_CPU_RUNNABLE => Some(Self::OffCpuRunnable),
            _ => None,
        }
    }

    pub fn is_off_cpu(self) -> bool {
        matches!(self, Self::OffCpuBlocked | Self::OffCpuRunnable)
    }

    /// The `wait` label of off-CPU samples in pprof (None for CPU samples).
    pub fn wait_label(self) -> Option<&'static str> {
        match self {
            Self::Cpu => None,
            Self::OffCpuBlocked => Some("blocked"),
            Self::OffCpuRunnable => Some("runnable"),
        }
    }
}

/// What a reader asks for with `?type=` (and `record --type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ProfileType {
    /// Where threads run: CPU samples.
    #[default]
    Cpu,
    /// Where threads wait: off-CPU waits, blocked and runnable.
    OffCpu,
    /// Where threads spend wall-clock time: on-CPU plus off-CPU, per stack.
    Wall,
}

/// A pprof `ValueType`: (type, unit).
pub type ValueName = (&'static str, &'static str);

impl ProfileType {
    pub const ALL: [ProfileType; 3] = [Self::Cpu, Self::OffCpu, Self::Wall];

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "cpu" => Some(Self::Cpu),
            "offcpu" | "off-cpu" | "off_cpu" => Some(Self::OffCpu),
            "wall" => Some(Self::Wall),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::OffCpu => "offcpu",
            Self::Wall => "wall",
        }
    }

    /// True when samples of `kind` belong to this profile.
    pub fn includes(self, kind: SampleKind) -> bool {
        match self {
            Self::Cpu => kind == SampleKind::Cpu,
            Self::OffCpu => kind.is_off_cpu(),
            Self::Wall => true,
        }
    }

    /// The pprof sample types, in value order: [count-like, nanoseconds].
    /// Names as the ecosystem reads them: Go's and Pyroscope's CPU profile
    /// (`samples/count`, `cpu/nanoseconds`); off-CPU as the OpenTelemetry
    /// profiler and Parca name it (`events/count`, `off_cpu/nanoseconds`);
    /// wall as Pyroscope's wall profiles (`samples/count`, `wall/nanoseconds`).
    pub fn sample_types(self) -> [ValueName; 2] {
        match self {
            Self::Cpu => [("samples", "count"), ("cpu", "nanoseconds")],
            Self::OffCpu => [("events", "count"), ("off_cpu", "nanoseconds")],
            Self::Wall => [("samples", "count"), ("wall", "nanoseconds")],
        }
    }

    /// The name of the time value, in views (`/top`, the index).
    pub fn time_name(self) -> &'static str {
        self.sample_types()[1].0
    }

    /// What the profile measures, for people: titles and headers.
    pub fn title(self) -> &'static str {
        match self {
            Self::Cpu => "CPU",
            Self::OffCpu => "off-CPU",
            Self::Wall => "wall-clock",
        }
    }

    /// True when the views (flame graph, top, folded) count nanoseconds
    /// rather than samples: waits have no fixed period, so only their time
    /// adds up meaningfully (and wall adds CPU time to it).
    pub fn counts_time(self) -> bool {
        self != Self::Cpu
    }

    /// The accepted names, for messages: `cpu, offcpu or wall`.
    pub fn accepted() -> &'static str {
        "cpu, offcpu or wall"
    }
}

impl fmt::Display for ProfileType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_parse_their_names_and_include_their_kinds() {
        for profile_type in ProfileType::ALL {
            assert_eq!(ProfileType::parse(profile_type.name()), Some(profile_type));
        }
        assert_eq!(ProfileType::parse("heap"), None);
        assert!(ProfileType::Cpu.includes(SampleKind::Cpu));
        assert!(!ProfileType::Cpu.includes(SampleKind::OffCpuBlocked));
        assert!(ProfileType::OffCpu.includes(SampleKind::OffCpuRunnable));
        assert!(!ProfileType::OffCpu.includes(SampleKind::Cpu));
        assert!(
            ProfileType::Wall.includes(SampleKind::Cpu)
                && ProfileType::Wall.includes(SampleKind::OffCpuBlocked)
        );
    }

    #[test]
    fn bpf_kinds_map_one_to_one() {
        assert_eq!(SampleKind::from_bpf(sample_kind::CPU), Some(SampleKind::Cpu));
        assert_eq!(
            SampleKind::from_bpf(sample_kind::OFF_CPU_RUNNABLE),
            Some(SampleKind::OffCpuRunnable)
        );
        assert_eq!(SampleKind::from_bpf(99), None);
    }
}
