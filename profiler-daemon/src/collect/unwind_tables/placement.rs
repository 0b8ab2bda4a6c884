//! Where tables go in the rows map: free chunks first, then room made by
//! evicting tables the placing owner may evict (see [`super::charges`]),
//! the least useful per chunk of room first.

use std::{
    collections::{HashMap, HashSet},
    sync::atomic::Ordering,
    time::Instant,
};

use profiler_common::{UNWIND_ROWS_PER_CHUNK, UnwindRow, UnwindRowChunk, UnwindTableRange, maps};

use super::{
    FileId, TableCompiler, TableManager, TableState,
    charges::{self, Candidate, Charges},
};
use crate::{error::Chain, shares::Owner};

/// Each file's owners (sorted, deduplicated): whose tracked processes map it.
type FileOwners = HashMap<FileId, Vec<Owner>>;

impl<C: TableCompiler> TableManager<C> {
    pub(super) fn allocate_id(&mut self) -> Option<u32> {
        if self.free_ids.is_empty() && self.next_id >= self.maps.tables.len() {
            // Every id taken: unmapped files' entries give theirs back.
            self.forget_unmapped_files();
        }
        if let Some(id) = self.free_ids.pop() {
            return Some(id);
        }
        (self.next_id < self.maps.tables.len()).then(|| {
            self.next_id += 1;
            self.next_id - 1
        })
    }

    /// Writes `rows` into free chunks, evicting tables `placing` may evict
    /// (not in `protected`; see [`super::charges`]) until they fit.
    pub(super) fn place(
        &mut self,
        rows: &[UnwindRow],
        protected: &HashSet<FileId>,
        path: &str,
        worth: f64,
        placing: Owner,
    ) -> TableState {
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
        // Who is charged what is only worked out when room must be made.
        let mut charged: Option<(Charges, FileOwners)> = None;
        let first_chunk = loop {
            if let Some(first) = self.space.allocate(chunks) {
                break first;
            }
            let (charges, owners) = charged.get_or_insert_with(|| self.charges(placing, chunks));
            if !self.evict_one(protected, (worth, chunks), charges, owners) {
                // Nothing it may evict (all more useful, or others' within
                // their shares): try again later.
                self.stats.lose(&[placing], charges::REFUSED);
                return TableState::Evicted { at: Instant::now() };
            }
        };
        match self.maps.rows.ensure(first_chunk, chunks) {
            Ok(created) => {
                self.stats
                    .groups_created
                    .fetch_add(u64::from(created), Ordering::Relaxed);
            }
            Err(err) => {
                // Out of memory for a group now (the daemon's cgroup, say):
                // tried again after the reload pause, not never again.
                self.stats.map_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(path, "creating room for an unwind table: {}", Chain(&err));
                self.space.release(first_chunk, chunks);
                return TableState::Evicted { at: Instant::now() };
            }
        }
        let mut chunk = Box::new(UnwindRowChunk {
            rows: [UnwindRow::default(); UNWIND_ROWS_PER_CHUNK],
        });
        for (index, part) in rows.chunks(UNWIND_ROWS_PER_CHUNK).enumerate() {
            chunk.rows[..part.len()].copy_from_slice(part);
            chunk.rows[part.len()..].fill(UnwindRow::default());
            let at = first_chunk + index as u32;
            let written = self
                .maps
                .rows
                .write(at, &chunk)
                .and_then(|()| self.maps.chunk_pcs.set(at, &part[0].pc, 0));
            if let Err(err) = written {
                self.stats.map_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("writing {}: {}", maps::UNWIND_ROWS, Chain(&err));
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

    /// Each file's owners, and the chunks of loaded tables charged to each
    /// owner, as `placing` is about to place `need` chunks. Walks every
    /// tracked mapping: done only when a placement finds no free room,
    /// which costs a compile anyway.
    fn charges(&self, placing: Owner, need: u32) -> (Charges, FileOwners) {
        let mut owners: FileOwners = HashMap::new();
        for process in self.processes.values() {
            let owner = Owner::from(process.snapshot.readable_by);
            for file in process.snapshot.mappings.iter().filter_map(|m| m.file.as_ref()) {
                let id = FileId {
                    key: file.key,
                    version: file.version,
                };
                let file_owners = owners.entry(id).or_default();
                if !file_owners.contains(&owner) {
                    file_owners.push(owner);
                }
            }
        }
        let mut used: HashMap<Owner, u64> = HashMap::new();
        for (id, table) in &self.files {
            let TableState::Loaded { chunks, .. } = table.state else {
                continue;
            };
            for owner in owners.get(id).into_iter().flatten() {
                *used.entry(*owner).or_default() += u64::from(chunks);
            }
        }
        for file_owners in owners.values_mut() {
            file_owners.sort_unstable();
        }
        let charges = Charges::new(self.shares, used, placing, u64::from(need));
        (charges, owners)
    }

    /// Evicts the loaded table outside `protected` that [`charges::choose`]
    /// picks for a newcomer of (samples, chunks) `newcomer`; false if there
    /// is none.
    fn evict_one(
        &mut self,
        protected: &HashSet<FileId>,
        newcomer: (f64, u32),
        charges: &mut Charges,
        owners: &FileOwners,
    ) -> bool {
        let unowned: &[Owner] = &[];
        let candidates = self
            .files
            .iter()
            .filter(|(id, _)| !protected.contains(*id))
            .filter_map(|(id, table)| {
                let TableState::Loaded { chunks, .. } = table.state else {
                    return None;
                };
                let table_owners = owners.get(id).map_or(unowned, Vec::as_slice);
                Some(Candidate {
                    key: *id,
                    verdict: charges.verdict(table_owners),
                    usage: self.usage_of(id),
                    chunks,
                })
            });
        let (worth, need) = newcomer;
        let Some((victim, reason)) = charges::choose(candidates, worth, need) else {
            return false;
        };
        let Some(table) = self.files.get_mut(&victim) else {
            return false;
        };
        let victim_owners = owners.get(&victim).map_or(unowned, Vec::as_slice);
        if let TableState::Loaded { chunks, .. } = table.state {
            charges.evicted(victim_owners, u64::from(chunks));
        }
        self.stats.lose(victim_owners, reason);
        // The sampler stops using the rows before they are reused.
        if let Err(err) = self.maps.tables.set(table.id, &UnwindTableRange::default(), 0) {
            self.stats.map_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("clearing {}: {}", maps::UNWIND_TABLES, Chain(&err));
        }
        let state = std::mem::replace(&mut table.state, TableState::Evicted { at: Instant::now() });
        tracing::debug!(
            path = %table.path,
            reason = charges::LOSS_REASONS.get(reason).copied().unwrap_or("?"),
            placing = ?charges.placing(),
            worth,
            "unwind table evicted"
        );
        self.release(&state);
        self.stats.evictions.fetch_add(1, Ordering::Relaxed);
        true
    }

    pub(super) fn release(&mut self, state: &TableState) {
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
