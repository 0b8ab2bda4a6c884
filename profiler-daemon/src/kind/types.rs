//! Profile types: what a reader asks for, each described once
//! ([`TypeDescription`]), and the kinds each adds up.

use std::fmt;

use super::{KindSet, SampleKind, Source, Unit, listed};

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
    /// Where a traced process allocates, and what of it is still in use:
    /// Go's heap profile.
    Alloc,
}

/// A pprof `ValueType`: (type, unit).
pub type ValueName = (&'static str, &'static str);

/// The pprof period of a profile type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Period {
    /// One sample per sampling interval: `cpu/nanoseconds`, 1e9 / frequency.
    SamplingInterval,
    /// No fixed period (events of any length): the amount's own type, 1.
    One,
    /// Allocations sampled every so many bytes on average: `space/bytes`,
    /// the interval (Go's heap profile; 1 when every one is recorded).
    AllocationInterval,
}

/// How a profile's values are scaled from what was recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// As recorded.
    None,
    /// Byte-sampled allocations: each (count, bytes) pair of values is
    /// scaled as Go's runtime/pprof does, by 1 / (1 - e^(-average/interval)).
    SampledBytes,
}

/// Which of a sample's two values the views (flame graph, top, folded) add.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewValue {
    /// Samples: they come at a fixed period, so they add up to time.
    Count,
    /// The amount: events of any length add up only by it.
    Amount,
}

/// The names a pushed profile of this type has in each backend (the
/// `__name__` series label); None: not pushed there.
#[derive(Debug)]
pub struct PushNames {
    pub pyroscope: Option<&'static str>,
    pub parca: Option<&'static str>,
    /// Pushed per process traced while the daemon runs, as Go programs
    /// push their heap: each window's allocations, and the live set since
    /// tracing began (`push/heap.rs`); not the whole machine's window.
    pub as_heap: bool,
}

/// Everything that varies with a [`ProfileType`].
#[derive(Debug)]
pub struct TypeDescription {
    /// In `?type=`, `--type` and messages.
    pub name: &'static str,
    /// Other spellings `?type=` accepts.
    pub aliases: &'static [&'static str],
    /// What it measures, for people: titles and headers.
    pub title: &'static str,
    /// The pprof sample types, in value order: [count, amount], and for
    /// allocations Go's four. Names as the ecosystem reads them: Go's and
    /// Pyroscope's CPU profile; off-CPU as the OpenTelemetry profiler and
    /// Parca name it; wall as Pyroscope's; allocations as Go's heap profile.
    pub sample_types: &'static [ValueName],
    /// The sample type pprof shows unless told otherwise (None: the last).
    pub default_sample_type: Option<&'static str>,
    pub period: Period,
    pub scale: Scale,
    /// The unit of the amount (every kind it includes shares it).
    pub unit: Unit,
    pub views_count: ViewValue,
    /// Its Go-compatible endpoint (blocks `seconds`, answers that window).
    pub go_path: &'static str,
    pub push: PushNames,
    /// What the index page's column means.
    pub explanation: &'static str,
    /// The `/threads` field of the sum of its kinds' amounts, when that is
    /// not already one kind's field.
    pub threads_total: Option<&'static str>,
}

impl ProfileType {
    pub const ALL: [ProfileType; 4] = [Self::Cpu, Self::OffCpu, Self::Wall, Self::Alloc];

    pub const fn describe(self) -> &'static TypeDescription {
        match self {
            Self::Cpu => &TypeDescription {
                name: "cpu",
                aliases: &[],
                title: "CPU",
                sample_types: &[("samples", "count"), ("cpu", "nanoseconds")],
                default_sample_type: None,
                period: Period::SamplingInterval,
                scale: Scale::None,
                unit: Unit::Nanoseconds,
                views_count: ViewValue::Count,
                go_path: "/debug/pprof/profile",
                push: PushNames {
                    pyroscope: Some("process_cpu"),
                    parca: Some("process_cpu"),
                    as_heap: false,
                },
                explanation: "CPU is measured in the kernel, as a share of one CPU: 100% is one CPU busy for the whole window.",
                threads_total: None,
            },
            Self::OffCpu => &TypeDescription {
                name: "offcpu",
                aliases: &["off-cpu", "off_cpu"],
                title: "off-CPU",
                sample_types: &[("events", "count"), ("off_cpu", "nanoseconds")],
                default_sample_type: None,
                period: Period::One,
                scale: Scale::None,
                unit: Unit::Nanoseconds,
                views_count: ViewValue::Amount,
                go_path: "/debug/pprof/offcpu",
                push: PushNames {
                    pyroscope: Some("off_cpu"),
                    parca: Some("off_cpu"),
                    as_heap: false,
                },
                explanation: "off-CPU is the time threads waited (blocked, or runnable for a CPU), as a share of one thread: 100% is one thread waiting for the whole window.",
                threads_total: Some("off_cpu_ns"),
            },
            // Wall is CPU plus off-CPU: pushing it too would send both twice.
            Self::Wall => &TypeDescription {
                name: "wall",
                aliases: &[],
                title: "wall-clock",
                sample_types: &[("samples", "count"), ("wall", "nanoseconds")],
                default_sample_type: None,
                period: Period::One,
                scale: Scale::None,
                unit: Unit::Nanoseconds,
                views_count: ViewValue::Amount,
                go_path: "/debug/pprof/wall",
                push: PushNames {
                    pyroscope: None,
                    parca: None,
                    as_heap: false,
                },
                explanation: "wall-clock is CPU plus off-CPU time, as a share of one thread: 100% is one thread's whole window.",
                threads_total: None,
            },
            // Pushed for the processes traced while the daemon runs, under
            // the name Go programs' heaps have in both backends.
            Self::Alloc => &TypeDescription {
                name: "alloc",
                aliases: &["allocs", "allocations"],
                title: "allocations",
                sample_types: &[
                    ("alloc_objects", "count"),
                    ("alloc_space", "bytes"),
                    ("inuse_objects", "count"),
                    ("inuse_space", "bytes"),
                ],
                default_sample_type: Some("alloc_space"),
                period: Period::AllocationInterval,
                scale: Scale::SampledBytes,
                unit: Unit::Bytes,
                views_count: ViewValue::Amount,
                go_path: "/debug/pprof/allocs",
                push: PushNames {
                    pyroscope: Some("memory"),
                    parca: Some("memory"),
                    as_heap: true,
                },
                explanation: "allocations are the bytes a traced process allocated in the window (estimated from samples), as a share of all it allocated.",
                threads_total: None,
            },
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|profile_type| {
            let description = profile_type.describe();
            description.name == text || description.aliases.contains(&text)
        })
    }

    pub fn name(self) -> &'static str {
        self.describe().name
    }

    /// True when samples of `kind` belong to this profile.
    pub fn includes(self, kind: SampleKind) -> bool {
        let kind = kind.describe();
        match self {
            Self::Wall => kind.in_wall,
            Self::Cpu | Self::OffCpu | Self::Alloc => kind.profile == self,
        }
    }

    /// The kinds this profile adds up.
    pub fn kinds(self) -> impl Iterator<Item = SampleKind> {
        SampleKind::ALL
            .into_iter()
            .filter(move |&kind| self.includes(kind))
    }

    /// Ok when every kind it adds up is recorded; else the source that is
    /// off. A profile missing some of its kinds would look like threads
    /// never wait (or never run): it is refused rather than answered.
    pub fn available(self, recorded: KindSet) -> Result<(), Source> {
        match self.kinds().find(|&kind| !recorded.contains(kind)) {
            None => Ok(()),
            Some(kind) => Err(kind.source()),
        }
    }

    /// The pprof sample types, in value order: [count-like, amount, ...].
    pub fn sample_types(self) -> &'static [ValueName] {
        self.describe().sample_types
    }

    pub fn title(self) -> &'static str {
        self.describe().title
    }

    /// True when the views (flame graph, top, folded) add amounts rather
    /// than samples.
    pub fn counts_time(self) -> bool {
        match self.describe().views_count {
            ViewValue::Count => false,
            ViewValue::Amount => true,
        }
    }

    /// The accepted names, for messages: `cpu, offcpu or wall`.
    pub fn accepted() -> String {
        listed(&Self::ALL.map(Self::name), "or")
    }
}

impl fmt::Display for ProfileType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
