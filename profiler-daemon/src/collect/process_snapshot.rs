//! A process's executable mappings, read from /proc while it still runs, and
//! kept usable after it exits: files that cannot be reopened later by path
//! (deleted, replaced, or in another mount namespace) are held open.

use std::{
    collections::HashMap,
    fs::File,
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::PathBuf,
    sync::{Arc, Weak},
};

/// Identity of a file: cache keys use it, never a path, since paths
/// (and `/proc/self/fd/N` numbers) get reused for other files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    pub dev: u64,
    pub inode: u64,
}

/// A mapped file, held open from the moment the process was first seen, so
/// it stays readable after the process exits and after the file is deleted
/// or replaced on disk (the descriptor keeps the old inode).
#[derive(Debug)]
pub struct MappedFile {
    /// `/proc/self/fd/N` of the held descriptor: what the ELF reader opens.
    pub access_path: PathBuf,
    pub key: FileKey,
    _held: File,
}

#[derive(Clone, Debug)]
pub struct SnapshotMapping {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    /// The path as /proc/PID/maps shows it (e.g. `/usr/bin/foo`, `[vdso]`, ``).
    pub path: Arc<str>,
    pub file: Option<Arc<MappedFile>>,
}

#[derive(Clone, Debug)]
pub struct ProcessSnapshot {
    pub pid: u32,
    /// The sampler's instance id for this exec of the process.
    pub instance: u32,
    /// The process name (its main thread's comm).
    pub comm: String,
    /// Executable mappings, sorted by address.
    pub mappings: Vec<SnapshotMapping>,
}

/// One parsed line of /proc/PID/maps.
#[derive(Debug, PartialEq, Eq)]
pub struct MapsLine<'a> {
    pub start: u64,
    pub end: u64,
    pub executable: bool,
    pub offset: u64,
    pub inode: u64,
    pub path: &'a str,
}

/// Parses `start-end perms offset dev inode [path]`; None if malformed.
pub fn parse_maps_line(line: &str) -> Option<MapsLine<'_>> {
    let mut rest = line;
    let mut field = || {
        let trimmed = rest.trim_start();
        let end = trimmed.find(char::is_whitespace).unwrap_or(trimmed.len());
        let (field, tail) = trimmed.split_at(end);
        rest = tail;
        (!field.is_empty()).then_some(field)
    };
    let (start, end) = field()?.split_once('-')?;
    let perms = field()?;
    let offset = field()?;
    let _dev = field()?;
    let inode = field()?;
    Some(MapsLine {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        executable: perms.as_bytes().get(2) == Some(&b'x'),
        offset: u64::from_str_radix(offset, 16).ok()?,
        inode: inode.parse().ok()?,
        path: rest.trim(),
    })
}

/// Reads snapshots, sharing open files between processes that map the same inode.
#[derive(Default)]
pub struct SnapshotReader {
    held: HashMap<(u64, PathBuf), Weak<MappedFile>>,
    reads: u64,
}

impl SnapshotReader {
    pub fn read(&mut self, pid: u32, instance: u32) -> std::io::Result<ProcessSnapshot> {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|comm| comm.trim_end_matches('\n').to_owned())
            .unwrap_or_default();
        let mut mappings = Vec::new();
        for line in maps.lines() {
            let Some(parsed) = parse_maps_line(line) else {
                continue;
            };
            if !parsed.executable {
                continue;
            }
            let file = (parsed.inode != 0 && parsed.path.starts_with('/'))
                .then(|| self.mapped_file(pid, &parsed))
                .flatten();
            mappings.push(SnapshotMapping {
                start: parsed.start,
                end: parsed.end,
                offset: parsed.offset,
                path: Arc::from(parsed.path),
                file,
            });
        }
        mappings.sort_by_key(|mapping| mapping.start);
        self.reads += 1;
        if self.reads.is_multiple_of(1024) {
            self.held.retain(|_, file| file.strong_count() > 0);
        }
        Ok(ProcessSnapshot {
            pid,
            instance,
            comm,
            mappings,
        })
    }

    fn mapped_file(&mut self, pid: u32, line: &MapsLine<'_>) -> Option<Arc<MappedFile>> {
        let held_key = (line.inode, PathBuf::from(line.path));
        if let Some(file) = self.held.get(&held_key).and_then(Weak::upgrade) {
            return Some(file);
        }
        // By path when it still names the mapped inode from our mount
        // namespace; else (deleted, replaced, another namespace) through the
        // process's own mapping.
        let by_path = std::fs::metadata(&held_key.1).is_ok_and(|meta| meta.ino() == line.inode);
        let map_file = format!("/proc/{pid}/map_files/{:x}-{:x}", line.start, line.end);
        let held = if by_path {
            File::open(&held_key.1)
        } else {
            File::open(&map_file)
        }
        .ok()?;
        let meta = held.metadata().ok()?;
        if meta.ino() != line.inode {
            return None;
        }
        let file = Arc::new(MappedFile {
            access_path: PathBuf::from(format!("/proc/self/fd/{}", held.as_raw_fd())),
            key: FileKey {
                dev: meta.dev(),
                inode: meta.ino(),
            },
            _held: held,
        });
        self.held.insert(held_key, Arc::downgrade(&file));
        Some(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_file_backed_line() {
        let line = "55d4c2a00000-55d4c2a02000 r-xp 00002000 fd:01 1234567                    /usr/bin/my tool (deleted)";
        let parsed = parse_maps_line(line).expect("a valid maps line");
        assert_eq!(
            parsed,
            MapsLine {
                start: 0x55d4c2a00000,
                end: 0x55d4c2a02000,
                executable: true,
                offset: 0x2000,
                inode: 1234567,
                path: "/usr/bin/my tool (deleted)",
            }
        );
    }

    #[test]
    fn parses_anonymous_and_special_lines() {
        let anon = parse_maps_line("7ffd1000-7ffd3000 rw-p 00000000 00:00 0").expect("anonymous line");
        assert_eq!((anon.executable, anon.inode, anon.path), (false, 0, ""));
        let vdso = parse_maps_line("7fff0000-7fff2000 r-xp 00000000 00:00 0                  [vdso]")
            .expect("vdso line");
        assert_eq!((vdso.executable, vdso.path), (true, "[vdso]"));
    }

    #[test]
    fn rejects_malformed_lines() {
        for line in [
            "",
            "zzzz-1000 r-xp 0 00:00 0",
            "1000 r-xp 0 00:00 0",
            "1000-2000 r-xp",
        ] {
            assert_eq!(parse_maps_line(line), None, "{line:?} should not parse");
        }
    }

    #[test]
    fn snapshot_of_self_has_this_test_binary() {
        let me = std::process::id();
        let snapshot = SnapshotReader::default()
            .read(me, 7)
            .expect("reading our own maps");
        let exe = std::fs::read_link("/proc/self/exe").expect("our exe");
        assert!(
            snapshot
                .mappings
                .iter()
                .any(|mapping| mapping.file.is_some() && *mapping.path == *exe.to_string_lossy()),
            "expected an executable mapping of {exe:?} in {:?}",
            snapshot.mappings
        );
    }
}
