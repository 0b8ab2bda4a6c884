//! The /proc seam: every read of another process's /proc files, and of the
//! cgroup hierarchy, goes through a [`ProcRoot`]. By default that is the
//! daemon's own `/proc`; in a container it is the host's, mounted elsewhere
//! (`proc_root = "/host/proc"`), as the pids the sampler reports are the
//! host's. The daemon's own files (`/proc/self/...`) and the kernel's
//! settings (`/proc/sys/...`) are its own and are read where they are.

use std::{
    io,
    path::{Path, PathBuf},
    sync::Arc,
};

#[cfg(test)]
pub mod fixture;

/// Where the /proc of the sampled processes is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcRoot {
    root: Arc<Path>,
}

impl Default for ProcRoot {
    fn default() -> Self {
        Self::new("/proc")
    }
}

impl ProcRoot {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: Arc::from(root.into()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    /// `/proc/PID` under this root.
    pub fn process(&self, pid: u32) -> PathBuf {
        self.root.join(pid.to_string())
    }

    /// `/proc/PID/NAME` under this root (NAME may have several parts).
    pub fn file(&self, pid: u32, name: &str) -> PathBuf {
        self.process(pid).join(name)
    }

    /// The text of `/proc/PID/NAME` under this root.
    pub fn read(&self, pid: u32, name: &str) -> io::Result<String> {
        std::fs::read_to_string(self.file(pid, name))
    }

    /// The processes there now (the numeric entries), in no order; none if
    /// the directory cannot be read.
    pub fn pids(&self) -> Vec<u32> {
        let Ok(entries) = std::fs::read_dir(&*self.root) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
            .collect()
    }

    /// The real uid of `pid` (its owner), from /proc/PID/status.
    pub fn real_uid(&self, pid: u32) -> Option<u32> {
        let status = self.read(pid, "status").ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    /// The daemon's own pid as this /proc numbers it: `self` under the
    /// root names the reader in that /proc's pid namespace, so in a
    /// container with the host's /proc this is the host pid the sampler
    /// reports, not the container's [`std::process::id`]. An error when
    /// the daemon is not visible there.
    pub fn own_pid(&self) -> io::Result<u32> {
        let link = std::fs::read_link(self.root.join("self"))?;
        link.to_str()
            .and_then(|pid| pid.parse().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("self -> {}", link.display())))
    }

    /// Whether process `pid` exists (as a process or a thread id).
    pub fn exists(&self, pid: u32) -> bool {
        self.process(pid).exists()
    }

    /// Where the cgroup v2 hierarchy may be mounted, most likely first (the
    /// unified layout, then the hybrid one's `unified/`). With the daemon's
    /// own /proc: its own `/sys/fs/cgroup`. With another: under the root of
    /// that /proc's init (PID 1), or of kthreadd (PID 2, whose root is the
    /// initial mount namespace's even where PID 1 may not be read), which
    /// hold the whole hierarchy, where the samples' cgroup ids are; then
    /// the daemon's own, for a container that shares the host's.
    pub fn cgroup_roots(&self) -> Vec<PathBuf> {
        let mut bases = Vec::new();
        if self.root.as_ref() != Path::new("/proc") {
            bases.push(self.file(1, "root"));
            bases.push(self.file(2, "root"));
        }
        bases.push(PathBuf::from("/"));
        bases
            .iter()
            .flat_map(|base| [base.join("sys/fs/cgroup"), base.join("sys/fs/cgroup/unified")])
            .collect()
    }
}

/// `statfs(2)`'s `f_type` of /proc.
const PROC_SUPER_MAGIC: i64 = 0x9fa0;

/// Whether `path` can be a [`ProcRoot`]: an absolute path to a mounted proc
/// file system. The message says what it is not.
pub fn check(path: &Path) -> Result<(), String> {
    if !path.is_absolute() {
        return Err(format!("{}: expected an absolute path", path.display()));
    }
    match filesystem_type(path) {
        Some(PROC_SUPER_MAGIC) => Ok(()),
        Some(_) => Err(format!(
            "{} is not a proc file system (mount the host's /proc there)",
            path.display()
        )),
        None => Err(format!("{}: no such directory", path.display())),
    }
}

/// The file system type (`statfs(2)`'s `f_type`) that `path` is on.
pub fn filesystem_type(path: &Path) -> Option<i64> {
    let stat = nix::sys::statfs::statfs(path).ok()?;
    Some(stat.filesystem_type().0 as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_under_the_root() {
        let host = ProcRoot::new("/host/proc");
        assert_eq!(host.file(42, "maps"), Path::new("/host/proc/42/maps"));
        assert_eq!(
            host.file(42, "map_files/1000-2000"),
            Path::new("/host/proc/42/map_files/1000-2000")
        );
        let roots = host.cgroup_roots();
        assert_eq!(roots[0], Path::new("/host/proc/1/root/sys/fs/cgroup"));
        assert_eq!(roots[3], Path::new("/host/proc/2/root/sys/fs/cgroup/unified"));
        assert_eq!(roots[4], Path::new("/sys/fs/cgroup"));
        let own = ProcRoot::default();
        assert_eq!(own.process(7), Path::new("/proc/7"));
        assert_eq!(own.cgroup_roots()[0], Path::new("/sys/fs/cgroup"));
    }

    #[test]
    fn the_own_pid_is_the_one_the_root_gives() {
        assert_eq!(ProcRoot::default().own_pid().unwrap(), std::process::id());
        let dir = std::env::temp_dir().join(format!("profilerd-own-pid-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let host = ProcRoot::new(&dir);
        assert!(host.own_pid().is_err(), "no self link");
        std::os::unix::fs::symlink("4242", dir.join("self")).unwrap();
        assert_eq!(host.own_pid().unwrap(), 4242);
        std::fs::remove_file(dir.join("self")).unwrap();
        std::os::unix::fs::symlink("../etc", dir.join("self")).unwrap();
        assert_eq!(host.own_pid().unwrap_err().kind(), io::ErrorKind::InvalidData);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_a_mounted_proc_is_a_root() {
        assert_eq!(check(Path::new("/proc")), Ok(()));
        let refused = |path: &str| check(Path::new(path)).expect_err(path);
        assert!(refused("proc").contains("absolute"));
        assert!(refused("/").contains("is not a proc file system"));
        assert!(refused("/no/such/proc").contains("no such directory"));
    }
}
