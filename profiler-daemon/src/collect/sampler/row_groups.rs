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
const PER_GROUP: u32 = UNWIND_GROUP_CHUNKS as u32;

pub struct RowGroups {
    outer: ArrayOfMaps<MapData, Group>,
    /// Index: group number. `None` until a table needs it. Each created
    /// group's descriptor is kept: opening it again from the outer map
    /// (`bpf_map_get_fd_by_id`) needs CAP_SYS_ADMIN, which the hardened unit
    /// does not grant. One per MiB of tables loaded: 64 at the default
    /// `unwind_table_memory_mb`, 4,096 at its largest.
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

    /// Creates the groups of chunks `first..first + count` that do not
    /// exist yet; returns how many it created. Creating one can fail at run
    /// time (the kernel charges BPF memory to the daemon's cgroup): the
    /// groups created before the failure stay.
    pub fn ensure(&mut self, first: u32, count: u32) -> Result<u32, MapError> {
        let mut created = 0;
        if count == 0 {
            return Ok(created);
        }
        let last = first.saturating_add(count - 1);
        for group in first / PER_GROUP..=last / PER_GROUP {
            let slot = self.groups.get_mut(group as usize).ok_or(MapError::OutOfBounds {
                index: group,
                max_entries: self.outer.len(),
            })?;
            if slot.is_some() {
                continue;
            }
            let group_map = Group::create(PER_GROUP, 0)?;
            // The sampler reads the group through the outer map from now
            // on; only chunks of tables placed in it later are read, after
            // they are written.
            self.outer.set(group, &group_map, 0)?;
            *slot = Some(group_map);
            created += 1;
        }
        Ok(created)
    }

    /// Writes `chunk` at chunk index `at`, whose group [`Self::ensure`]
    /// created.
    pub fn write(&mut self, at: u32, chunk: &UnwindRowChunk) -> Result<(), MapError> {
        match self.groups.get_mut((at / PER_GROUP) as usize) {
            Some(Some(group)) => group.set(at % PER_GROUP, chunk, 0),
            _ => Err(MapError::OutOfBounds {
                index: at,
                max_entries: self.chunks(),
            }),
        }
    }
}
