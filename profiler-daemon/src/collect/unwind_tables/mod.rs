//! The unwind tables the sampler's own user-stack walk reads (`--unwind
//! auto`): for every file a sampled process maps, its CFI compiled into a
//! sorted row table (by the sandboxed worker: `.eh_frame` is hostile input),
//! loaded once into the rows map and shared by every process that maps the
//! file; and for every process, its executable mappings with each one's
//! table and load bias.
//!
//! Kernel memory is bounded by the rows map's size; when a table does not
//! fit, the tables of the least recently sampled files are evicted, among
//! those the placing process's owner may evict: its own, and those of
//! owners over their share ([`charges`]). A process
//! whose tables are not loaded (yet, or any more) is still walked, with
//! frame pointers.

mod charges;
mod loading;
pub mod metrics;
mod placement;
mod process_entry;
mod python_entry;
mod space;
mod stats;
mod usage;

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, atomic::Ordering, mpsc},
    time::{Duration, Instant},
};

use profiler_common::UnwindRow;

use super::{FileKey, FileVersion, MappedFile, ProcessSnapshot, UnwindMaps};
use crate::{
    python::detect::{Detected, DetectionStats, PythonSymbols},
    shares::Shares,
};
pub use charges::{LOSS_REASONS, TableLosses};
pub use process_entry::{LoadSegment, load_bias};
use space::RowSpace;
pub use stats::UnwindStats;
pub use usage::SampledStacks;
use usage::Usage;

/// A file's table as the worker compiled it.
#[derive(Debug, Default)]
pub struct CompiledTable {
    pub rows: Vec<UnwindRow>,
    /// The file's PT_LOAD segments, to find each mapping's load bias.
    pub segments: Vec<LoadSegment>,
    pub compile_time: Duration,
    /// The file is a CPython interpreter.
    pub python: Option<crate::python::detect::PythonSymbols>,
}

/// Whoever turns a file into a table (the worker; tests may use another).
pub trait TableCompiler {
    /// The file's table, or why there is none.
    fn compile(&mut self, file: &MappedFile) -> Result<CompiledTable, String>;
}

/// What the other stages tell the table manager.
#[derive(Debug)]
pub enum UnwindInput {
    Started(ProcessSnapshot),
    Exited {
        pid: u32,
    },
    /// What the last drain sampled: which tables are useful.
    Sampled(SampledStacks),
}

/// A table that was evicted, or found no room, is not tried again sooner
/// than this: each try costs a compile.
const RELOAD_PAUSE: Duration = Duration::from_secs(3);

/// Usage entries of files without a table are dropped once below this.
const FORGOTTEN: f64 = 1e-3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FileId {
    key: FileKey,
    version: FileVersion,
}

#[derive(Debug)]
enum TableState {
    Loaded {
        first_chunk: u32,
        chunks: u32,
        rows: u32,
    },
    Evicted {
        at: Instant,
    },
    /// No table (no CFI, unreadable, too large): frame pointers for this file.
    Unavailable,
}

#[derive(Debug)]
struct FileTable {
    /// Index in the table-range map; 0 when the file has no table.
    id: u32,
    segments: Vec<LoadSegment>,
    state: TableState,
    path: Arc<str>,
    /// The file is a CPython interpreter.
    python: Option<PythonSymbols>,
}

#[derive(Debug)]
struct ProcessTables {
    instance: u32,
    snapshot: ProcessSnapshot,
    /// Samples in the last drain it was sampled in.
    samples: u64,
    pending: bool,
    /// Its CPython entry, once written (None: not CPython, not yet, or refused).
    python: Option<python_entry::Found>,
}

pub struct TableManager<C> {
    maps: UnwindMaps,
    compiler: C,
    space: RowSpace,
    /// Each owner's share of the rows map, in chunks.
    shares: Shares,
    files: HashMap<FileId, FileTable>,
    free_ids: Vec<u32>,
    next_id: u32,
    processes: HashMap<u32, ProcessTables>,
    usage: HashMap<FileId, Usage>,
    drains: u64,
    stats: Arc<UnwindStats>,
    python_stats: Arc<DetectionStats>,
    /// Told of every CPython process found (the symbolizer names its frames).
    on_python: Option<Box<dyn FnMut(Detected) + Send>>,
}

impl<C: TableCompiler> TableManager<C> {
    /// `user_share_percent`: each non-root user's share of the rows map.
    pub fn new(maps: UnwindMaps, compiler: C, user_share_percent: u64) -> Self {
        let chunks = maps.rows.chunks().min(maps.chunk_pcs.len());
        let stats = Arc::new(UnwindStats::default());
        stats.chunks_total.store(u64::from(chunks), Ordering::Relaxed);
        Self {
            maps,
            compiler,
            space: RowSpace::new(chunks),
            shares: Shares::new(u64::from(chunks), user_share_percent),
            files: HashMap::new(),
            free_ids: Vec::new(),
            next_id: 1,
            processes: HashMap::new(),
            usage: HashMap::new(),
            drains: 0,
            stats,
            python_stats: Arc::default(),
            on_python: None,
        }
    }

    /// Who is told of each CPython process found (Python frames are walked
    /// only when the sampler has the map for them).
    pub fn on_python(mut self, tell: impl FnMut(Detected) + Send + 'static) -> Self {
        self.on_python = Some(Box::new(tell));
        self
    }

    pub fn python_stats(&self) -> Arc<DetectionStats> {
        self.python_stats.clone()
    }

    pub fn stats(&self) -> Arc<UnwindStats> {
        self.stats.clone()
    }

    /// Serves until every sender is gone.
    pub fn run(mut self, inputs: mpsc::Receiver<UnwindInput>) {
        while let Ok(input) = inputs.recv() {
            self.handle(input);
            // Take in everything queued before loading, so the most sampled
            // process is served first.
            while let Ok(input) = inputs.try_recv() {
                self.handle(input);
            }
            while let Some(pid) = self.most_sampled_pending() {
                self.load_process(pid);
                while let Ok(input) = inputs.try_recv() {
                    self.handle(input);
                }
            }
        }
    }

    fn handle(&mut self, input: UnwindInput) {
        match input {
            UnwindInput::Started(snapshot) => {
                let pid = snapshot.pid;
                let unchanged = self.processes.get(&pid).is_some_and(|known| {
                    known.instance == snapshot.instance && same_mappings(&known.snapshot, &snapshot)
                });
                if unchanged {
                    return;
                }
                let samples = self.processes.get(&pid).map_or(1, |known| known.samples);
                // A new snapshot of the same instance (after a dlopen) keeps
                // its interpreter; after exec the sampler dropped it.
                let python = self
                    .processes
                    .get(&pid)
                    .filter(|known| known.instance == snapshot.instance)
                    .and_then(|known| known.python);
                self.processes.insert(
                    pid,
                    ProcessTables {
                        instance: snapshot.instance,
                        snapshot,
                        samples,
                        pending: true,
                        python,
                    },
                );
            }
            UnwindInput::Exited { pid } => {
                self.processes.remove(&pid);
                // The sampler removes it itself at exit; this covers a
                // process whose entry was written after that.
                let _ = self.maps.processes.remove(&pid);
                if let Some(python) = self.maps.python.as_mut() {
                    let _ = python.remove(&pid);
                }
            }
            UnwindInput::Sampled(sampled) => self.sampled(&sampled),
        }
        self.stats
            .processes
            .store(self.processes.len() as u64, Ordering::Relaxed);
    }

    /// Takes in a drain's samples: each file's usage, each process's
    /// priority, and which evicted tables to try again.
    fn sampled(&mut self, sampled: &SampledStacks) {
        self.drains += 1;
        let per_file = usage::attribute(sampled, |tgid, pc| {
            let mappings = &self.processes.get(&tgid)?.snapshot.mappings;
            let index = mappings
                .partition_point(|mapping| mapping.start <= pc)
                .checked_sub(1)?;
            let mapping = &mappings[index];
            let file = mapping.file.as_ref().filter(|_| pc < mapping.end)?;
            Some(FileId {
                key: file.key,
                version: file.version,
            })
        });
        for (file, samples) in per_file {
            self.usage
                .entry(file)
                .or_default()
                .add(self.drains, samples as f64);
        }
        let mut per_process: HashMap<u32, u64> = HashMap::new();
        for &(tgid, count, _) in &sampled.samples {
            *per_process.entry(tgid).or_default() += count;
        }
        for (pid, count) in per_process {
            let Some(process) = self.processes.get_mut(&pid) else {
                continue;
            };
            process.samples = count;
            let retry = process
                .snapshot
                .mappings
                .iter()
                .filter_map(|m| m.file.as_ref())
                .any(|file| {
                    let id = FileId {
                        key: file.key,
                        version: file.version,
                    };
                    matches!(self.files.get(&id).map(|table| &table.state),
                    Some(TableState::Evicted { at }) if at.elapsed() >= RELOAD_PAUSE)
                });
            process.pending |= retry;
        }
        if self.drains.is_multiple_of(64) {
            self.forget_unmapped_files();
            let (drains, files) = (self.drains, &self.files);
            self.usage
                .retain(|id, usage| files.contains_key(id) || usage.at(drains) >= FORGOTTEN);
        }
    }

    /// Drops what is known of files no tracked process maps, except loaded
    /// tables (a cache for the next run of the same program): a user who
    /// maps file after new file must not grow this map, nor use up table ids.
    fn forget_unmapped_files(&mut self) {
        let mapped = self.mapped_files();
        let mut freed = Vec::new();
        self.files.retain(|id, table| {
            let keep = mapped.contains(id) || matches!(table.state, TableState::Loaded { .. });
            if !keep && table.id != 0 {
                freed.push(table.id);
            }
            keep
        });
        self.free_ids.extend(freed);
    }

    fn mapped_files(&self) -> HashSet<FileId> {
        self.processes
            .values()
            .flat_map(|process| &process.snapshot.mappings)
            .filter_map(|mapping| mapping.file.as_ref())
            .map(|file| FileId {
                key: file.key,
                version: file.version,
            })
            .collect()
    }

    fn usage_of(&self, id: &FileId) -> f64 {
        self.usage.get(id).map_or(0.0, |usage| usage.at(self.drains))
    }

    fn most_sampled_pending(&self) -> Option<u32> {
        self.processes
            .iter()
            .filter(|(_, process)| process.pending)
            .max_by_key(|(_, process)| process.samples)
            .map(|(&pid, _)| pid)
    }
}

/// Whether two snapshots of a process map the same files at the same places.
fn same_mappings(a: &ProcessSnapshot, b: &ProcessSnapshot) -> bool {
    a.mappings.len() == b.mappings.len()
        && a.mappings.iter().zip(&b.mappings).all(|(a, b)| {
            (a.start, a.end, a.offset) == (b.start, b.end, b.offset)
                && a.file.as_ref().map(|file| (file.key, file.version))
                    == b.file.as_ref().map(|file| (file.key, file.version))
        })
}
