//! The rows map's groups: an array of inner maps, each holding
//! [`UNWIND_GROUP_CHUNKS`] chunks, created the first time a table is placed
//! in them. The rows' kernel memory then follows the largest set of tables
//! loaded at once, not `unwind_table_memory_mb` (64 MiB preallocated before).
//!
//! Placement is first-fit from chunk 0, so tables pack into the lowest
//! groups. A group is kept once created: an evicted table's chunks are
//! reused by the next, and creating maps as load comes and goes would cost
//! more than the memory it gives back.

use aya::maps::{Array, ArrayOfMaps, MapData, MapError};
use profiler_common::{UNWIND_GROUP_CHUNKS, UnwindRowChunk};

/// One group: an inner map of the rows map.
type Group = Array<MapData, UnwindRowChunk>;

pub struct RowGroups {
    outer: ArrayOfMaps<MapData, Group>,
    /// Index: group number. `None` until a table needs it.
    groups: Vec<Option<Group>>,
}

impl RowGroups {
    pub fn new(outer: ArrayOfMaps<MapData, Group>) -> Self {
        let groups = (0..outer.len()).map(|_| None).collect();
        Self { outer, groups }
    }

    /// Chunks the groups can hold when all exist.
    pub fn chunks(&self) -> u32 {
        u32::try_from(self.groups.len() * UNWIND_GROUP_CHUNKS).unwrap_or(u32::MAX)
    }

    /// Writes `chunk` at chunk index `at`, creating its group first if it
    /// does not exist yet: true when it created one.
    pub fn write(&mut self, at: u32, chunk: &UnwindRowChunk) -> Result<bool, MapError> {
        const PER_GROUP: u32 = UNWIND_GROUP_CHUNKS as u32;
        let (group, index) = (at / PER_GROUP, at % PER_GROUP);
        let slot = self.groups.get_mut(group as usize).ok_or(MapError::OutOfBounds {
            index: group,
            max_entries: self.outer.len(),
        })?;
        let created = slot.is_none();
        let inner = match slot {
            Some(inner) => inner,
            None => {
                let group_map = Group::create(PER_GROUP, 0)?;
                // The sampler reads the group through the outer map from
                // now on; its chunks are written before any table range
                // points at them.
                self.outer.set(group, &group_map, 0)?;
                slot.insert(group_map)
            }
        };
        inner.set(index, chunk, 0)?;
        Ok(created)
    }
}
