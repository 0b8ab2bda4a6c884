//! Stage 2: raw samples (addresses) -> symbolized samples (functions).
//!
//! Runs on its own thread: resolution is blocking work that must not stall
//! the drain or the server. The ELF and DWARF of user binaries, which other
//! users control, are parsed in a separate, unprivileged [`worker`] process.

mod build;
mod demangle;
mod kernel_symbols;
pub mod metrics;
mod perf_maps;
mod processes;
mod python_frames;
mod resolver;
mod stack;
mod turns;
pub mod worker;

use std::{collections::HashMap, sync::Arc};

pub use metrics::SymbolizeStatus;
pub use perf_maps::PerfMapStats;
pub use processes::ProcessStats;
pub use resolver::ResolverStats;
#[cfg(test)]
pub use stack::user_stack;
pub use stack::{FrameKind, Function, Line, Location, Mapping, SymbolizedSample, SymbolizedStack};

use crate::{
    cgroup::{CgroupResolver, CgroupStats},
    collect::{
        KernelNamer, OpenFiles, ProcessNotice, ProcessSnapshot, RawBatch, ReadableBy, SnapshotReader,
        UNSAMPLED_CPU, UNSAMPLED_CPU_STACK_ID,
    },
    procfs::ProcRoot,
    python::{names::PythonNameStats, prefetch::PythonNews},
    shares::Owner,
};
use build::{
    BuiltStacks, Namers, StackIds, build_stack, is_jit_code, return_adjusted, stack_ids, stack_source,
};
use perf_maps::PerfMaps;
use processes::ProcessTable;
use profiler_common::python::is_python_frame;
use python_frames::PythonFrames;
use resolver::Resolver;
use worker::WorkerConfig;

/// Cumulative symbolizer counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct SymbolizerStats {
    pub resolver: ResolverStats,
    pub processes: ProcessStats,
    pub cgroups: CgroupStats,
    pub python: PythonNameStats,
    pub perf_maps: PerfMapStats,
    /// Stacks taken whole from the previous batch, not built again.
    pub stacks_reused: u64,
}

pub struct Symbolizer {
    resolver: Resolver,
    processes: ProcessTable,
    kernel_mapping: Arc<Mapping>,
    names: HashMap<[u8; profiler_common::COMM_LEN], Arc<str>>,
    cgroups: CgroupResolver,
    python: PythonFrames,
    /// JIT code named from its runtime's perf map.
    perf_maps: PerfMaps,
    /// Processes with a sampled address in anonymous executable memory in
    /// this batch: their perf maps are looked at.
    /// With whether some of it is code its map does not name yet.
    jit_seen: Vec<(u32, u32, bool)>,
    /// CPython processes found, and code objects read ahead.
    python_news: Option<std::sync::mpsc::Receiver<PythonNews>>,
    /// Samples of a kind this daemon does not know (a mismatched BPF object).
    unknown_kinds: u64,
    /// The previous batch's stacks that a later one may take as they are.
    built: BuiltStacks,
}

impl Symbolizer {
    /// `files` is the registry the process watcher opens files into too;
    /// `proc` where the sampled processes' /proc is.
    /// `kernel_namer` names kernel addresses (None: kallsyms does).
    pub fn new(
        worker: WorkerConfig,
        files: OpenFiles,
        proc: ProcRoot,
        kernel_namer: Option<KernelNamer>,
    ) -> Self {
        // The snapshot reader finds the cgroup hierarchy once for both.
        let reader = SnapshotReader::new(files, proc.clone());
        let cgroups = CgroupResolver::new(proc.clone(), reader.cgroup_root());
        Self {
            resolver: Resolver::new(worker, kernel_namer),
            processes: ProcessTable::new(reader),
            kernel_mapping: Arc::new(Mapping {
                start: 0,
                limit: u64::MAX,
                file_offset: 0,
                path: "[kernel.kallsyms]".into(),
                build_id: None,
            }),
            names: HashMap::new(),
            cgroups,
            python: PythonFrames::default(),
            perf_maps: PerfMaps::new(proc),
            jit_seen: Vec::new(),
            python_news: None,
            unknown_kinds: 0,
            built: BuiltStacks::default(),
        }
    }

    pub fn notice(&mut self, notice: ProcessNotice) {
        match notice {
            ProcessNotice::Started(snapshot) => {
                if let Some((id, path)) = &snapshot.cgroup {
                    self.cgroups.learn(*id, path);
                }
                // Its mappings as read now: its held stacks may name
                // other files (a library unloaded, another at its place).
                self.built.forget(snapshot.pid, snapshot.instance);
                self.processes.insert(snapshot, &mut self.resolver);
            }
            ProcessNotice::Exited { pid, instance } => {
                self.built.forget(pid, instance);
                self.processes.exited(pid, instance);
                self.python.exited(pid, instance);
                self.perf_maps.exited(pid, instance);
            }
        }
    }

    /// Where news of Python processes come from: the CPython processes the
    /// table manager finds and the code objects read ahead (taken in before
    /// each batch: the sampler walks a process's Python frames only once it
    /// was found, so its samples come after).
    pub fn python_from(mut self, news: std::sync::mpsc::Receiver<PythonNews>) -> Self {
        self.python_news = Some(news);
        self
    }

    /// Mappings read during symbolization (late or after a dlopen) since
    /// the last call.
    pub fn take_fresh_snapshots(&mut self) -> Vec<ProcessSnapshot> {
        self.processes.take_fresh()
    }

    pub fn stats(&self) -> SymbolizerStats {
        SymbolizerStats {
            resolver: self.resolver.stats,
            processes: self.processes.stats,
            cgroups: self.cgroups.stats,
            python: self.python.stats(),
            perf_maps: self.perf_maps.stats,
            stacks_reused: self.built.reused,
        }
    }

    /// Pass 1 of [`Symbolizer::symbolize`]: finds every address of the
    /// batch not yet cached and resolves them a file at a time. Returns the
    /// batch's stacks an earlier batch built, taken whole (their addresses
    /// need no lookup; pass 2 starts from them).
    fn resolve_addresses(&mut self, batch: &RawBatch) -> HashMap<StackIds, Arc<SymbolizedStack>> {
        let mut stale = Vec::new();
        let mut taken = HashMap::new();
        let mut looked = std::collections::HashSet::new();
        for sample in &batch.samples {
            let key = sample.key;
            if let Some(ids) = stack_ids(key) {
                if taken.contains_key(&ids) {
                    continue;
                }
                if looked.insert(ids)
                    && let Some(stack) = self.built.get(&stack_source(key, ids.4, batch))
                {
                    taken.insert(ids, stack);
                    continue;
                }
            }
            if !self.want_stack(sample.key, batch) {
                stale.push((sample.key.tgid, sample.key.instance));
            }
        }
        // Addresses outside every known mapping: the snapshot predates a later
        // mmap (dlopen, or a first sample inside the dynamic loader). Re-read
        // the mappings of processes that still run, once per batch.
        stale.sort_unstable();
        stale.dedup();
        for (pid, instance) in stale {
            if self.processes.refresh(pid, instance, &mut self.resolver) {
                self.built.forget(pid, instance);
                taken.retain(|ids: &StackIds, _| (ids.0, ids.1) != (pid, instance));
                for sample in batch
                    .samples
                    .iter()
                    .filter(|s| (s.key.tgid, s.key.instance) == (pid, instance))
                {
                    self.want_stack(sample.key, batch);
                }
            }
        }
        // One look per process: unnamed code first in the sort, kept by dedup.
        self.jit_seen
            .sort_unstable_by_key(|&(pid, instance, unnamed)| (pid, instance, !unnamed));
        self.jit_seen
            .dedup_by_key(|&mut (pid, instance, _)| (pid, instance));
        self.perf_maps.begin_batch();
        for (pid, instance, unnamed) in std::mem::take(&mut self.jit_seen) {
            let ns_pid = self
                .processes
                .get_or_load(pid, instance, &mut self.resolver)
                .and_then(|process| process.ns_pid);
            self.perf_maps
                .refresh(pid, instance, ns_pid, unnamed, &mut self.resolver);
        }
        self.resolver.resolve_pending();
        self.processes.attach_build_ids(&self.resolver);
        // Processes first read just now (no early snapshot) name their cgroups too.
        for snapshot in self.processes.fresh() {
            if let Some((id, path)) = &snapshot.cgroup {
                self.cgroups.learn(*id, path);
            }
        }
        taken
    }

    /// Symbolizes one drained batch. Samples without a stack keep an empty one.
    pub fn symbolize(&mut self, batch: &RawBatch) -> Vec<SymbolizedSample> {
        if let Some(news) = &self.python_news {
            while let Ok(news) = news.try_recv() {
                self.python.news(news);
            }
        }
        let taken = self.resolve_addresses(batch);
        let cgroups = self.cgroups.resolve(
            batch
                .samples
                .iter()
                .map(|sample| (sample.key.cgroup_id, sample.key.tgid)),
        );

        // Pass 2: build each distinct stack once per batch from the caches,
        // but those taken whole.
        let mut stacks: HashMap<StackIds, Arc<SymbolizedStack>> = taken;
        let mut out = Vec::with_capacity(batch.samples.len());
        for sample in &batch.samples {
            let key = sample.key;
            let Some(kind) = crate::kind::SampleKind::from_bpf(key.kind) else {
                // Only a BPF object other than the embedded one could send
                // these: say so once, loudly, rather than on every drain.
                if self.unknown_kinds == 0 {
                    tracing::warn!(
                        kind = key.kind,
                        "samples of an unknown kind are dropped (a mismatched BPF object?)"
                    );
                }
                self.unknown_kinds += 1;
                continue;
            };
            let thread_name = self.name(&key.comm);
            let process = self
                .processes
                .get_or_load(key.tgid, key.instance, &mut self.resolver);
            let comm = match process {
                Some(process) if !process.comm.is_empty() => process.comm.clone(),
                _ => thread_name.clone(),
            };
            let readable_by = process.map_or(ReadableBy::Privileged, |process| process.readable_by);
            let ns_pid = process.and_then(|process| process.ns_pid);
            let ends_in_switch = kind.describe().ends_in_switch;
            let stack = stacks
                .entry((
                    key.tgid,
                    key.instance,
                    key.user_stack_id,
                    key.kernel_stack_id,
                    ends_in_switch,
                ))
                .or_insert_with(|| {
                    if key.user_stack_id == UNSAMPLED_CPU_STACK_ID {
                        return Arc::new(SymbolizedStack::placeholder(UNSAMPLED_CPU));
                    }
                    let source = stack_source(key, ends_in_switch, batch);
                    let namers = Namers {
                        resolver: &self.resolver,
                        perf_maps: &self.perf_maps,
                        kernel_mapping: &self.kernel_mapping,
                    };
                    let built = build_stack(
                        namers,
                        &mut self.python,
                        (key.tgid, key.instance),
                        process,
                        source.kernel.as_deref(),
                        source.user.as_deref(),
                    );
                    let mut stack = built.stack;
                    if ends_in_switch {
                        stack.trim_switch_frames();
                    }
                    let stack = Arc::new(stack);
                    self.built.keep(source, &stack, built.moving_code);
                    stack
                })
                .clone();
            out.push(SymbolizedSample {
                kind,
                pid: key.tgid,
                tid: key.tid,
                comm,
                readable_by,
                thread_name,
                stack,
                count: sample.count,
                amount: sample.amount,
                cgroup: cgroups.get(&key.cgroup_id).cloned(),
                ns_pid,
            });
        }
        for file in self.processes.end_batch() {
            self.resolver.forget_file(&file);
        }
        self.python.end_batch();
        self.built.end_batch();
        out
    }

    /// Queues the sample's addresses for resolution; false if a user address
    /// fell outside every known mapping of its process.
    fn want_stack(&mut self, key: profiler_common::SampleKey, batch: &RawBatch) -> bool {
        if let Some(stack) = stack_of(&batch.kernel_stacks, key.kernel_stack_id) {
            for (index, &ip) in stack.iter().enumerate() {
                self.resolver.want_kernel(return_adjusted(ip, index > 0));
            }
        }
        let Some(stack) = stack_of(&batch.user_stacks, key.user_stack_id) else {
            return true;
        };
        let after_kernel = key.kernel_stack_id >= 0;
        let Some(process) = self
            .processes
            .get_or_load(key.tgid, key.instance, &mut self.resolver)
        else {
            return true;
        };
        let owner = Owner::from(process.readable_by);
        let mut all_mapped = true;
        for (index, &ip) in stack.iter().enumerate() {
            if is_python_frame(ip) {
                continue;
            }
            let address = return_adjusted(ip, index > 0 || after_kernel);
            match process.mapping_of(address) {
                // JIT code: its map is looked at, soon if it does not name
                // this code yet.
                Some(mapping) if is_jit_code(mapping) => {
                    let unnamed = self.perf_maps.lines(key.tgid, key.instance, address).is_none();
                    // One entry per run of frames alike (most of a stack's).
                    let seen = (key.tgid, key.instance, unnamed);
                    if self.jit_seen.last() != Some(&seen) {
                        self.jit_seen.push(seen);
                    }
                }
                Some(mapping) => {
                    if let Some(file) = &mapping.file {
                        self.resolver
                            .want_user(file, address - mapping.start + mapping.offset, owner);
                    }
                }
                None => all_mapped = false,
            }
        }
        all_mapped
    }

    fn name(&mut self, comm: &[u8; profiler_common::COMM_LEN]) -> Arc<str> {
        self.names
            .entry(*comm)
            .or_insert_with(|| {
                let len = comm.iter().position(|&byte| byte == 0).unwrap_or(comm.len());
                String::from_utf8_lossy(&comm[..len]).into()
            })
            .clone()
    }
}

fn stack_of(stacks: &HashMap<u32, Arc<[u64]>>, id: i32) -> Option<&[u64]> {
    u32::try_from(id)
        .ok()
        .and_then(|id| stacks.get(&id))
        .map(|stack| &**stack)
}
