//! Loading a process's tables: compiling what its files lack (in the
//! worker), placing the rows, and telling the sampler where they are.

use std::{
    collections::HashSet,
    sync::{Arc, atomic::Ordering},
};

use profiler_common::{UNWIND_ROWS_PER_CHUNK, UnwindTableRange, maps};

use super::{
    CompiledTable, FileId, FileTable, RELOAD_PAUSE, TableCompiler, TableManager, TableState, process_entry,
    usage::Usage,
};
use crate::{collect::MappedFile, error::Chain, shares::Owner};

impl<C: TableCompiler> TableManager<C> {
    /// Compiles and loads what the process's files lack, then tells the
    /// sampler where each of its mappings' rows are.
    pub(super) fn load_process(&mut self, pid: u32) {
        let Some(process) = self.processes.get_mut(&pid) else {
            return;
        };
        process.pending = false;
        let instance = process.instance;
        let owner = Owner::from(process.snapshot.readable_by);
        let process_samples = process.samples as f64;
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
                // A new file has no usage yet: its process's samples stand in.
                let worth = self.usage_of(&id).max(process_samples);
                self.load_file(id, file, &mapping.path, &protected, worth, owner);
            }
        }
        // The process may have exec'd meanwhile: only write what is current.
        if self
            .processes
            .get(&pid)
            .is_some_and(|process| process.instance == instance)
        {
            let mut entry = process_entry::build(&mappings, |file| {
                let table = self.files.get(&FileId {
                    key: file.key,
                    version: file.version,
                })?;
                Some((table.id, table.segments.as_slice()))
            });
            entry.python = u32::from(self.python_entry(pid, instance, &mappings));
            if let Err(err) = self.maps.processes.insert(&pid, &*entry, 0) {
                self.stats.map_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(pid, "writing {}: {}", maps::UNWIND_PROCESSES, Chain(&err));
            }
        }
    }

    fn load_file(
        &mut self,
        id: FileId,
        file: &Arc<MappedFile>,
        path: &Arc<str>,
        protected: &HashSet<FileId>,
        worth: f64,
        owner: Owner,
    ) {
        self.stats.compiles.fetch_add(1, Ordering::Relaxed);
        let compiled = self.compiler.compile(file);
        let (compiled, state) = match compiled {
            Ok(compiled) => {
                self.stats
                    .compile_ns
                    .fetch_add(compiled.compile_time.as_nanos() as u64, Ordering::Relaxed);
                let state = self.place(&compiled.rows, protected, path, worth, owner);
                if matches!(state, TableState::Loaded { .. }) {
                    // Until its own samples are counted, a table is worth
                    // what got it loaded: a newcomer as useful cannot evict it.
                    let usage = self.usage.entry(id).or_default();
                    if usage.at(self.drains) < worth {
                        *usage = Usage::default();
                        usage.add(self.drains, worth);
                    }
                }
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
                tracing::warn!("writing {}: {}", maps::UNWIND_TABLES, Chain(&err));
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
                python: compiled.python,
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
                python: None,
            },
        );
    }
}
