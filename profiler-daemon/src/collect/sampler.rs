//! Loading the embedded BPF object and attaching it to every online CPU.

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf, StackTraceMap},
    programs::{
        PerfEvent, RawTracePoint,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};
use profiler_common::{
    SampleKey, SampleValue, UnwindProcess, UnwindRowChunk, UnwindTableRange, UnwoundStack, globals, maps,
    programs, python::PythonProcess, unwind_mode,
};

use super::{CollectError, Drainer, btf, clock::monotonic_now_ns, drain::UserStackMaps};
use crate::{
    error::Chain,
    kind::{KindSet, Source},
};

static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler-ebpf"));

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
}

impl SamplerOptions {
    /// Turns on the program of `source` (`record --type` asks for what its
    /// type needs).
    pub fn enable(&mut self, source: Source) {
        match source {
            Source::CpuClock => {}
            Source::SchedSwitch => self.off_cpu.enabled = true,
        }
    }
}

/// Off-CPU profiling: the sched_switch program, when enabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffCpuOptions {
    pub enabled: bool,
    /// One switch in N is recorded, and weighs N (1: every switch).
    pub sample_every: u64,
    /// Waits shorter than this are dropped when they end (nanoseconds).
    pub min_ns: u64,
}

impl Default for OffCpuOptions {
    fn default() -> Self {
        Self {
            enabled: false,
            sample_every: 1,
            min_ns: 0,
        }
    }
}

/// The maps the daemon fills for the sampler's own walk (auto mode).
pub struct UnwindMaps {
    pub rows: Array<MapData, UnwindRowChunk>,
    /// The first pc of each chunk of `rows`.
    pub chunk_pcs: Array<MapData, u32>,
    pub tables: Array<MapData, UnwindTableRange>,
    pub processes: HashMap<MapData, u32, UnwindProcess>,
    /// Where each CPython process's interpreter is; None with Python frames off.
    pub python: Option<HashMap<MapData, u32, PythonProcess>>,
    /// Code objects the sampler announces (see `python::prefetch`).
    pub python_codes: Option<RingBuf<MapData>>,
}

/// The loaded and attached BPF program. Dropping it detaches everything.
pub struct Sampler {
    ebpf: Ebpf,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    cpus: usize,
    /// The kinds of samples recorded: those of the programs attached.
    kinds: KindSet,
}

impl Sampler {
    /// Loads the program, attaches it to cpu-clock on every online CPU and to
    /// the exec/exit tracepoints, and returns it with the drainer of its maps
    /// and the ring buffer of process events.
    pub fn start(
        options: &SamplerOptions,
    ) -> Result<(Self, Drainer, RingBuf<MapData>, Option<UnwindMaps>), CollectError> {
        raise_limits();
        let sizes = options.map_sizes;
        let mut loader = EbpfLoader::new();
        // Per-thread CPU time comes from the kernel's task_struct; without BTF
        // samples still count, and carry one sampling period each.
        let offsets = match btf::task_offsets() {
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
        };
        let runtime_offset = u64::from(offsets.runtime);
        let start_offset = u64::from(offsets.start_time);
        let period_ns = 1_000_000_000 / options.frequency.max(1);
        let attach_ns = monotonic_now_ns();
        loader
            .override_global(globals::TASK_RUNTIME_OFFSET, &runtime_offset, true)
            .override_global(globals::TASK_START_OFFSET, &start_offset, true)
            .override_global(globals::PERIOD_NS, &period_ns, true)
            .override_global(globals::ATTACH_NS, &attach_ns, true);
        let off_cpu = options.off_cpu;
        if off_cpu.enabled && offsets.pid == 0 {
            tracing::warn!("off-CPU profiling needs the kernel's BTF (task_struct.pid): it is off");
        }
        let off_cpu_on = off_cpu.enabled && offsets.pid != 0;
        let pid_offset = u64::from(offsets.pid);
        let sample_every = off_cpu.sample_every.max(1);
        loader
            .override_global(globals::TASK_PID_OFFSET, &pid_offset, true)
            .override_global(globals::OFF_CPU_SAMPLE_EVERY, &sample_every, true)
            .override_global(globals::OFF_CPU_MIN_NS, &off_cpu.min_ns, true);
        if !off_cpu_on {
            loader.map_max_entries(maps::OFF_CPU_WAITS, 1);
        }
        let tables = options.unwind == UnwindMode::Auto;
        let mode = if tables {
            unwind_mode::TABLES
        } else {
            unwind_mode::FRAME_POINTERS
        };
        loader.override_global(globals::UNWIND_MODE, &mode, true);
        for name in maps::COUNTS {
            loader.map_max_entries(name, sizes.counts);
        }
        // Only the maps of the chosen walk get their capacity; the others
        // shrink to one entry (a map cannot have none).
        let (stack_trace_entries, unwound_entries) = if tables {
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
        let row_chunks = if tables {
            u32::try_from(options.unwind_table_bytes / size_of::<UnwindRowChunk>() as u64)
                .unwrap_or(u32::MAX)
                .max(1)
        } else {
            1
        };
        loader.map_max_entries(maps::UNWIND_ROWS, row_chunks);
        loader.map_max_entries(maps::UNWIND_CHUNK_PCS, row_chunks);
        if !tables {
            loader.map_max_entries(maps::UNWIND_TABLES, 1);
            loader.map_max_entries(maps::UNWIND_PROCESSES, 1);
        }
        let python = tables && options.python_frames && offsets.fsbase != 0;
        if tables && options.python_frames && !python {
            tracing::warn!("Python frames need the kernel's BTF (task_struct.thread.fsbase): they are off");
        }
        if !python {
            loader.map_max_entries(maps::PYTHON_PROCESSES, 1);
            loader.map_max_entries(maps::PYTHON_THREADS, 1);
        }
        let fsbase_offset = if python { u64::from(offsets.fsbase) } else { 0 };
        loader.override_global(globals::TASK_FSBASE_OFFSET, &fsbase_offset, true);
        for name in maps::KERNEL_STACKS {
            loader.map_max_entries(name, sizes.kernel_stacks);
        }
        let mut ebpf = loader.load(BPF_OBJECT).map_err(CollectError::Load)?;
        // The program only logs rare events; a missing logger is not fatal.
        let logger = match aya_log::EbpfLogger::init(&mut ebpf) {
            Ok(logger) => Some(logger),
            Err(err) => {
                tracing::warn!("BPF-side logging unavailable: {}", Chain(&err));
                None
            }
        };

        let mut drainer = take_drainer(&mut ebpf, tables)?;
        if off_cpu_on {
            drainer.track_waits(
                convert(&mut ebpf, maps::OFF_CPU_WAITS)?,
                sample_every,
                off_cpu.min_ns,
            );
        }
        let unwind = if tables {
            Some(UnwindMaps {
                rows: convert(&mut ebpf, maps::UNWIND_ROWS)?,
                chunk_pcs: convert(&mut ebpf, maps::UNWIND_CHUNK_PCS)?,
                tables: convert(&mut ebpf, maps::UNWIND_TABLES)?,
                processes: convert(&mut ebpf, maps::UNWIND_PROCESSES)?,
                python: if python {
                    Some(convert(&mut ebpf, maps::PYTHON_PROCESSES)?)
                } else {
                    None
                },
                python_codes: if python {
                    Some(convert(&mut ebpf, maps::PYTHON_CODES)?)
                } else {
                    None
                },
            })
        } else {
            None
        };
        let events = RingBuf::try_from(take_map(&mut ebpf, maps::PROCESS_EVENTS)?).map_err(|source| {
            CollectError::Map {
                name: maps::PROCESS_EVENTS,
                source,
            }
        })?;

        // Tracepoints first, so no process is announced before exec/exit are tracked.
        for (name, tracepoint) in [
            (programs::ON_EXEC, "sched_process_exec"),
            (programs::ON_EXIT, "sched_process_exit"),
        ] {
            let program: &mut RawTracePoint = program(&mut ebpf, name)?;
            program
                .load()
                .map_err(|source| CollectError::Program { name, source })?;
            program
                .attach(tracepoint)
                .map_err(|source| CollectError::Program { name, source })?;
        }

        if off_cpu_on {
            let name = programs::ON_SWITCH;
            let program: &mut RawTracePoint = program(&mut ebpf, name)?;
            program
                .load()
                .map_err(|source| CollectError::Program { name, source })?;
            program
                .attach("sched_switch")
                .map_err(|source| CollectError::Program { name, source })?;
        }
        let cpus = aya::util::online_cpus().map_err(|(what, err)| CollectError::OnlineCpus(what, err))?;
        let sample: &mut PerfEvent = program(&mut ebpf, programs::SAMPLE)?;
        sample.load().map_err(|source| CollectError::Program {
            name: programs::SAMPLE,
            source,
        })?;
        for &cpu in &cpus {
            sample
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(options.frequency),
                    false,
                )
                .map_err(|source| CollectError::AttachCpu { cpu, source })?;
        }
        tracing::info!(
            cpus = cpus.len(),
            frequency = options.frequency,
            off_cpu = off_cpu_on,
            "sampler attached"
        );
        Ok((
            Self {
                ebpf,
                logger,
                cpus: cpus.len(),
                kinds: KindSet::produced_by(|source| match source {
                    Source::CpuClock => true,
                    Source::SchedSwitch => off_cpu_on,
                }),
            },
            drainer,
            events,
            unwind,
        ))
    }

    /// Number of CPUs sampled.
    pub fn cpus(&self) -> usize {
        self.cpus
    }

    /// The kinds of samples recorded: off-CPU waits when asked for and
    /// possible here.
    pub fn kinds(&self) -> KindSet {
        self.kinds
    }

    /// Forwards pending BPF-side log records to the daemon's log.
    pub fn flush_logs(&mut self) {
        if let Some(logger) = &mut self.logger {
            logger.flush();
        }
    }

    /// Ids of the loaded programs (for tests and diagnostics).
    pub fn program_ids(&self) -> Vec<u32> {
        self.ebpf
            .programs()
            .filter_map(|(_, program)| program.info().ok().map(|info| info.id()))
            .collect()
    }
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, CollectError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let program = ebpf.program_mut(name).ok_or(CollectError::Program {
        name,
        source: aya::programs::ProgramError::UnexpectedProgramType,
    })?;
    program
        .try_into()
        .map_err(|source| CollectError::Program { name, source })
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, CollectError> {
    ebpf.take_map(name).ok_or(CollectError::MissingMap { name })
}

fn convert<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<T, CollectError> {
    T::try_from(take_map(ebpf, name)?).map_err(|source| CollectError::Map { name, source })
}

fn take_drainer(ebpf: &mut Ebpf, unwound: bool) -> Result<Drainer, CollectError> {
    let counts: [HashMap<MapData, SampleKey, SampleValue>; 2] =
        [convert(ebpf, maps::COUNTS[0])?, convert(ebpf, maps::COUNTS[1])?];
    let user_stacks = if unwound {
        let maps: [HashMap<MapData, u32, UnwoundStack>; 2] = [
            convert(ebpf, maps::UNWOUND_STACKS[0])?,
            convert(ebpf, maps::UNWOUND_STACKS[1])?,
        ];
        UserStackMaps::Unwound(maps)
    } else {
        let maps: [StackTraceMap<MapData>; 2] = [
            convert(ebpf, maps::USER_STACKS[0])?,
            convert(ebpf, maps::USER_STACKS[1])?,
        ];
        UserStackMaps::StackTraces(maps)
    };
    let kernel_stacks: [StackTraceMap<MapData>; 2] = [
        convert(ebpf, maps::KERNEL_STACKS[0])?,
        convert(ebpf, maps::KERNEL_STACKS[1])?,
    ];
    let control: Array<MapData, u32> = convert(ebpf, maps::CONTROL)?;
    let counters: PerCpuArray<MapData, u64> = convert(ebpf, maps::COUNTERS)?;
    let spilled: RingBuf<MapData> = convert(ebpf, maps::SPILLED_SAMPLES)?;
    Ok(Drainer::new(
        counts,
        user_stacks,
        kernel_stacks,
        control,
        counters,
        spilled,
    ))
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK: lift it so they
/// load. Every mapped file of every sampled process is held open: lift the
/// descriptor limit to its hard maximum.
fn raise_limits() {
    let mut files = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write one valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut files) == 0 && files.rlim_cur < files.rlim_max {
            files.rlim_cur = files.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &files);
        }
    }
    let limit = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads a valid, initialised struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) } != 0 {
        tracing::debug!(
            "could not raise RLIMIT_MEMLOCK: {}",
            std::io::Error::last_os_error()
        );
    }
}
