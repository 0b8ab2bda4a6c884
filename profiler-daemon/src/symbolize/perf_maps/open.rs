//! Opening a process's perf map: hostile input, so the file the process
//! itself would see, found without asking a user's filesystem, without
//! following any link, without blocking, and only the owner's.

use std::os::fd::OwnedFd;

use nix::{
    fcntl::{OFlag, OpenHow, ResolveFlag},
    sys::stat::{Mode, SFlag, fstat},
};

use crate::{collect::fuse_on_path, procfs::ProcRoot, symbolize::worker::FileIdentity};

/// The process's perf map as it sees it, if it has one it may show: None
/// without one; Err(why) for one that is refused.
pub(super) fn open(
    proc: &ProcRoot,
    pid: u32,
    ns_pid: u32,
) -> Result<Option<(OwnedFd, FileIdentity)>, String> {
    let owner = proc.real_uid(pid).ok_or("the process's owner is unknown")?;
    let path = format!("/tmp/perf-{ns_pid}.map");
    // Looking up a path on FUSE asks the process serving it, which any user
    // can run and which need never answer: this thread would hang.
    if fuse_on_path(proc, pid, &path) {
        return Err("a user filesystem (FUSE) on its path, or an unreadable mount table".into());
    }
    // The magic link to its root is followed once, on purpose; everything
    // inside is resolved as if that were `/`, with no link followed.
    let root = match nix::fcntl::open(
        &proc.file(pid, "root"),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(root) => root,
        Err(_) => return Ok(None),
    };
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | OFlag::O_NOCTTY)
        .resolve(
            ResolveFlag::RESOLVE_IN_ROOT
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
    let fd = match nix::fcntl::openat2(&root, &path[1..], how) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(nix::errno::Errno::ELOOP) => return Err("a symbolic link on the way".into()),
        Err(err) => return Err(format!("opening it: {err}")),
    };
    let stat = fstat(&fd).map_err(|err| format!("fstat: {err}"))?;
    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err("not a regular file".into());
    }
    let world_readable = stat.st_mode & 0o004 != 0;
    if stat.st_uid != owner && !(stat.st_uid == 0 && world_readable) {
        return Err(format!(
            "owned by uid {}, not by the process's owner {owner}",
            stat.st_uid
        ));
    }
    let identity = FileIdentity {
        dev: stat.st_dev,
        inode: stat.st_ino,
        size: u64::try_from(stat.st_size).unwrap_or(0),
        // A user sets a file's times as they like: saturating, never a panic.
        mtime_ns: stat
            .st_mtime
            .saturating_mul(1_000_000_000)
            .saturating_add(stat.st_mtime_nsec),
    };
    Ok(Some((fd, identity)))
}
