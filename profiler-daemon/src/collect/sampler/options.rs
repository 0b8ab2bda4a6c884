//! What the sampler is asked to do: map sizes, the user-stack walk, the
//! off-CPU program and Python frames.

use profiler_common::maps;

use crate::kind::Source;

/// Capacities of the BPF maps (each of the two buffers gets these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    pub counts: u32,
    pub user_stacks: u32,
    pub kernel_stacks: u32,
}

impl Default for MapSizes {
    fn default() -> Self {
        Self {
            counts: maps::DEFAULT_COUNTS_ENTRIES,
            user_stacks: maps::DEFAULT_USER_STACKS_ENTRIES,
            kernel_stacks: maps::DEFAULT_KERNEL_STACKS_ENTRIES,
        }
    }
}

/// How the sampler walks user stacks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnwindMode {
    /// The sampler's own walk: CFI tables (from `.eh_frame`) where the
    /// daemon has loaded them, frame pointers elsewhere.
    #[default]
    Auto,
    /// The kernel's frame-pointer walk only (bpf_get_stackid).
    FramePointers,
}

impl UnwindMode {
    pub fn name(self) -> &'static str {
        match self {
            UnwindMode::Auto => "auto",
            UnwindMode::FramePointers => "frame-pointers",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SamplerOptions {
    /// Samples per second per CPU.
    pub frequency: u64,
    /// How long the maps hold samples before a drain empties them.
    pub drain_interval: std::time::Duration,
    pub map_sizes: MapSizes,
    pub unwind: UnwindMode,
    /// Kernel memory for the unwind tables' rows (auto mode), bytes.
    pub unwind_table_bytes: u64,
    /// The percentage of the unwind tables' memory each non-root user keeps
    /// when others need room (see [`crate::shares`]).
    pub unwind_table_user_share_percent: u64,
    pub off_cpu: OffCpuOptions,
    /// Walk CPython frames (auto mode only).
    pub python_frames: bool,
    /// Mean bytes between sampled allocations of traced processes (0: every one).
    pub alloc_sample_bytes: u64,
    /// Processes traced at once: each may remember an equal part of the
    /// sampled blocks.
    pub alloc_max_processes: u64,
}

/// Go's, jemalloc's default: one sample per 512 KiB allocated, on average.
pub const DEFAULT_ALLOC_SAMPLE_BYTES: u64 = 512 * 1024;

impl SamplerOptions {
    /// Turns on the program of `source` (`record --type` asks for what its
    /// type needs).
    pub fn enable(&mut self, source: Source) {
        match source {
            Source::CpuClock => {}
            Source::SchedSwitch => self.off_cpu.enabled = true,
            // Attached per process on request; loadable with tables.
            Source::AllocatorProbes => {}
        }
    }
}

/// Recorded switches per CPU per second, at most, by default: a switch
/// storm's cost is then a recorded switch's stack walks (~3 us) a thousand
/// times a second per CPU, 0.3% of it, where a quiet machine (fewer
/// switches) keeps every switch recorded, exact per thread. A sampled
/// thread's total is unbiased, and the kernel's own when its waits were
/// many (`off_cpu::exact`).
pub const DEFAULT_OFF_CPU_BUDGET: u64 = 1000;

/// Off-CPU profiling: the sched_switch program, when enabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffCpuOptions {
    pub enabled: bool,
    /// One switch in N is recorded, and weighs N (1: every switch).
    pub sample_every: u64,
    /// Switches recorded per CPU per second, about, at most (0: no limit):
    /// the odds halve while a CPU switches faster, and a wait weighs one
    /// over its odds.
    pub budget: u64,
    /// Waits shorter than this are dropped when they end (nanoseconds).
    pub min_ns: u64,
}

impl Default for OffCpuOptions {
    fn default() -> Self {
        Self {
            enabled: false,
            sample_every: 1,
            budget: DEFAULT_OFF_CPU_BUDGET,
            min_ns: 0,
        }
    }
}
