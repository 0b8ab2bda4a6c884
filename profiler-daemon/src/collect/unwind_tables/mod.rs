//! The unwind tables the sampler's own user-stack walk reads (`--unwind
//! auto`): for every file a sampled process maps, its CFI compiled into a
//! sorted row table (by the sandboxed worker: `.eh_frame` is hostile input),
//! loaded once into the rows map and shared by every process that maps the
//! file; and for every process, its executable mappings with each one's
//! table and load bias.
//!
//! Kernel memory is bounded by the rows map's size; when a table does not
//! fit, the tables of the least recently sampled files are evicted. A process
//! whose tables are not loaded (yet, or any more) is still walked, with
//! frame pointers.

mod process_entry;
mod space;

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use profiler_common::{UNWIND_ROWS_PER_CHUNK, UnwindRow, UnwindRowChunk, UnwindTableRange, maps};

use super::{FileKey, FileVersion, MappedFile, ProcessSnapshot, UnwindMaps};
pub use process_entry::{LoadSegment, load_bias};
use space::RowSpace;

/// A file's table as the worker compiled it.
#[derive(Debug, Default)]
pub struct CompiledTable {
    pub rows: Vec<UnwindRow>,
    /// The file's PT_LOAD segments, to find each mapping's load bias.
    pub segments: Vec<LoadSegment>,
    pub compile_time: Duration,
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
    /// Samples per process in the last drain: recency and priority.
    Sampled(Vec<(u32, u64)>),
}

/// Counters and gauges for /metrics.
#[derive(Debug, Default)]
pub struct UnwindStats {
    pub tables_loaded: AtomicU64,
    pub table_failures: AtomicU64,
    pub evictions: AtomicU64,
    /// Tables larger than the whole rows map.
    pub too_large: AtomicU64,
    pub compiles: AtomicU64,
    pub compile_ns: AtomicU64,
    pub rows_loaded: AtomicU64,
    pub chunks_used: AtomicU64,
    pub chunks_total: AtomicU64,
    pub processes: AtomicU64,
    /// Inputs dropped because the manager fell behind (those processes get
    /// frame-pointer stacks until their next snapshot).
    pub inputs_dropped: AtomicU64,
    pub map_errors: AtomicU64,
}

impl UnwindStats {
    pub fn bytes_used(&self) -> u64 {
        self.chunks_used.load(Ordering::Relaxed) * size_of::<UnwindRowChunk>() as u64
    }

    pub fn bytes_max(&self) -> u64 {
        self.chunks_total.load(Ordering::Relaxed) * size_of::<UnwindRowChunk>() as u64
    }
}

/// An evicted table is not reloaded sooner than this: two busy processes
/// whose tables do not fit together must not take turns evicting each other
/// at every drain.
const RELOAD_PAUSE: Duration = Duration::from_secs(10);

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
    /// Drain number when a process mapping it was last sampled.
    last_sampled: u64,
}

#[derive(Debug)]
struct ProcessTables {
    instance: u32,
    snapshot: ProcessSnapshot,
    /// Samples in the last drain it was sampled in.
    samples: u64,
    pending: bool,
}

pub struct TableManager<C> {
    maps: UnwindMaps,
    compiler: C,
    space: RowSpace,
    files: HashMap<FileId, FileTable>,
    free_ids: Vec<u32>,
    next_id: u32,
    processes: HashMap<u32, ProcessTables>,
    drains: u64,
    stats: Arc<UnwindStats>,
}

impl<C: TableCompiler> TableManager<C> {
    pub fn new(maps: UnwindMaps, compiler: C) -> Self {
        let chunks = maps.rows.len();
        let stats = Arc::new(UnwindStats::default());
        stats.chunks_total.store(u64::from(chunks), Ordering::Relaxed);
        Self {
            maps,
            compiler,
            space: RowSpace::new(chunks),
            files: HashMap::new(),
            free_ids: Vec::new(),
            next_id: 1,
            processes: HashMap::new(),
            drains: 0,
            stats,
        }
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
                self.processes.insert(
                    pid,
                    ProcessTables {
                        instance: snapshot.instance,
                        snapshot,
                        samples,
                        pending: true,
                    },
                );
            }
            UnwindInput::Exited { pid } => {
                self.processes.remove(&pid);
                // The sampler removes it itself at exit; this covers a
                // process whose entry was written after that.
                let _ = self.maps.processes.remove(&pid);
            }
            UnwindInput::Sampled(samples) => {
                self.drains += 1;
                for (pid, count) in samples {
                    let Some(process) = self.processes.get_mut(&pid) else {
                        continue;
                    };
                    process.samples = count;
                    for mapping in &process.snapshot.mappings {
                        let Some(file) = &mapping.file else { continue };
                        let id = FileId {
                            key: file.key,
                            version: file.version,
                        };
                        if let Some(table) = self.files.get_mut(&id) {
                            table.last_sampled = self.drains;
                            if matches!(table.state, TableState::Evicted { at } if at.elapsed() >= RELOAD_PAUSE)
                            {
                                process.pending = true;
                            }
                        }
                    }
                }
            }
        }
        self.stats
            .processes
            .store(self.processes.len() as u64, Ordering::Relaxed);
    }

    fn most_sampled_pending(&self) -> Option<u32> {
        self.processes
            .iter()
            .filter(|(_, process)| process.pending)
            .max_by_key(|(_, process)| process.samples)
            .map(|(&pid, _)| pid)
    }

    /// Compiles and loads what the process's files lack, then tells the
    /// sampler where each of its mappings' rows are.
    fn load_process(&mut self, pid: u32) {
        let Some(process) = self.processes.get_mut(&pid) else {
            return;
        };
        process.pending = false;
        let instance = process.instance;
        let mappings = process.snapshot.mappings.clone();
        let mut protected = HashSet::new();
        for mapping in &mappings {
            let Some(file) = &mapping.file else { continue };
            let id = FileId {
                key: file.key,
                version: file.version,
            };
            protected.insert(id);
            let needs_load = match self.files.get(&id).map(|table| &table.state) {
                None => true,
                Some(TableState::Evicted { at }) => at.elapsed() >= RELOAD_PAUSE,
                Some(_) => false,
            };
            if needs_load {
                self.load_file(id, file, &mapping.path, &protected);
            }
            if let Some(table) = self.files.get_mut(&id) {
                table.last_sampled = self.drains;
            }
        }
        // The process may have exec'd meanwhile: only write what is current.
        if self
            .processes
            .get(&pid)
            .is_some_and(|process| process.instance == instance)
        {
            let entry = process_entry::build(&mappings, |file| {
                let table = self.files.get(&FileId {
                    key: file.key,
                    version: file.version,
                })?;
                Some((table.id, table.segments.as_slice()))
            });
            if let Err(err) = self.maps.processes.insert(&pid, &*entry, 0) {
                self.stats.map_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(pid, "writing {}: {err}", maps::UNWIND_PROCESSES);
            }
        }
    }

    fn load_file(
        &mut self,
        id: FileId,
        file: &Arc<MappedFile>,
        path: &Arc<str>,
        protected: &HashSet<FileId>,
    ) {
        self.stats.compiles.fetch_add(1, Ordering::Relaxed);
        let compiled = self.compiler.compile(file);
        let (compiled, state) = match compiled {
            Ok(compiled) => {
                self.stats
                    .compile_ns
                    .fetch_add(compiled.compile_time.as_nanos() as u64, Ordering::Relaxed);
                let state = self.place(&compiled.rows, protected, path);
                (compiled, state)
            }
            Err(err) => {
                self.stats.table_failures.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(path = %path, "no unwind table: {err}");
                (CompiledTable::default(), TableState::Unavailable)
            }
        };
        let previous_id = self.files.get(&id).map(|table| table.id).filter(|&id| id != 0);
        let table_id = match (&state, previous_id) {
            (TableState::Unavailable, Some(old)) => {
                self.free_ids.push(old);
                0
            }
            (TableState::Unavailable, None) => 0,
            (_, Some(old)) => old,
            (_, None) => match self.allocate_id() {
                Some(new) => new,
                None => {
                    self.release(&state);
                    self.insert_unavailable(id, path);
                    return;
                }
            },
        };
        if let TableState::Loaded {
            first_chunk, rows, ..
        } = state
        {
            let range = UnwindTableRange {
                first_row: first_chunk * UNWIND_ROWS_PER_CHUNK as u32,
                rows,
            };
            if let Err(err) = self.maps.tables.set(table_id, &range, 0) {
                self.stats.map_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("writing {}: {err}", maps::UNWIND_TABLES);
            }
            self.stats.tables_loaded.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(path = %path, rows, compile = ?compiled.compile_time, "unwind table loaded");
        }
        self.files.insert(
            id,
            FileTable {
                id: table_id,
                segments: compiled.segments,
                state,
                path: path.clone(),
                last_sampled: self.drains,
            },
        );
    }

    fn insert_unavailable(&mut self, id: FileId, path: &Arc<str>) {
        self.files.insert(
            id,
            FileTable {
                id: 0,
                segments: Vec::new(),
                state: TableState::Unavailable,
                path: path.clone(),
                last_sampled: self.drains,
            },
        );
    }

    fn allocate_id(&mut self) -> Option<u32> {
        if let Some(id) = self.free_ids.pop() {
            return Some(id);
        }
        (self.next_id < self.maps.tables.len()).then(|| {
            self.next_id += 1;
            self.next_id - 1
        })
    }

    /// Writes `rows` into free chunks, evicting the least recently sampled
    /// tables (not the ones in `protected`) until they fit.
    fn place(&mut self, rows: &[UnwindRow], protected: &HashSet<FileId>, path: &str) -> TableState {
        let chunks = rows.len().div_ceil(UNWIND_ROWS_PER_CHUNK);
        let (Ok(chunks), Ok(row_count)) = (u32::try_from(chunks), u32::try_from(rows.len())) else {
            return TableState::Unavailable;
        };
        if chunks == 0 {
            return TableState::Unavailable;
        }
        if chunks > self.space.total() {
            self.stats.too_large.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                path,
                rows = rows.len(),
                limit_mb = self.stats.bytes_max() >> 20,
                "unwind table larger than unwind_table_memory_mb: frame pointers only for this file"
            );
            return TableState::Unavailable;
        }
        let first_chunk = loop {
            if let Some(first) = self.space.allocate(chunks) {
                break first;
            }
            if !self.evict_one(protected) {
                return TableState::Evicted { at: Instant::now() };
            }
        };
        let mut chunk = Box::new(UnwindRowChunk {
            rows: [UnwindRow::default(); UNWIND_ROWS_PER_CHUNK],
        });
        for (index, part) in rows.chunks(UNWIND_ROWS_PER_CHUNK).enumerate() {
            chunk.rows[..part.len()].copy_from_slice(part);
            chunk.rows[part.len()..].fill(UnwindRow::default());
            if let Err(err) = self.maps.rows.set(first_chunk + index as u32, &*chunk, 0) {
                self.stats.map_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("writing {}: {err}", maps::UNWIND_ROWS);
                self.space.release(first_chunk, chunks);
                return TableState::Unavailable;
            }
        }
        self.stats
            .chunks_used
            .fetch_add(u64::from(chunks), Ordering::Relaxed);
        self.stats
            .rows_loaded
            .fetch_add(u64::from(row_count), Ordering::Relaxed);
        TableState::Loaded {
            first_chunk,
            chunks,
            rows: row_count,
        }
    }

    /// Evicts the least recently sampled loaded table outside `protected`.
    fn evict_one(&mut self, protected: &HashSet<FileId>) -> bool {
        let victim = self
            .files
            .iter()
            .filter(|(id, table)| {
                matches!(table.state, TableState::Loaded { .. }) && !protected.contains(*id)
            })
            .min_by_key(|(_, table)| table.last_sampled)
            .map(|(id, _)| *id);
        let Some(victim) = victim else {
            return false;
        };
        let Some(table) = self.files.get_mut(&victim) else {
            return false;
        };
        // The sampler stops using the rows before they are reused.
        if let Err(err) = self.maps.tables.set(table.id, &UnwindTableRange::default(), 0) {
            self.stats.map_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("clearing {}: {err}", maps::UNWIND_TABLES);
        }
        let state = std::mem::replace(&mut table.state, TableState::Evicted { at: Instant::now() });
        tracing::debug!(path = %table.path, "unwind table evicted");
        self.release(&state);
        self.stats.evictions.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn release(&mut self, state: &TableState) {
        if let TableState::Loaded {
            first_chunk,
            chunks,
            rows,
        } = *state
        {
            self.space.release(first_chunk, chunks);
            self.stats
                .chunks_used
                .fetch_sub(u64::from(chunks), Ordering::Relaxed);
            self.stats
                .rows_loaded
                .fetch_sub(u64::from(rows), Ordering::Relaxed);
        }
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
