//! Where tables go in the rows map: free chunks first, then room made by
//! evicting the least useful tables.

use std::{collections::HashSet, sync::atomic::Ordering, time::Instant};

use profiler_common::{UNWIND_ROWS_PER_CHUNK, UnwindRow, UnwindRowChunk, UnwindTableRange, maps};

use super::{FileId, TableCompiler, TableManager, TableState};
use crate::error::Chain;

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

    /// Writes `rows` into free chunks, evicting the least useful tables
    /// (less useful than `worth`, not in `protected`) until they fit.
    pub(super) fn place(
        &mut self,
        rows: &[UnwindRow],
        protected: &HashSet<FileId>,
        path: &str,
        worth: f64,
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
        let first_chunk = loop {
            if let Some(first) = self.space.allocate(chunks) {
                break first;
            }
            if !self.evict_one(protected, worth) {
                // Everything loaded is more useful: try again later.
                return TableState::Evicted { at: Instant::now() };
            }
        };
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
                .set(at, &*chunk, 0)
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

    /// Evicts the least useful loaded table outside `protected`, if it is
    /// less useful than `worth`.
    fn evict_one(&mut self, protected: &HashSet<FileId>, worth: f64) -> bool {
        let victim = self
            .files
            .iter()
            .filter(|(id, table)| {
                matches!(table.state, TableState::Loaded { .. }) && !protected.contains(*id)
            })
            .map(|(id, _)| (*id, self.usage_of(id)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        // Twice as useful, not merely more: tables of about equal use must
        // not take turns evicting each other.
        let Some((victim, victim_usage)) = victim.filter(|(_, usage)| usage * 2.0 < worth) else {
            return false;
        };
        tracing::trace!(victim_usage, worth, "evicting an unwind table");
        let Some(table) = self.files.get_mut(&victim) else {
            return false;
        };
        // The sampler stops using the rows before they are reused.
        if let Err(err) = self.maps.tables.set(table.id, &UnwindTableRange::default(), 0) {
            self.stats.map_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("clearing {}: {}", maps::UNWIND_TABLES, Chain(&err));
        }
        let state = std::mem::replace(&mut table.state, TableState::Evicted { at: Instant::now() });
        tracing::debug!(path = %table.path, "unwind table evicted");
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
