//! Cgroup id -> path, for the symbolize stage (blocking: it reads cgroupfs).
//!
//! Two sources. A process's cgroup is read with its mappings, as soon as the
//! sampler announces it ([`read_process_cgroup`]): a scope that lives 200 ms
//! is named then, while its directory exists, and stays named after
//! systemd removes it. An id no process announced (a thread that moved, a
//! process that changed cgroup) is looked for by walking /sys/fs/cgroup,
//! at most every [`MIN_WALK_INTERVAL`] and within bounds: users create
//! cgroups below their delegated subtrees with any names, depth and number.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    os::unix::fs::{DirEntryExt, MetadataExt},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use super::Cgroup;
use crate::procfs::ProcRoot;

/// Where the cgroup v2 hierarchy is mounted: alone (unified layout), or
/// beside the v1 hierarchies (hybrid layout).
/// statfs f_type of cgroup2.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
/// Longer paths are not named (their samples get no cgroup label).
pub const MAX_PATH_BYTES: usize = 1024;
/// The walk goes no deeper than this below the root.
const MAX_DEPTH: usize = 32;
/// The walk reads at most this many directories.
const MAX_WALK_DIRS: usize = 16384;
/// /proc/PID/cgroup reads per batch for ids not known.
const MAX_PROC_READS: usize = 64;
/// Misses wait this long for the next walk.
const MIN_WALK_INTERVAL: Duration = Duration::from_secs(5);
/// Bytes of names kept; past it the least recently sampled go.
const MAX_BYTES: usize = 4 << 20;
/// Approximate bytes of one entry besides its path.
const ENTRY_BYTES: usize = 96;

/// Counters for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupStats {
    /// Cgroups named now.
    pub known: u64,
    pub walks: u64,
    /// Walks stopped by the directory or depth bound before they were done.
    pub walks_truncated: u64,
    /// Sampled cgroup ids that could not be named (per batch, each id once).
    pub unresolved: u64,
    /// Names forgotten to stay within the memory bound.
    pub evicted: u64,
}

struct Known {
    cgroup: Arc<Cgroup>,
    /// The batch that last sampled it.
    used: u64,
}

pub struct CgroupResolver {
    /// Where processes' cgroup files are read.
    proc: ProcRoot,
    /// None: no cgroup v2 hierarchy to walk.
    root: Option<PathBuf>,
    known: HashMap<u64, Known>,
    bytes: usize,
    batch: u64,
    last_walk: Option<Instant>,
    pub stats: CgroupStats,
}

impl CgroupResolver {
    /// `root`: the cgroup v2 hierarchy (see [`v2_root`]), as `proc` sees it.
    pub fn new(proc: ProcRoot, root: Option<&Path>) -> Self {
        Self {
            proc,
            root: root.map(Path::to_owned),
            known: HashMap::new(),
            bytes: 0,
            batch: 0,
            last_walk: None,
            stats: CgroupStats::default(),
        }
    }

    /// Remembers that cgroup `id` is `path` (read while a process ran in it).
    pub fn learn(&mut self, id: u64, path: &str) {
        if self
            .known
            .get(&id)
            .is_some_and(|known| *known.cgroup.path == *path)
        {
            return;
        }
        let cgroup = Arc::new(Cgroup::from_path(path));
        self.bytes += ENTRY_BYTES + path.len();
        if let Some(old) = self.known.insert(
            id,
            Known {
                cgroup,
                used: self.batch,
            },
        ) {
            self.bytes -= ENTRY_BYTES + old.cgroup.path.len();
        }
        self.evict();
    }

    /// Names a batch's cgroup ids, given with a process sampled in each:
    /// from what is known; then from the process's /proc/PID/cgroup (it
    /// may have moved since it was first seen; a few reads per batch); then,
    /// for the rest, one bounded walk if the last was long enough ago. Ids
    /// it cannot name are left out.
    pub fn resolve(&mut self, ids: impl IntoIterator<Item = (u64, u32)>) -> HashMap<u64, Arc<Cgroup>> {
        self.batch += 1;
        let mut named = HashMap::new();
        let mut missing = HashMap::new();
        for (id, pid) in ids {
            match self.known.get_mut(&id) {
                Some(known) => {
                    known.used = self.batch;
                    named.insert(id, known.cgroup.clone());
                }
                None => {
                    missing.entry(id).or_insert(pid);
                }
            }
        }
        let mut reads = 0;
        missing.retain(|&id, &mut pid| {
            if reads >= MAX_PROC_READS {
                return true;
            }
            reads += 1;
            let Some(root) = &self.root else {
                return true;
            };
            match read_process_cgroup(&self.proc, pid, root) {
                Some((found, path)) if found == id => {
                    let cgroup = Arc::new(Cgroup::from_path(&path));
                    named.insert(id, cgroup);
                    false
                }
                _ => true,
            }
        });
        for (id, cgroup) in &named {
            if !self.known.contains_key(id) {
                self.learn(*id, &cgroup.path);
            }
        }
        let mut missing: HashSet<u64> = missing.into_keys().collect();
        if !missing.is_empty() && self.last_walk.is_none_or(|at| at.elapsed() >= MIN_WALK_INTERVAL) {
            self.last_walk = Some(Instant::now());
            let wanted: Vec<u64> = missing.iter().copied().collect();
            self.walk(&mut missing);
            for id in wanted.into_iter().filter(|id| !missing.contains(id)) {
                if let Some(known) = self.known.get(&id) {
                    named.insert(id, known.cgroup.clone());
                }
            }
        }
        self.stats.unresolved += missing.len() as u64;
        self.stats.known = self.known.len() as u64;
        named
    }

    /// Breadth first from the root, learning the wanted ids it meets; stops
    /// once all are found or at a bound. Only directory entries are read
    /// (their inode numbers come with the listing: no stat per cgroup).
    fn walk(&mut self, wanted: &mut HashSet<u64>) {
        let Some(root) = self.root.clone() else {
            return;
        };
        self.stats.walks += 1;
        if let Ok(root) = std::fs::metadata(&root)
            && wanted.remove(&root.ino())
        {
            self.learn(root.ino(), "/");
        }
        let mut queue: VecDeque<(String, usize)> = VecDeque::from([(String::new(), 0)]);
        let mut dirs = 0;
        while let Some((relative, depth)) = queue.pop_front() {
            if wanted.is_empty() {
                return;
            }
            if dirs >= MAX_WALK_DIRS {
                self.stats.walks_truncated += 1;
                return;
            }
            dirs += 1;
            let Ok(entries) = std::fs::read_dir(root.join(relative.trim_start_matches('/'))) else {
                // Removed meanwhile, or unreadable: nothing to learn there.
                continue;
            };
            for entry in entries.flatten() {
                if !entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                    continue;
                }
                let name = entry.file_name();
                let path = format!("{relative}/{}", name.to_string_lossy());
                if path.len() > MAX_PATH_BYTES {
                    continue;
                }
                if wanted.remove(&entry.ino()) {
                    self.learn(entry.ino(), &path);
                }
                if depth + 1 < MAX_DEPTH {
                    queue.push_back((path, depth + 1));
                } else if !wanted.is_empty() {
                    self.stats.walks_truncated += 1;
                }
            }
        }
    }

    /// Forgets the least recently sampled names until a quarter of the
    /// bound is free; a no-op below the bound.
    fn evict(&mut self) {
        if self.bytes <= MAX_BYTES {
            return;
        }
        let mut by_age: Vec<(u64, u64)> = self.known.iter().map(|(id, known)| (known.used, *id)).collect();
        by_age.sort_unstable();
        for (_, id) in by_age {
            if self.bytes <= MAX_BYTES / 4 * 3 {
                break;
            }
            if let Some(old) = self.known.remove(&id) {
                self.bytes -= ENTRY_BYTES + old.cgroup.path.len();
                self.stats.evicted += 1;
            }
        }
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bytes
    }
}

/// The mount point of the cgroup v2 hierarchy under `proc`'s view of the
/// system (see [`ProcRoot::cgroup_roots`]). None without one (cgroup v1
/// only): v1 hierarchies number their cgroups apart from v2, so their
/// inodes would name the wrong cgroups; samples then go unnamed.
pub fn v2_root(proc: &ProcRoot) -> Option<PathBuf> {
    proc.cgroup_roots().into_iter().find(|root| is_cgroup2(root))
}

fn is_cgroup2(path: &Path) -> bool {
    crate::procfs::filesystem_type(path) == Some(CGROUP2_SUPER_MAGIC)
}

/// The cgroup v2 path of process `pid` and the id of that cgroup (the
/// inode of its directory under `root`), read now. None when the process is
/// gone, the path is outside this daemon's cgroup namespace (`/..`), too
/// long, or its directory is gone.
pub fn read_process_cgroup(proc: &ProcRoot, pid: u32, root: &Path) -> Option<(u64, String)> {
    let text = proc.read(pid, "cgroup").ok()?;
    let path = text.lines().find_map(|line| line.strip_prefix("0::"))?;
    if !path.starts_with('/') || path.len() > MAX_PATH_BYTES || path.split('/').any(|part| part == "..") {
        return None;
    }
    let id = std::fs::metadata(root.join(path.trim_start_matches('/')))
        .ok()?
        .ino();
    Some((id, path.to_owned()))
}

#[cfg(test)]
mod tests;
