//! A process's executable mappings, read from /proc while it still runs, and
//! kept usable after it exits: files that cannot be reopened later by path
//! (deleted, replaced, or in another mount namespace) are held open.

use std::{collections::HashMap, sync::Arc};

use super::{
    mapped_file::{MappedFile, OpenFiles, Refusal},
    proc_maps::{UserFilesystems, parse_maps_line},
    readable::{ReadableBy, readable_by_status},
};

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
#[derive(Default)]
pub struct SnapshotReader {
    files: OpenFiles,
}

impl SnapshotReader {
    pub fn new(files: OpenFiles) -> Self {
        Self { files }
    }

    pub fn read(&mut self, pid: u32, instance: u32) -> std::io::Result<ProcessSnapshot> {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|comm| comm.trim_end_matches('\n').to_owned())
            .unwrap_or_default();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let readable_by = readable_by_status(pid, &status);
        let ns_pid = ns_pid_in(&status);
        let cgroup = crate::cgroup::v2_root().and_then(|root| crate::cgroup::read_process_cgroup(pid, root));
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
                    .get_or_insert_with(|| UserFilesystems::of(pid))
                    .contains(parsed.dev)
            {
                // Opening a file on FUSE asks the process that serves the
                // mount, which any user can run (in a user namespace) and
                // which need never answer: the open would hang this thread.
                self.files.refuse(Refusal::UserFilesystem);
                None
            } else {
                let file = self.files.open(pid, &parsed);
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
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
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
    fn ns_pid_is_the_innermost_of_nested_namespaces() {
        assert_eq!(ns_pid_in("Name:\tx\nNSpid:\t4242\t17\t1\n"), Some(1));
        assert_eq!(ns_pid_in("NSpid:\t4242\t7\n"), Some(7));
        assert_eq!(ns_pid_in("NSpid:\t4242\n"), None);
        assert_eq!(ns_pid_in("Name:\tx\n"), None);
    }
}
