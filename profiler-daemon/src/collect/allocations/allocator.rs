//! Which allocator a process really uses, and where to probe it: the
//! executable and the allocator libraries it maps (glibc's libc, jemalloc,
//! tcmalloc, mimalloc), each opened through the kernel's link to the very
//! file mapped (so a container's libc is its own) and read in the worker.

use std::{
    collections::HashSet,
    io::Read as _,
    os::{fd::OwnedFd, unix::fs::MetadataExt as _},
};

use profiler_common::alloc_op;

use super::AllocError;
use crate::{
    collect::{FileKey, FileVersion, mapped_file::open_mapped, parse_maps_line},
    procfs::ProcRoot,
};

/// Reads a file's allocator entry points (the symbolizer's sandboxed
/// worker does: the file is the traced process's owner's).
pub trait AllocatorReader {
    fn allocator(
        &mut self,
        fd: &OwnedFd,
        key: FileKey,
        version: FileVersion,
    ) -> Result<FileAllocator, String>;
}

/// A file's allocator, as far as the probes are concerned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileAllocator {
    /// It is a Go program.
    pub go: bool,
    /// (name, file offset) of each entry point found.
    pub symbols: Vec<(String, u64)>,
}

/// /proc/PID/maps read at most (a process can make it huge).
const MAX_MAPS_BYTES: u64 = 16 << 20;
/// Files asked about per process, at most.
const MAX_FILES: usize = 8;
/// No file is asked about once this long has gone on one process: the
/// worker may take its deadline on each file the process's owner crafted,
/// and this runs on the drain thread (its watchdog ends the daemon once it
/// has not drained for 30 s, seen within a quarter of that).
const MAX_SEARCH: std::time::Duration = std::time::Duration::from_secs(8);
/// Library names (before `.so`) whose allocator entry points are probed.
const ALLOCATOR_LIBRARIES: [&str; 5] = [
    "libc",
    "libjemalloc",
    "libtcmalloc",
    "libtcmalloc_minimal",
    "libmimalloc",
];

/// One file to probe: the path the kernel resolves to it, and the points.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbedFile {
    /// `/proc/PID/map_files/START-END`: the kernel's link to the file.
    pub path: std::path::PathBuf,
    /// (file offset, op) of every entry point, free included.
    pub entries: Vec<(u64, u64)>,
}

impl ProbedFile {
    /// The points whose return is probed too (all but the frees).
    pub fn returns(&self) -> Vec<(u64, u64)> {
        self.entries
            .iter()
            .copied()
            .filter(|&(_, op)| op != alloc_op::FREE)
            .collect()
    }
}

/// The names probed, as exported: the standard ones, then jemalloc's with
/// its prefixes (a Rust program's `tikv-jemallocator` exports `_rjem_*`).
pub const ALLOCATOR_NAMES: [&str; 10] = [
    "malloc",
    "calloc",
    "realloc",
    "free",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "valloc",
    "pvalloc",
    "cfree",
];
/// jemalloc's prefixes, and its extended API (size and flags arguments).
pub const JEMALLOC_PREFIXES: [&str; 2] = ["je_", "_rjem_"];
pub const JEMALLOC_EXTENDED: [&str; 4] = ["mallocx", "rallocx", "dallocx", "sdallocx"];

/// True for a name the probes know (with or without a jemalloc prefix).
pub fn is_allocator_name(name: &str) -> bool {
    let bare = JEMALLOC_PREFIXES
        .iter()
        .find_map(|prefix| name.strip_prefix(prefix))
        .unwrap_or(name);
    ALLOCATOR_NAMES.contains(&bare) || JEMALLOC_EXTENDED.contains(&bare)
}

/// The op a symbol name's probe records.
pub fn op_of(name: &str) -> Option<u64> {
    let bare = JEMALLOC_PREFIXES
        .iter()
        .find_map(|prefix| name.strip_prefix(prefix))
        .unwrap_or(name);
    Some(match bare {
        "malloc" | "valloc" | "pvalloc" | "mallocx" => alloc_op::MALLOC,
        "calloc" => alloc_op::CALLOC,
        "realloc" | "rallocx" => alloc_op::REALLOC,
        "memalign" | "aligned_alloc" => alloc_op::MEMALIGN,
        "posix_memalign" => alloc_op::POSIX_MEMALIGN,
        "free" | "cfree" | "dallocx" | "sdallocx" => alloc_op::FREE,
        _ => return None,
    })
}

/// True for a file whose allocator is probed: the executable, or an
/// allocator library (`libc.so.6`, `libjemalloc.so.2`, ...).
fn is_candidate(path: &str, executable: Option<(u64, u64)>, key: (u64, u64)) -> bool {
    if executable == Some(key) {
        return true;
    }
    let name = path.rsplit('/').next().unwrap_or(path);
    ALLOCATOR_LIBRARIES.iter().any(|library| {
        name.strip_prefix(library)
            .is_some_and(|rest| rest.starts_with(".so") || rest.starts_with('-'))
    })
}

/// The files of `pid` to probe, with their points.
pub fn probed_files(
    proc: &ProcRoot,
    pid: u32,
    reader: &mut dyn AllocatorReader,
) -> Result<Vec<ProbedFile>, AllocError> {
    let gone = |_| AllocError::NoProcess(pid);
    let mut maps = String::new();
    std::fs::File::open(proc.file(pid, "maps"))
        .map_err(gone)?
        .take(MAX_MAPS_BYTES)
        .read_to_string(&mut maps)
        .map_err(gone)?;
    // The executable's (dev, inode), as maps shows them.
    let executable = std::fs::metadata(proc.file(pid, "exe"))
        .ok()
        .map(|meta| (meta.dev(), meta.ino()));
    let mut seen = HashSet::new();
    let mut files = Vec::new();
    let mut go = false;
    let started = std::time::Instant::now();
    for line in maps.lines().filter_map(parse_maps_line) {
        if started.elapsed() > MAX_SEARCH {
            tracing::info!(pid, "allocator search stopped after {MAX_SEARCH:?}");
            break;
        }
        if !line.executable || !line.path.starts_with('/') || files.len() == MAX_FILES {
            continue;
        }
        let key = (line.dev, line.inode);
        if !is_candidate(line.path, executable, key) || !seen.insert(key) {
            continue;
        }
        let Ok(opened) = open_mapped(proc, pid, &line) else {
            continue;
        };
        let found = match reader.allocator(&opened.fd, opened.key, opened.version) {
            Ok(found) => found,
            Err(err) => {
                tracing::debug!(pid, path = line.path, "no allocator read: {err}");
                continue;
            }
        };
        go |= found.go && Some(key) == executable;
        let entries = points(&found.symbols);
        if entries.iter().any(|&(_, op)| op != alloc_op::FREE) {
            files.push(ProbedFile {
                path: proc.file(pid, &format!("map_files/{:x}-{:x}", line.start, line.end)),
                entries,
            });
        }
        drop::<OwnedFd>(opened.fd);
    }
    if go {
        return Err(AllocError::Go(pid));
    }
    if files.is_empty() {
        return Err(AllocError::NoAllocator(pid));
    }
    Ok(files)
}

/// (offset, op) per distinct offset: aliases at one address (glibc's
/// `aligned_alloc` is `memalign`) are probed once.
fn points(symbols: &[(String, u64)]) -> Vec<(u64, u64)> {
    let mut points: Vec<(u64, u64)> = Vec::new();
    for (name, offset) in symbols {
        let Some(op) = op_of(name) else { continue };
        if !points.iter().any(|&(known, _)| known == *offset) {
            points.push((*offset, op));
        }
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_and_without_jemalloc_prefixes() {
        assert!(is_allocator_name("malloc"));
        assert!(is_allocator_name("_rjem_sdallocx"));
        assert!(is_allocator_name("je_posix_memalign"));
        assert!(!is_allocator_name("mallocx_extra"));
        assert!(!is_allocator_name("__libc_malloc"));
        assert!(!is_allocator_name("je_"));
    }

    #[test]
    fn names_map_to_their_arguments() {
        assert_eq!(op_of("malloc"), Some(alloc_op::MALLOC));
        assert_eq!(op_of("_rjem_sdallocx"), Some(alloc_op::FREE));
        assert_eq!(op_of("je_rallocx"), Some(alloc_op::REALLOC));
        assert_eq!(op_of("aligned_alloc"), Some(alloc_op::MEMALIGN));
        assert_eq!(op_of("posix_memalign"), Some(alloc_op::POSIX_MEMALIGN));
        assert_eq!(op_of("__libc_malloc"), None);
    }

    #[test]
    fn aliases_are_probed_once() {
        let symbols = [
            ("memalign".to_owned(), 0x100),
            ("aligned_alloc".to_owned(), 0x100),
            ("free".to_owned(), 0x200),
            ("strlen".to_owned(), 0x300),
        ];
        assert_eq!(
            points(&symbols),
            [(0x100, alloc_op::MEMALIGN), (0x200, alloc_op::FREE)]
        );
    }

    #[test]
    fn candidates_are_the_executable_and_allocator_libraries() {
        let exe = Some((1, 2));
        assert!(is_candidate("/usr/bin/anything", exe, (1, 2)));
        assert!(is_candidate("/lib/x86_64-linux-gnu/libc.so.6", exe, (1, 3)));
        assert!(is_candidate("/usr/lib/libjemalloc.so.2", exe, (1, 4)));
        assert!(is_candidate("/usr/lib/libc-2.31.so", exe, (1, 5)));
        assert!(!is_candidate("/usr/lib/libcrypto.so.3", exe, (1, 6)));
        assert!(!is_candidate("/usr/lib/libcap.so.2", exe, (1, 7)));
    }
}
