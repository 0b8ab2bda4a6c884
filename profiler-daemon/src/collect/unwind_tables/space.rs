//! Which chunks of the rows map are free: first fit over free ranges,
//! coalesced when freed. A table owns whole chunks, so loading one never
//! rewrites another's rows.

use std::collections::BTreeMap;

#[derive(Debug)]
pub struct RowSpace {
    total: u32,
    /// Start chunk -> length, non-overlapping, never adjacent (coalesced).
    free: BTreeMap<u32, u32>,
}

impl RowSpace {
    pub fn new(total: u32) -> Self {
        let mut free = BTreeMap::new();
        if total > 0 {
            free.insert(0, total);
        }
        Self { total, free }
    }

    pub fn total(&self) -> u32 {
        self.total
    }

    #[cfg(test)]
    pub fn free_chunks(&self) -> u32 {
        self.free.values().sum()
    }

    /// The first chunk of `count` free consecutive chunks, now taken.
    pub fn allocate(&mut self, count: u32) -> Option<u32> {
        if count == 0 {
            return None;
        }
        let (&start, &len) = self.free.iter().find(|(_, len)| **len >= count)?;
        self.free.remove(&start);
        if len > count {
            self.free.insert(start + count, len - count);
        }
        Some(start)
    }

    /// Gives back chunks `start..start + count` (which `allocate` handed out).
    pub fn release(&mut self, start: u32, count: u32) {
        if count == 0 {
            return;
        }
        let (mut start, mut count) = (start, count);
        if let Some((&before, &len)) = self.free.range(..start).next_back()
            && before + len == start
        {
            self.free.remove(&before);
            start = before;
            count += len;
        }
        if let Some(&len) = self.free.get(&(start + count)) {
            self.free.remove(&(start + count));
            count += len;
        }
        self.free.insert(start, count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_first_fit_and_disjoint() {
        let mut space = RowSpace::new(10);
        assert_eq!(space.allocate(4), Some(0));
        assert_eq!(space.allocate(4), Some(4));
        assert_eq!(space.allocate(4), None, "only 2 chunks are left");
        assert_eq!(space.allocate(2), Some(8));
        assert_eq!(space.free_chunks(), 0);
    }

    #[test]
    fn released_neighbours_coalesce() {
        let mut space = RowSpace::new(12);
        let a = space.allocate(4).unwrap();
        let b = space.allocate(4).unwrap();
        let c = space.allocate(4).unwrap();
        space.release(a, 4);
        space.release(c, 4);
        assert_eq!(space.allocate(8), None, "two separate holes of 4 are not 8");
        space.release(b, 4);
        assert_eq!(space.free_chunks(), 12);
        assert_eq!(space.allocate(12), Some(0), "all three holes merged");
    }

    #[test]
    fn zero_sized_requests_take_nothing() {
        let mut space = RowSpace::new(3);
        assert_eq!(space.allocate(0), None);
        space.release(1, 0);
        assert_eq!(space.free_chunks(), 3);
    }
}
