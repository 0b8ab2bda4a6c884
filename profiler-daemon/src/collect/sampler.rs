//! Loading the embedded BPF object and attaching it to every online CPU.
//!
//! [`options`] says what is asked, [`setup`] configures the loader for it
//! (and says what this kernel allows), [`handles`] takes the maps out of
//! the loaded object; attaching is here.

mod handles;
mod limits;
mod options;
mod row_groups;
mod setup;

use std::{
    hash::{BuildHasher, RandomState},
    os::fd::AsFd,
    time::Duration,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, MapError, RingBuf},
    programs::{
        PerfEvent, RawTracePoint,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};
use aya_obj::generated::BPF_NOEXIST;
use nix::time::{ClockId, clock_gettime};
use profiler_common::{ProcessEvent, ProcessEventKind, maps, programs};

pub use handles::UnwindMaps;
pub use options::{
    DEFAULT_ALLOC_SAMPLE_BYTES, DEFAULT_OFF_CPU_BUDGET, MapSizes, OffCpuOptions, SamplerOptions, UnwindMode,
};

use super::{
    CollectError, Drainer, KernelNamer,
    off_cpu::ExactOffCpu,
    thread_cpu::read::{LedgerMaps, ThreadClock},
};
use crate::{
    error::Chain,
    kind::{KindSet, Source},
    procfs::ProcRoot,
};
use handles::{convert, program, take_drainer, take_map, take_unwind_maps};
use setup::Plan;

static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler-ebpf"));

/// The loaded and attached BPF program. Dropping it detaches everything.
pub struct Sampler {
    ebpf: Ebpf,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    cpus: usize,
    /// The maps' capacities as loaded.
    map_sizes: MapSizes,
    /// The kinds of samples recorded: those of the programs attached.
    kinds: KindSet,
}

impl Sampler {
    /// Loads the program, attaches it to cpu-clock on every online CPU and to
    /// the exec/exit tracepoints, and returns it with the drainer of its maps
    /// and the ring buffer of process events.
    pub fn start(
        options: &SamplerOptions,
        proc_root: &ProcRoot,
    ) -> Result<(Self, Drainer, RingBuf<MapData>, Option<UnwindMaps>), CollectError> {
        limits::raise_limits();
        let offsets = setup::task_offsets();
        let plan = setup::plan(options, &offsets);
        let globals = setup::Globals::new(options, &plan, &offsets);
        let mut loader = EbpfLoader::new();
        setup::configure(&mut loader, options, &plan, &globals);
        let mut ebpf = loader.load(BPF_OBJECT).map_err(CollectError::Load)?;
        // The program only logs rare events; a missing logger is not fatal.
        let logger = match aya_log::EbpfLogger::init(&mut ebpf) {
            Ok(logger) => Some(logger),
            Err(err) => {
                tracing::warn!("BPF-side logging unavailable: {}", Chain(&err));
                None
            }
        };
        let mut drainer = take_drainer(&mut ebpf, plan.tables)?;
        if offsets.runtime != 0 {
            let ledger_maps = LedgerMaps {
                exits: convert(&mut ebpf, maps::THREAD_EXITS)?,
                followed: convert(&mut ebpf, maps::CPU_FOLLOWED)?,
                thread_times: convert(&mut ebpf, maps::THREAD_TIMES)?,
            };
            if let Some(clock) = ThreadClock::new(proc_root.clone(), ledger_maps) {
                drainer.track_thread_cpu(clock, globals.attach_ns());
            }
        }
        if plan.off_cpu {
            // Not with a minimum: the kernel's figure holds the short waits
            // the sampler dropped.
            let sampled = (plan.sample_every > 1 || plan.budget != 0) && plan.off_cpu_min_ns == 0;
            drainer.track_waits(
                convert(&mut ebpf, maps::OFF_CPU_WAITS)?,
                plan.off_cpu_min_ns,
                sampled.then(|| ExactOffCpu::new(proc_root.clone())),
            );
        }
        let unwind = if plan.tables {
            Some(take_unwind_maps(&mut ebpf, plan.python)?)
        } else {
            None
        };
        let events = RingBuf::try_from(take_map(&mut ebpf, maps::PROCESS_EVENTS)?).map_err(|source| {
            CollectError::Map {
                name: maps::PROCESS_EVENTS,
                source,
            }
        })?;
        let cpus = attach(&mut ebpf, &plan, options.frequency)?;
        tracing::info!(
            cpus,
            frequency = options.frequency,
            off_cpu = plan.off_cpu,
            "sampler attached"
        );
        let sampler = Self {
            ebpf,
            logger,
            cpus,
            map_sizes: plan.map_sizes,
            kinds: KindSet::produced_by(|source| match source {
                Source::CpuClock => true,
                Source::SchedSwitch => plan.off_cpu,
                Source::AllocatorProbes => plan.tables,
            }),
        };
        Ok((sampler, drainer, events, unwind))
    }

    /// Number of CPUs sampled.
    pub fn cpus(&self) -> usize {
        self.cpus
    }

    /// The maps' capacities as loaded (the configured ones are ceilings).
    pub fn map_sizes(&self) -> MapSizes {
        self.map_sizes
    }

    /// The kinds of samples recorded: off-CPU waits when asked for and
    /// possible here.
    pub fn kinds(&self) -> KindSet {
        self.kinds
    }

    /// Hands the daemon's own process its instance now, as its first sample
    /// would, and returns the event that sample would have announced. The
    /// daemon is sure to be sampled sooner or later; meeting it here puts
    /// reading its mappings and compiling its unwind table (~60k rows, a few
    /// ms of CPU) with the rest of start-up instead of at a random moment
    /// seconds later, when it may be measured as the cost at rest.
    /// None when `only` (record's `--pid`) leaves the daemon out, when the
    /// program met it first (its event is in the ring), or on an error,
    /// logged: its first sample then meets it as any other process.
    pub fn meet_own_process(&mut self, proc_root: &ProcRoot, only: &[u32]) -> Option<ProcessEvent> {
        // The pid the sampler sees: the host's when in a container.
        let tgid = proc_root
            .own_pid()
            .inspect_err(|err| {
                tracing::warn!("the daemon's own pid in {}: {err}", proc_root.path().display())
            })
            .ok()?;
        if !only.is_empty() && !only.contains(&tgid) {
            return None;
        }
        let Some(map) = self.ebpf.map_mut(maps::PROCESSES) else {
            tracing::warn!("the program has no {} map", maps::PROCESSES);
            return None;
        };
        let mut processes: HashMap<&mut MapData, u32, u32> = HashMap::try_from(map)
            .inspect_err(|err| tracing::warn!("{}: {}", maps::PROCESSES, Chain(err)))
            .ok()?;
        // Random like the program's (see process.rs), never 0 ("unknown").
        let instance = RandomState::new().hash_one(tgid) as u32 | 1;
        match processes.insert(&tgid, &instance, u64::from(BPF_NOEXIST)) {
            Ok(()) => Some(ProcessEvent {
                // The program's clock (bpf_ktime_get_ns is CLOCK_MONOTONIC).
                ktime_ns: clock_gettime(ClockId::CLOCK_MONOTONIC)
                    .map_or(0, |now| Duration::from(now).as_nanos() as u64),
                kind: ProcessEventKind::Started as u32,
                tgid,
                instance,
                reserved: 0,
            }),
            Err(MapError::SyscallError(err)) if err.io_error.raw_os_error() == Some(libc::EEXIST) => None,
            Err(err) => {
                tracing::warn!("meeting the daemon's own process at start-up: {}", Chain(&err));
                None
            }
        }
    }

    /// Forwards pending BPF-side log records to the daemon's log.
    pub fn flush_logs(&mut self) {
        if let Some(logger) = &mut self.logger {
            logger.flush();
        }
    }

    /// The loaded object: the allocation tracer attaches its programs.
    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    /// The allocation probes' maps, when their programs can run here
    /// (table unwinding); taken once.
    pub fn take_allocation_maps(
        &mut self,
        interval: u64,
        proc_root: crate::procfs::ProcRoot,
    ) -> Result<Option<super::allocations::AllocationMaps>, CollectError> {
        if !self.kinds.contains(crate::kind::SampleKind::Alloc) {
            return Ok(None);
        }
        let ebpf = &mut self.ebpf;
        let handles = super::allocations::AllocationMapHandles {
            traced: convert(ebpf, maps::ALLOC_TRACED)?,
            threads: convert(ebpf, maps::ALLOC_THREADS)?,
            blocks: convert(ebpf, maps::ALLOC_BLOCKS)?,
            stacks: convert(ebpf, maps::ALLOC_STACKS)?,
            draws: convert(ebpf, maps::ALLOC_DRAWS)?,
        };
        super::allocations::AllocationMaps::new(handles, interval, proc_root).map(Some)
    }

    /// The program that names kernel addresses for the symbolizer, loaded
    /// (never attached), with its output map; taken once. An error: this
    /// kernel cannot run it (the symbolizer then reads kallsyms).
    pub fn take_kernel_namer(&mut self) -> Result<KernelNamer, CollectError> {
        let name = programs::KERNEL_NAMES;
        let namer: &mut RawTracePoint = program(&mut self.ebpf, name)?;
        namer
            .load()
            .map_err(|source| CollectError::Program { name, source })?;
        let fd = namer
            .fd()
            .map_err(|source| CollectError::Program { name, source })?
            .as_fd()
            .try_clone_to_owned()
            .map_err(|err| CollectError::Program {
                name,
                source: aya::programs::ProgramError::IOError(err),
            })?;
        Ok(KernelNamer::new(fd, convert(&mut self.ebpf, maps::KERNEL_NAMES)?))
    }

    /// Ids of the loaded programs (for tests and diagnostics).
    pub fn program_ids(&self) -> Vec<u32> {
        self.ebpf
            .programs()
            .filter_map(|(_, program)| program.info().ok().map(|info| info.id()))
            .collect()
    }
}

/// Attaches the programs `plan` turns on; the number of CPUs sampled.
fn attach(ebpf: &mut Ebpf, plan: &Plan, frequency: u64) -> Result<usize, CollectError> {
    // Tracepoints first, so no process is announced before exec/exit are tracked.
    let mut tracepoints = vec![
        (programs::ON_EXEC, "sched_process_exec"),
        (programs::ON_EXIT, "sched_process_exit"),
    ];
    if plan.off_cpu {
        tracepoints.push((programs::ON_SWITCH, "sched_switch"));
    }
    for (name, tracepoint) in tracepoints {
        let program: &mut RawTracePoint = program(ebpf, name)?;
        program
            .load()
            .map_err(|source| CollectError::Program { name, source })?;
        program
            .attach(tracepoint)
            .map_err(|source| CollectError::Program { name, source })?;
    }
    let cpus = aya::util::online_cpus().map_err(|(what, err)| CollectError::OnlineCpus(what, err))?;
    let sample: &mut PerfEvent = program(ebpf, programs::SAMPLE)?;
    sample.load().map_err(|source| CollectError::Program {
        name: programs::SAMPLE,
        source,
    })?;
    for &cpu in &cpus {
        sample
            .attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(frequency),
                false,
            )
            .map_err(|source| CollectError::AttachCpu { cpu, source })?;
    }
    Ok(cpus.len())
}

#[cfg(test)]
mod tests {
    use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

    use super::BPF_OBJECT;

    /// The kernel and aya read BTF only; the DWARF build.rs drops was most
    /// of the object, paged in by the daemon when it parses it at start.
    #[test]
    fn the_embedded_object_keeps_its_btf_and_not_its_dwarf() {
        let file = object::File::parse(BPF_OBJECT).expect("the embedded BPF object parses");
        for needed in [".BTF", ".BTF.ext"] {
            assert!(file.section_by_name(needed).is_some(), "{needed} missing");
        }
        let dwarf: Vec<_> = file
            .sections()
            .filter_map(|section| section.name().ok().map(str::to_owned))
            .filter(|name| name.contains(".debug_"))
            .collect();
        assert!(dwarf.is_empty(), "DWARF left in the object: {dwarf:?}");
    }

    /// The row search is a global function, which the verifier checks once,
    /// rather than a static one it checks at each call for every state the
    /// walk's step is entered with: loading took 0.15 s of CPU that way.
    #[test]
    fn the_row_search_is_a_global_function() {
        let file = object::File::parse(BPF_OBJECT).expect("the embedded BPF object parses");
        let search = file
            .symbols()
            .find(|symbol| symbol.name() == Ok("profilerd_find_row"))
            .expect("profilerd_find_row in the object's symbols");
        assert!(search.is_global(), "profilerd_find_row is not global: {search:?}");
        assert_eq!(search.kind(), object::SymbolKind::Text);
    }
}
