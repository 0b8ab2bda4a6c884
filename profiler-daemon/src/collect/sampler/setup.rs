//! Configuring the loader: the kernel's offsets, the globals, and each map's
//! capacity for what this sampler turns on.

use aya::EbpfLoader;
use profiler_common::{UNWIND_GROUP_CHUNKS, UnwindRowChunk, globals, maps, unwind_mode};

use super::{
    super::{btf, clock::monotonic_now_ns},
    MapSizes, SamplerOptions, UnwindMode,
};

/// What this sampler turns on: asked for, and possible on this kernel.
#[derive(Clone, Copy, Debug)]
pub(super) struct Plan {
    /// The sampler's own walk with unwind tables (auto mode).
    pub tables: bool,
    /// The sched_switch program, recording off-CPU waits.
    pub off_cpu: bool,
    /// CPython frames walked (tables and BTF's `thread.fsbase` needed).
    pub python: bool,
    /// One switch in N recorded.
    pub sample_every: u64,
    /// What the program compares its random draw with: [`record_below`].
    pub record_below: u64,
    /// Recorded switches per CPU per second, at most (0: no limit).
    pub budget: u64,
    /// The same as the program takes it: [`budget_ns`].
    pub budget_ns: u64,
    pub off_cpu_min_ns: u64,
    /// The maps' capacities as loaded (the configured ones are ceilings).
    pub map_sizes: MapSizes,
}

/// The offsets of task_struct's fields the programs read. Without BTF
/// samples still count, and carry one sampling period each.
pub(super) fn task_offsets() -> btf::TaskOffsets {
    match btf::task_offsets() {
        Ok(offsets) => offsets,
        Err(err) => {
            tracing::warn!("no per-thread CPU time ({err}): cpu/nanoseconds will be count × period");
            btf::TaskOffsets {
                runtime: 0,
                start_time: 0,
                pid: 0,
                fsbase: 0,
            }
        }
    }
}

/// The values of the programs' globals: the loader borrows them until it
/// loads.
pub(super) struct Globals {
    runtime_offset: u64,
    start_offset: u64,
    pid_offset: u64,
    fsbase_offset: u64,
    period_ns: u64,
    attach_ns: u64,
    unwind_mode: u64,
    alloc_interval: u64,
    alloc_blocks_per_process: u64,
}

impl Globals {
    /// CLOCK_MONOTONIC as the sampler is loaded: a thread started since has
    /// all its CPU time in its first sample.
    pub fn attach_ns(&self) -> u64 {
        self.attach_ns
    }

    pub fn new(options: &SamplerOptions, plan: &Plan, offsets: &btf::TaskOffsets) -> Self {
        Self {
            runtime_offset: u64::from(offsets.runtime),
            start_offset: u64::from(offsets.start_time),
            pid_offset: u64::from(offsets.pid),
            fsbase_offset: if plan.python { u64::from(offsets.fsbase) } else { 0 },
            period_ns: 1_000_000_000 / options.frequency.max(1),
            attach_ns: monotonic_now_ns(),
            unwind_mode: if plan.tables {
                unwind_mode::TABLES
            } else {
                unwind_mode::FRAME_POINTERS
            },
            alloc_interval: options.alloc_sample_bytes,
            // Every traced process gets an equal part of the blocks map.
            alloc_blocks_per_process: u64::from(maps::DEFAULT_ALLOC_BLOCKS_ENTRIES)
                / options.alloc_max_processes.max(1),
        }
    }
}

/// What is on: asked for in `options`, and possible with `offsets`.
pub(super) fn plan(options: &SamplerOptions, offsets: &btf::TaskOffsets) -> Plan {
    let off_cpu = options.off_cpu;
    if off_cpu.enabled && offsets.pid == 0 {
        tracing::warn!("off-CPU profiling needs the kernel's BTF (task_struct.pid): it is off");
    }
    let tables = options.unwind == UnwindMode::Auto;
    let python = tables && options.python_frames && offsets.fsbase != 0;
    if tables && options.python_frames && !python {
        tracing::warn!("Python frames need the kernel's BTF (task_struct.thread.fsbase): they are off");
    }
    let off_cpu_on = off_cpu.enabled && offsets.pid != 0;
    Plan {
        tables,
        off_cpu: off_cpu_on,
        python,
        sample_every: off_cpu.sample_every.max(1),
        record_below: record_below(off_cpu.sample_every),
        budget: off_cpu.budget,
        budget_ns: budget_ns(off_cpu.budget, off_cpu.sample_every),
        off_cpu_min_ns: off_cpu.min_ns,
        map_sizes: MapSizes {
            kernel_stacks: kernel_stack_entries(options, off_cpu_on),
            ..options.map_sizes
        },
    }
}

/// Sets the loader's globals and each map's capacity for `plan`. Maps of
/// what is off shrink to one entry (a map cannot have none), so they cost
/// no kernel memory.
pub(super) fn configure<'a>(
    loader: &mut EbpfLoader<'a>,
    options: &SamplerOptions,
    plan: &'a Plan,
    globals: &'a Globals,
) {
    loader
        .override_global(globals::TASK_RUNTIME_OFFSET, &globals.runtime_offset, true)
        .override_global(globals::TASK_START_OFFSET, &globals.start_offset, true)
        .override_global(globals::PERIOD_NS, &globals.period_ns, true)
        .override_global(globals::ATTACH_NS, &globals.attach_ns, true)
        .override_global(globals::TASK_PID_OFFSET, &globals.pid_offset, true)
        .override_global(globals::OFF_CPU_SAMPLE_EVERY, &plan.sample_every, true)
        .override_global(globals::OFF_CPU_RECORD_BELOW, &plan.record_below, true)
        .override_global(globals::OFF_CPU_BUDGET_NS, &plan.budget_ns, true)
        .override_global(globals::OFF_CPU_MIN_NS, &plan.off_cpu_min_ns, true)
        .override_global(globals::TASK_FSBASE_OFFSET, &globals.fsbase_offset, true)
        .override_global(globals::UNWIND_MODE, &globals.unwind_mode, true)
        .override_global(globals::ALLOC_INTERVAL, &globals.alloc_interval, true)
        .override_global(
            globals::ALLOC_BLOCKS_PER_PROCESS,
            &globals.alloc_blocks_per_process,
            true,
        );
    if !plan.off_cpu {
        loader.map_max_entries(maps::OFF_CPU_WAITS, 1);
    }
    // The pending-waits slots serve only when some switches may go
    // unrecorded.
    if !plan.off_cpu || (plan.sample_every <= 1 && plan.budget == 0) {
        loader.map_max_entries(maps::OFF_CPU_PENDING, 1);
    }
    configure_walk(loader, options, plan);
}

/// The user-stack walk's maps: the kernel's stack traces (frame pointers)
/// or the sampler's own unwound stacks and tables, and the kernel stacks.
fn configure_walk(loader: &mut EbpfLoader, options: &SamplerOptions, plan: &Plan) {
    let sizes = plan.map_sizes;
    for name in maps::COUNTS {
        loader.map_max_entries(name, sizes.counts);
    }
    let (stack_trace_entries, unwound_entries) = if plan.tables {
        (1, sizes.user_stacks)
    } else {
        (sizes.user_stacks, 1)
    };
    for name in maps::USER_STACKS {
        loader.map_max_entries(name, stack_trace_entries);
    }
    for name in maps::UNWOUND_STACKS {
        loader.map_max_entries(name, unwound_entries);
    }
    // As the defaults: one stack in 16 may be deeper than MAX_STACK_DEPTH.
    for name in maps::UNWOUND_TAILS {
        loader.map_max_entries(name, (unwound_entries / 16).max(1));
    }
    let row_chunks = if plan.tables {
        u32::try_from(options.unwind_table_bytes / size_of::<UnwindRowChunk>() as u64)
            .unwrap_or(u32::MAX)
            .max(1)
    } else {
        1
    };
    // Whole groups: the outer array's entries are created as tables need them.
    let group_chunks = UNWIND_GROUP_CHUNKS as u32;
    let row_chunks = row_chunks.div_ceil(group_chunks) * group_chunks;
    loader.map_max_entries(maps::UNWIND_ROWS, row_chunks / group_chunks);
    loader.map_max_entries(maps::UNWIND_CHUNK_PCS, row_chunks);
    if !plan.tables {
        loader.map_max_entries(maps::UNWIND_TABLES, 1);
        loader.map_max_entries(maps::UNWIND_PROCESSES, 1);
    }
    if !plan.tables {
        // Allocation stacks are walked with the tables: no probes without them.
        for name in [maps::ALLOC_BLOCKS, maps::ALLOC_STACKS, maps::ALLOC_THREADS] {
            loader.map_max_entries(name, 1);
        }
    }
    if !plan.python {
        loader.map_max_entries(maps::PYTHON_PROCESSES, 1);
        loader.map_max_entries(maps::PYTHON_THREADS, 1);
    }
    for name in maps::KERNEL_STACKS {
        loader.map_max_entries(name, sizes.kernel_stacks);
    }
}

/// Buckets of a kernel stack-trace map per sample a drain can hold.
const KERNEL_STACK_BUCKETS_PER_SAMPLE: u64 = 8;
/// The fewest entries a kernel stack-trace map gets (1 MiB).
const KERNEL_STACK_MIN_ENTRIES: u64 = 1024;

/// Entries of each kernel stack-trace map: a stack-trace map is
/// preallocated whole (about 1 KiB an entry) and refuses a stack whose
/// bucket another holds (the sample then goes through the spill ring, which
/// costs more), so it is sized from the samples a drain can hold, 8 buckets
/// each (with every sample a different stack, at most one in 16 would
/// collide), a power of two, at least 1,024, the configured entries its
/// ceiling: 2,048 (2 MiB) at 99 Hz on 2 CPUs with 1 s drains, where a fixed
/// 8,192 took 8 MiB. Off-CPU records a stack per recorded switch, which the
/// frequency does not bound: the configured entries then.
fn kernel_stack_entries(options: &SamplerOptions, off_cpu: bool) -> u32 {
    let configured = options.map_sizes.kernel_stacks;
    if off_cpu {
        return configured;
    }
    let Ok(cpus) = aya::util::online_cpus() else {
        return configured;
    };
    let drain_ms = u64::try_from(options.drain_interval.as_millis()).unwrap_or(u64::MAX);
    let per_drain = options
        .frequency
        .saturating_mul(cpus.len() as u64)
        .saturating_mul(drain_ms)
        / 1000;
    let wanted = per_drain
        .saturating_mul(KERNEL_STACK_BUCKETS_PER_SAMPLE)
        .clamp(KERNEL_STACK_MIN_ENTRIES, 1 << 31)
        .next_power_of_two();
    u32::try_from(wanted).unwrap_or(u32::MAX).min(configured)
}

/// The bound below which the switch program's random u32 records a switch,
/// for one switch in `every`: 2^32 / `every`, rounded. A recorded wait
/// weighs `every`, where the draw's odds are exactly bound / 2^32; the two
/// differ by less than `every` / 2^33 (under 0.012% at the ceiling, 10^6).
fn record_below(every: u64) -> u64 {
    const DRAWS: u64 = 1 << 32;
    match every {
        0 | 1 => DRAWS,
        every => ((DRAWS + every / 2) / every).max(1),
    }
}

/// The budget of `budget` recorded switches per CPU per second at one in
/// `every`, as the program compares it: the least time (ns) its
/// OFF_CPU_RATE_SWITCHES switches may take without going over, rounded up
/// (0: no budget).
fn budget_ns(budget: u64, every: u64) -> u64 {
    if budget == 0 {
        return 0;
    }
    // Both at most 10^6 (clap and the file's ranges): no overflow.
    (globals::OFF_CPU_RATE_SWITCHES * 1_000_000_000).div_ceil(budget.saturating_mul(every.max(1)))
}

#[cfg(test)]
mod tests {
    use super::{budget_ns, record_below};

    #[test]
    fn the_budget_is_the_least_time_of_256_switches_recorded_within_it() {
        assert_eq!(budget_ns(0, 1), 0, "no budget");
        assert_eq!(
            budget_ns(1000, 1),
            256_000_000,
            "256 switches in under 256 ms are over 1000 a second"
        );
        assert_eq!(
            budget_ns(1000, 4),
            64_000_000,
            "one in 4 recorded: four times the rate"
        );
        assert_eq!(budget_ns(3, 1), 85_333_333_334, "rounded up");
        assert_eq!(budget_ns(1_000_000, 1_000_000), 1, "the ceilings");
    }

    #[test]
    fn the_draw_records_one_switch_in_every_with_odds_within_a_hundredth_of_a_percent() {
        assert_eq!(record_below(1), 1 << 32, "every switch");
        assert_eq!(record_below(0), 1 << 32, "0 is taken as 1");
        assert_eq!(record_below(2), 1 << 31);
        for every in [3_u64, 4, 16, 300, 1_000, 65_537, 999_999, 1_000_000] {
            let odds = record_below(every) as f64 / (1_u64 << 32) as f64;
            let bias = (odds * every as f64 - 1.0).abs();
            assert!(
                bias < 1.2e-4,
                "one in {every}: odds {odds} weigh {every} with a bias of {bias}"
            );
        }
    }
}
