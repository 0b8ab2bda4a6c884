//! Mapped files, opened safely and held open within a bound.
//!
//! The path in /proc/PID/maps is whatever the process's owner made it: a
//! symlink, a FIFO, `"x (deleted)"` naming another file. So a file is opened
//! through the kernel's own link to the mapping (`/proc/PID/map_files/`),
//! and only where that is refused by path, without following a symlink and
//! accepted only when the descriptor is a regular file with the mapping's
//! device and inode. Opens never block (O_NONBLOCK: a FIFO cannot hang us).
//!
//! Every descriptor held counts against one bound: past it, the least
//! recently used file is closed (its frames stay unresolved).

use std::{
    collections::HashMap,
    fs::File,
    os::{
        fd::OwnedFd,
        unix::fs::{MetadataExt, OpenOptionsExt},
    },
    path::Path,
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicU64, Ordering},
    },
};

use super::proc_maps::MapsLine;
use crate::procfs::ProcRoot;

/// Identity of a file: cache keys use it, never a path, since paths
/// (and `/proc/self/fd/N` numbers) get reused for other files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    pub dev: u64,
    pub inode: u64,
}

/// Size and modification time: a file changed in place keeps its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileVersion {
    pub size: u64,
    pub mtime_ns: i64,
}

/// Default bound on descriptors held for mapped files.
pub const DEFAULT_MAX_OPEN_FILES: usize = 1024;

/// A mapped file, held open from the moment the process was first seen, so
/// it stays readable after the process exits and after the file is deleted
/// or replaced on disk (the descriptor keeps the old inode) — unless the
/// bound on open files closed it meanwhile.
#[derive(Debug)]
pub struct MappedFile {
    pub key: FileKey,
    /// Device and inode as /proc/PID/maps shows them (the registry's key).
    pub maps_key: (u64, u64),
    pub version: FileVersion,
    /// The mapping it was opened through, to reopen it (while that process
    /// lives) after the bound closed it.
    origin: Origin,
    fd: Mutex<Option<OwnedFd>>,
    last_use: AtomicU64,
    stats: Arc<OpenFileStats>,
}

impl MappedFile {
    /// A new descriptor of the file (for the symbolizer worker). One the
    /// bound closed is reopened through its mapping if that process still
    /// runs (and still maps the same file); else None.
    pub fn descriptor(&self) -> Option<OwnedFd> {
        let mut held = self.fd.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if held.is_none() {
            let opened = open_mapped(&self.origin.proc, self.origin.pid, &self.origin.line()).ok()?;
            if opened.key != self.key || opened.version != self.version {
                return None;
            }
            *held = Some(opened.fd);
            self.stats.open.fetch_add(1, Ordering::Relaxed);
            self.stats.reopened.fetch_add(1, Ordering::Relaxed);
        }
        held.as_ref()?.try_clone().ok()
    }

    /// Marks the file as just used: the bound closes it last.
    pub fn touch(&self) {
        self.last_use.store(
            self.stats.clock.fetch_add(1, Ordering::Relaxed) + 1,
            Ordering::Relaxed,
        );
    }

    fn close(&self) -> bool {
        let mut held = self.fd.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let closed = held.take().is_some();
        if closed {
            self.stats.open.fetch_sub(1, Ordering::Relaxed);
        }
        closed
    }

    fn is_open(&self) -> bool {
        self.fd
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .is_some()
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        self.close();
    }
}

/// Why a mapping got no file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not a regular file (a FIFO, a device, a directory).
    NotRegular,
    /// Opened by path, but not the mapped device and inode.
    IdentityMismatch,
    /// Neither the mapping's link nor the path could be opened safely.
    OpenFailed,
    /// The process maps more files than one process may hold.
    PerProcessLimit,
    /// On a filesystem a user process serves (FUSE): opening could hang.
    UserFilesystem,
}

impl Refusal {
    pub const ALL: [Refusal; 5] = [
        Refusal::NotRegular,
        Refusal::IdentityMismatch,
        Refusal::OpenFailed,
        Refusal::PerProcessLimit,
        Refusal::UserFilesystem,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Refusal::NotRegular => "not_regular",
            Refusal::IdentityMismatch => "identity_mismatch",
            Refusal::OpenFailed => "open_failed",
            Refusal::PerProcessLimit => "per_process_limit",
            Refusal::UserFilesystem => "user_filesystem",
        }
    }
}

/// Counters and gauges of the open-file registry (read by metrics).
#[derive(Debug, Default)]
pub struct OpenFileStats {
    /// Orders uses for the least-recently-used bound.
    clock: AtomicU64,
    pub open: AtomicU64,
    pub max_open: AtomicU64,
    pub opened: AtomicU64,
    pub evicted: AtomicU64,
    /// Closed files opened again through their mapping when needed.
    pub reopened: AtomicU64,
    refused: [AtomicU64; Refusal::ALL.len()],
}

impl OpenFileStats {
    pub fn refused(&self, reason: Refusal) -> u64 {
        self.refused[reason as usize].load(Ordering::Relaxed)
    }

    fn refuse(&self, reason: Refusal) {
        self.refused[reason as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// Every mapped file the daemon holds, shared by the process watcher and the
/// symbolizer, keyed by the device and inode the kernel shows in maps.
#[derive(Clone, Debug)]
pub struct OpenFiles {
    inner: Arc<Mutex<Registry>>,
    pub stats: Arc<OpenFileStats>,
}

#[derive(Debug)]
struct Registry {
    files: HashMap<(u64, u64), Weak<MappedFile>>,
    max_open: usize,
}

impl Default for OpenFiles {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_OPEN_FILES)
    }
}

impl OpenFiles {
    pub fn new(max_open: usize) -> Self {
        let stats = Arc::new(OpenFileStats::default());
        stats.max_open.store(max_open as u64, Ordering::Relaxed);
        Self {
            inner: Arc::new(Mutex::new(Registry {
                files: HashMap::new(),
                max_open: max_open.max(1),
            })),
            stats,
        }
    }

    /// The file behind one executable mapping of `pid`, shared with every
    /// other mapping of the same file; None (counted) when it cannot be
    /// opened safely.
    pub fn open(&self, proc: &ProcRoot, pid: u32, line: &MapsLine<'_>) -> Option<Arc<MappedFile>> {
        let maps_key = (line.dev, line.inode);
        let mut registry = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(file) = registry.files.get(&maps_key).and_then(Weak::upgrade)
            && file.is_open()
            && current_version(&file).is_some_and(|version| version == file.version)
        {
            file.touch();
            return Some(file);
        }
        let opened = match open_mapped(proc, pid, line) {
            Ok(opened) => opened,
            Err(reason) => {
                self.stats.refuse(reason);
                tracing::debug!(
                    pid,
                    path = line.path,
                    reason = reason.name(),
                    "mapped file refused"
                );
                return None;
            }
        };
        let mut released = Vec::new();
        registry.make_room(&self.stats, &mut released);
        let file = Arc::new(MappedFile {
            key: opened.key,
            maps_key,
            version: opened.version,
            origin: Origin {
                proc: proc.clone(),
                pid,
                start: line.start,
                end: line.end,
            },
            fd: Mutex::new(Some(opened.fd)),
            last_use: AtomicU64::new(0),
            stats: self.stats.clone(),
        });
        file.touch();
        self.stats.open.fetch_add(1, Ordering::Relaxed);
        self.stats.opened.fetch_add(1, Ordering::Relaxed);
        registry.files.insert(maps_key, Arc::downgrade(&file));
        drop(registry);
        // Dropped outside the lock: a last reference closes its descriptor.
        drop(released);
        Some(file)
    }

    /// Counts a mapping refused before any open (per-process bound, FUSE).
    pub fn refuse(&self, reason: Refusal) {
        self.stats.refuse(reason);
    }
}

impl Registry {
    /// Closes least recently used files until one more fits; forgets files
    /// nobody holds. Arcs upgraded here go to `released`, to be dropped
    /// after the lock.
    fn make_room(&mut self, stats: &OpenFileStats, released: &mut Vec<Arc<MappedFile>>) {
        if (stats.open.load(Ordering::Relaxed) as usize) < self.max_open {
            return;
        }
        let mut live: Vec<(u64, (u64, u64), Arc<MappedFile>)> = Vec::with_capacity(self.files.len());
        self.files.retain(|key, weak| match weak.upgrade() {
            Some(file) if file.is_open() => {
                live.push((file.last_use.load(Ordering::Relaxed), *key, file));
                true
            }
            _ => false,
        });
        // Close an eighth at once, so that a flood of new files does not
        // pay a scan per file.
        let excess = (live.len() + 1).saturating_sub(self.max_open);
        let evict = excess.max(self.max_open / 8).min(live.len());
        live.sort_unstable_by_key(|(last_use, _, _)| *last_use);
        for (_, key, file) in live.drain(..evict) {
            if file.close() {
                stats.evicted.fetch_add(1, Ordering::Relaxed);
            }
            self.files.remove(&key);
            released.push(file);
        }
        released.extend(live.into_iter().map(|(_, _, file)| file));
    }
}

#[derive(Debug)]
struct Origin {
    proc: ProcRoot,
    pid: u32,
    start: u64,
    end: u64,
}

impl Origin {
    /// Enough of a maps line to reopen through map_files (never by path).
    fn line(&self) -> MapsLine<'static> {
        MapsLine {
            start: self.start,
            end: self.end,
            executable: true,
            offset: 0,
            dev: 0,
            inode: 0,
            path: "",
        }
    }
}

pub(crate) struct Opened {
    pub fd: OwnedFd,
    pub key: FileKey,
    pub version: FileVersion,
}

/// Opens the file of one mapping of `pid` (see the module's comment).
pub(crate) fn open_mapped(proc: &ProcRoot, pid: u32, line: &MapsLine<'_>) -> Result<Opened, Refusal> {
    // The kernel's link to the very file mapped, even if deleted, replaced
    // or in another mount namespace; the path is never consulted.
    let link = proc.file(pid, &format!("map_files/{:x}-{:x}", line.start, line.end));
    if let Ok(file) = open_nonblocking(&link, 0) {
        return checked(file, None);
    }
    // Without CAP_CHECKPOINT_RESTORE/CAP_SYS_ADMIN the link cannot be
    // opened: the path then, if it still names the mapped inode.
    if !line.path.starts_with('/') || line.path.ends_with(" (deleted)") {
        return Err(Refusal::OpenFailed);
    }
    let file = open_nonblocking(Path::new(line.path), libc::O_NOFOLLOW).map_err(|_| Refusal::OpenFailed)?;
    checked(file, Some((line.dev, line.inode)))
}

fn open_nonblocking(path: &Path, extra_flags: i32) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY | extra_flags)
        .open(path)
}

/// Accepts a descriptor only if it is a regular file (and, when opened by
/// path, the mapped device and inode).
fn checked(file: File, expected: Option<(u64, u64)>) -> Result<Opened, Refusal> {
    let meta = file.metadata().map_err(|_| Refusal::OpenFailed)?;
    if !meta.file_type().is_file() {
        return Err(Refusal::NotRegular);
    }
    if let Some(expected) = expected
        && expected != (meta.dev(), meta.ino())
    {
        return Err(Refusal::IdentityMismatch);
    }
    Ok(Opened {
        key: FileKey {
            dev: meta.dev(),
            inode: meta.ino(),
        },
        version: version_of(&meta),
        fd: file.into(),
    })
}

fn version_of(meta: &std::fs::Metadata) -> FileVersion {
    FileVersion {
        size: meta.size(),
        mtime_ns: meta
            .mtime()
            .saturating_mul(1_000_000_000)
            .saturating_add(meta.mtime_nsec()),
    }
}

/// The file's size and mtime now, through the held descriptor.
fn current_version(file: &MappedFile) -> Option<FileVersion> {
    let held = file.fd.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    // fstat(2) on the borrowed descriptor: the same fields `version_of`
    // reads from a File's Metadata.
    let stat = nix::sys::stat::fstat(held.as_ref()?).ok()?;
    Some(FileVersion {
        size: stat.st_size as u64,
        mtime_ns: stat
            .st_mtime
            .saturating_mul(1_000_000_000)
            .saturating_add(stat.st_mtime_nsec),
    })
}

#[cfg(test)]
mod tests;
