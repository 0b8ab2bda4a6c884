//! A process's executable mappings, read from /proc while it still runs, and
//! kept usable after it exits: files that cannot be reopened later by path
//! (deleted, replaced, or in another mount namespace) are held open.

use std::{collections::HashMap, path::PathBuf, sync::Arc};

use super::{
    mapped_file::{MappedFile, OpenFiles, Refusal},
    proc_maps::{UserFilesystems, parse_maps_line},
    readable::{ReadableBy, readable_by_status},
};
use crate::procfs::ProcRoot;

/// Files one process may have held open for it: far more than the shared
/// libraries a real program maps, far less than the descriptor bound.
pub const MAX_FILES_PER_PROCESS: usize = 512;

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
    /// Who could read the process when the snapshot was read (its
    /// credentials in /proc/PID/status, and whether it was dumpable): who may
    /// see its samples, even after it exits.
    pub readable_by: ReadableBy,
    /// Executable mappings, sorted by address.
    pub mappings: Vec<SnapshotMapping>,
    /// The process's pid in its own pid namespace, when that is not ours
    /// (the last `NSpid:` field of /proc/PID/status).
    pub ns_pid: Option<u32>,
    /// The process's cgroup id and path (see [`crate::cgroup::read_process_cgroup`]).
    pub cgroup: Option<(u64, String)>,
}

/// Reads snapshots; files are shared through one [`OpenFiles`] registry.
pub struct SnapshotReader {
    files: OpenFiles,
    proc: ProcRoot,
    /// Where the cgroup v2 hierarchy is (see [`crate::cgroup::v2_root`]).
    cgroup_root: Option<PathBuf>,
}

impl Default for SnapshotReader {
    fn default() -> Self {
        Self::new(OpenFiles::default(), ProcRoot::default())
    }
}

impl SnapshotReader {
    pub fn new(files: OpenFiles, proc: ProcRoot) -> Self {
        let cgroup_root = crate::cgroup::v2_root(&proc);
        Self {
            files,
            proc,
            cgroup_root,
        }
    }

    /// The /proc it reads.
    pub fn proc(&self) -> &ProcRoot {
        &self.proc
    }

    /// The cgroup v2 hierarchy, as found through that /proc.
    pub fn cgroup_root(&self) -> Option<&std::path::Path> {
        self.cgroup_root.as_deref()
    }

    pub fn read(&mut self, pid: u32, instance: u32) -> std::io::Result<ProcessSnapshot> {
        let proc = &self.proc;
        let maps = proc.read(pid, "maps")?;
        let comm = proc
            .read(pid, "comm")
            .map(|comm| comm.trim_end_matches('\n').to_owned())
            .unwrap_or_default();
        let status = proc.read(pid, "status").unwrap_or_default();
        let readable_by = readable_by_status(proc, pid, &status);
        let ns_pid = ns_pid_in(&status);
        let cgroup = self
            .cgroup_root
            .as_deref()
            .and_then(|root| crate::cgroup::read_process_cgroup(proc, pid, root));
        let mut mappings = Vec::new();
        let mut files: HashMap<(u64, u64), Arc<MappedFile>> = HashMap::new();
        let mut user_filesystems: Option<UserFilesystems> = None;
        for line in maps.lines() {
            let Some(parsed) = parse_maps_line(line) else {
                continue;
            };
            if !parsed.executable {
                continue;
            }
            let file = if parsed.inode == 0 || !parsed.path.starts_with('/') {
                None
            } else if let Some(file) = files.get(&(parsed.dev, parsed.inode)) {
                Some(file.clone())
            } else if files.len() >= MAX_FILES_PER_PROCESS {
                self.files.refuse(Refusal::PerProcessLimit);
                None
            } else if libc::major(parsed.dev) == 0
                && user_filesystems
                    .get_or_insert_with(|| UserFilesystems::of(&self.proc, pid))
                    .contains(parsed.dev)
            {
                // Opening a file on FUSE asks the process that serves the
                // mount, which any user can run (in a user namespace) and
                // which need never answer: the open would hang this thread.
                self.files.refuse(Refusal::UserFilesystem);
                None
            } else {
                let file = self.files.open(&self.proc, pid, &parsed);
                if let Some(file) = &file {
                    files.insert(file.maps_key, file.clone());
                }
                file
            };
            mappings.push(SnapshotMapping {
                start: parsed.start,
                end: parsed.end,
                offset: parsed.offset,
                path: Arc::from(parsed.path),
                file,
            });
        }
        mappings.sort_by_key(|mapping| mapping.start);
        Ok(ProcessSnapshot {
            pid,
            instance,
            comm,
            readable_by,
            mappings,
            ns_pid,
            cgroup,
        })
    }
}

/// The innermost pid of `NSpid:` (one pid per nested pid namespace, ours
/// first), when the process is in a namespace below ours.
fn ns_pid_in(status: &str) -> Option<u32> {
    let pids: Vec<&str> = status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))?
        .split_whitespace()
        .collect();
    match pids.as_slice() {
        [_, .., innermost] => innermost.parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let uid = nix::unistd::getuid().as_raw();
        assert_eq!(snapshot.readable_by, ReadableBy::User(uid), "our own process");
        assert_eq!(
            snapshot.ns_pid, None,
            "the test runs in the daemon's pid namespace"
        );
        let (_, path) = snapshot
            .cgroup
            .expect("our own cgroup (a cgroup v2 hierarchy is mounted)");
        let proc_cgroup = std::fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
        assert!(
            proc_cgroup.lines().any(|line| line == format!("0::{path}")),
            "{path} in {proc_cgroup}"
        );
    }

    #[test]
    fn a_snapshot_reads_only_through_its_proc_root() {
        use std::os::unix::fs::MetadataExt as _;

        use crate::procfs::fixture::{FixtureProc, own_ids};
        let fixture = FixtureProc::new("snapshot");
        let (uid, gid) = own_ids();
        // A real file to map (opened by path: the fixture has no map_files).
        let exe = std::fs::read_link("/proc/self/exe").expect("our exe");
        let meta = std::fs::metadata(&exe).expect("our exe's metadata");
        let pid = 4242;
        fixture
            .write(
                pid,
                "maps",
                &format!(
                    "00400000-00452000 r-xp 00000000 {:02x}:{:02x} {} {}\n\
                     00652000-00653000 rw-p 00052000 {:02x}:{:02x} {} {}\n\
                     7ffd0000-7ffd1000 rw-p 00000000 00:00 0 [stack]\n",
                    libc::major(meta.dev()),
                    libc::minor(meta.dev()),
                    meta.ino(),
                    exe.display(),
                    libc::major(meta.dev()),
                    libc::minor(meta.dev()),
                    meta.ino(),
                    exe.display(),
                ),
            )
            .write(pid, "comm", "fixture-app\n")
            .write(
                pid,
                "status",
                &FixtureProc::status([uid; 3], [gid; 3], 0, &[pid, 7]),
            )
            .write(pid, "mountinfo", "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n");
        let mut reader = SnapshotReader::new(OpenFiles::default(), fixture.root());
        let snapshot = reader.read(pid, 1).expect("the fixture's process");
        assert_eq!(snapshot.comm, "fixture-app");
        assert_eq!(snapshot.readable_by, ReadableBy::User(uid));
        assert_eq!(snapshot.ns_pid, Some(7));
        assert_eq!(snapshot.cgroup, None, "no cgroup v2 hierarchy under the fixture");
        assert_eq!(
            snapshot.mappings.len(),
            1,
            "executable mappings only: {:?}",
            snapshot.mappings
        );
        assert_eq!(*snapshot.mappings[0].path, *exe.to_string_lossy());
        assert!(snapshot.mappings[0].file.is_some(), "the mapped file, opened");
        // Our own process is not in the fixture: nothing comes from /proc.
        assert!(reader.read(std::process::id(), 1).is_err());
    }

    #[test]
    fn ns_pid_is_the_innermost_of_nested_namespaces() {
        assert_eq!(ns_pid_in("Name:\tx\nNSpid:\t4242\t17\t1\n"), Some(1));
        assert_eq!(ns_pid_in("NSpid:\t4242\t7\n"), Some(7));
        assert_eq!(ns_pid_in("NSpid:\t4242\n"), None);
        assert_eq!(ns_pid_in("Name:\tx\n"), None);
    }
}
