//! What the symbolizer knows of each process instance: its name and the
//! executable mappings snapshotted while it ran.

use std::{collections::HashMap, sync::Arc};

use crate::collect::{MappedFile, ProcessSnapshot, ReadableBy, SnapshotReader};

use super::{resolver::Resolver, stack::Mapping};

/// Every this many batches, instances whose exit we missed are looked for.
const SWEEP_EVERY_BATCHES: u64 = 60;

pub struct UserMapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub file: Option<Arc<MappedFile>>,
    pub mapping: Arc<Mapping>,
}

pub struct ProcessEntry {
    pub comm: Arc<str>,
    /// Who could read the process when the snapshot was read.
    pub readable_by: ReadableBy,
    /// Sorted by `start`.
    pub mappings: Vec<UserMapping>,
    /// See [`ProcessSnapshot::ns_pid`].
    pub ns_pid: Option<u32>,
    last_batch: u64,
}

impl ProcessEntry {
    pub fn mapping_of(&self, address: u64) -> Option<&UserMapping> {
        let index = self.mappings.partition_point(|mapping| mapping.start <= address);
        let mapping = self.mappings.get(index.checked_sub(1)?)?;
        (address < mapping.end).then_some(mapping)
    }
}

/// Counters for metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessStats {
    pub tracked: u64,
    /// Snapshots read at drain time because the early one was missing.
    pub late_snapshots: u64,
    /// Processes with samples but no readable mappings.
    pub missing_snapshots: u64,
    /// Mappings re-read because a sampled address was outside all of them.
    pub refreshes: u64,
}

pub struct ProcessTable {
    entries: HashMap<(u32, u32), ProcessEntry>,
    exited: Vec<(u32, u32)>,
    /// Exited before the previous batch: dropped after this one.
    retiring: Vec<(u32, u32)>,
    refreshed: Vec<(u32, u32)>,
    /// Snapshots read here (late or refreshed), for the unwind tables.
    fresh: Vec<ProcessSnapshot>,
    reader: SnapshotReader,
    batch: u64,
    pub stats: ProcessStats,
}

impl ProcessTable {
    pub fn new(reader: SnapshotReader) -> Self {
        Self {
            entries: HashMap::new(),
            exited: Vec::new(),
            retiring: Vec::new(),
            refreshed: Vec::new(),
            fresh: Vec::new(),
            reader,
            batch: 0,
            stats: ProcessStats::default(),
        }
    }

    /// Build ids are known once the worker has read a file: put them on the
    /// mappings of the processes sampled in this batch.
    pub fn attach_build_ids(&mut self, resolver: &Resolver) {
        let batch = self.batch;
        for entry in self
            .entries
            .values_mut()
            .filter(|entry| entry.last_batch == batch)
        {
            for mapping in &mut entry.mappings {
                if mapping.mapping.build_id.is_some() {
                    continue;
                }
                if let Some(build_id) = mapping.file.as_ref().and_then(|file| resolver.build_id(file)) {
                    let mut with_id = (*mapping.mapping).clone();
                    with_id.build_id = Some(build_id);
                    mapping.mapping = Arc::new(with_id);
                }
            }
        }
    }

    pub fn insert(&mut self, snapshot: ProcessSnapshot, resolver: &mut Resolver) {
        let key = (snapshot.pid, snapshot.instance);
        let entry = entry_from(snapshot, resolver, self.batch);
        self.entries.insert(key, entry);
        self.stats.tracked = self.entries.len() as u64;
    }

    /// The instance is gone: forget it after the next batch, which holds its last samples.
    pub fn exited(&mut self, pid: u32, instance: u32) {
        self.exited.push((pid, instance));
    }

    /// The entry for a sampled instance, reading /proc now if no snapshot came.
    pub fn get_or_load(&mut self, pid: u32, instance: u32, resolver: &mut Resolver) -> Option<&ProcessEntry> {
        let batch = self.batch;
        let key = (pid, instance);
        if !self.entries.contains_key(&key) {
            match self.reader.read(pid, instance) {
                Ok(snapshot) => {
                    self.stats.late_snapshots += 1;
                    self.fresh.push(snapshot.clone());
                    let entry = entry_from(snapshot, resolver, batch);
                    self.entries.insert(key, entry);
                    self.stats.tracked = self.entries.len() as u64;
                }
                Err(_) => {
                    self.stats.missing_snapshots += 1;
                    return None;
                }
            }
        }
        let entry = self.entries.get_mut(&key)?;
        entry.last_batch = batch;
        Some(entry)
    }

    /// Snapshots read since the last [`Self::take_fresh`].
    pub fn fresh(&self) -> &[ProcessSnapshot] {
        &self.fresh
    }

    /// Snapshots read since the last call (late first reads and refreshes
    /// after a dlopen), which the process watcher never saw.
    pub fn take_fresh(&mut self) -> Vec<ProcessSnapshot> {
        std::mem::take(&mut self.fresh)
    }

    /// Re-reads an instance's mappings if its process still runs; true if it did.
    /// Done at most once per instance per batch.
    pub fn refresh(&mut self, pid: u32, instance: u32, resolver: &mut Resolver) -> bool {
        let key = (pid, instance);
        if self.refreshed.contains(&key) {
            return false;
        }
        self.refreshed.push(key);
        match self.reader.read(pid, instance) {
            Ok(snapshot) => {
                self.stats.refreshes += 1;
                self.fresh.push(snapshot.clone());
                let entry = entry_from(snapshot, resolver, self.batch);
                self.entries.insert(key, entry);
                true
            }
            Err(_) => false,
        }
    }

    /// Called after each batch: drops instances that exited before the
    /// batch before it (not this one: a process can exit between a drain's
    /// flip and the moment its batch is handed over, so its last samples —
    /// and the end of its last off-CPU wait, always taken just before it
    /// exits — come in the batch after its exit notice), and now and then
    /// those whose process is gone without an exit notice.
    /// Returns files no longer mapped by anyone (their caches can go).
    pub fn end_batch(&mut self) -> Vec<Arc<MappedFile>> {
        self.batch += 1;
        self.refreshed.clear();
        let mut released = Vec::new();
        let mut drop_entry = |entry: ProcessEntry| {
            released.extend(entry.mappings.into_iter().filter_map(|mapping| mapping.file));
        };
        let exited = std::mem::take(&mut self.exited);
        for key in std::mem::replace(&mut self.retiring, exited) {
            if let Some(entry) = self.entries.remove(&key) {
                drop_entry(entry);
            }
        }
        if self.batch.is_multiple_of(SWEEP_EVERY_BATCHES) {
            let batch = self.batch;
            let proc = self.reader.proc();
            let gone: Vec<_> = self
                .entries
                .iter()
                .filter(|((pid, _), entry)| entry.last_batch + 2 < batch && !proc.exists(*pid))
                .map(|(key, _)| *key)
                .collect();
            for key in gone {
                if let Some(entry) = self.entries.remove(&key) {
                    drop_entry(entry);
                }
            }
        }
        self.stats.tracked = self.entries.len() as u64;
        // Files held open (deleted binaries, other namespaces) whose last user left.
        released.retain(|file| Arc::strong_count(file) == 1);
        released
    }
}

fn entry_from(snapshot: ProcessSnapshot, resolver: &Resolver, batch: u64) -> ProcessEntry {
    let mappings = snapshot
        .mappings
        .into_iter()
        .map(|mapping| {
            let build_id = mapping.file.as_ref().and_then(|file| resolver.build_id(file));
            UserMapping {
                start: mapping.start,
                end: mapping.end,
                offset: mapping.offset,
                mapping: Arc::new(Mapping {
                    start: mapping.start,
                    limit: mapping.end,
                    file_offset: mapping.offset,
                    path: mapping.path,
                    build_id,
                }),
                file: mapping.file,
            }
        })
        .collect();
    ProcessEntry {
        comm: snapshot.comm.into(),
        readable_by: snapshot.readable_by,
        mappings,
        ns_pid: snapshot.ns_pid,
        last_batch: batch,
    }
}
