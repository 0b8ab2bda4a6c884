//! Who may read a process's samples: the kernel's own rule for reading
//! another process (`ptrace_may_access` with PTRACE_MODE_READ_REALCREDS, the
//! check behind `perf_event_open` on a pid and `/proc/PID/maps`), not its
//! real uid alone. A set-uid-root program a user starts (`su`, `passwd`)
//! keeps the user's real uid while it runs as root; the kernel refuses that
//! user, and so must the profiler.
//!
//! What /proc shows a process's owner is hostile input: every field that is
//! missing or does not parse makes the process [`ReadableBy::Privileged`].

use std::{
    fs::File,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::fs::MetadataExt,
    },
};

use crate::{procfs::ProcRoot, shares::Owner};

/// Who, besides those who see every process (root, the access group, a
/// bearer token), may read a process's samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadableBy {
    /// The kernel lets this user read the process: its real, effective and
    /// saved uids are all this user's, its gids agree likewise, it is
    /// dumpable, and it holds no capability the user lacks.
    User(u32),
    /// No unprivileged user: a set-uid or set-gid program, one that made
    /// itself undumpable or changed credentials, one with capabilities, or
    /// one whose credentials could not be read (it exited first).
    Privileged,
}

/// A process charges the user who may read it; set-uid programs and those
/// whose owner could not be read charge the privileged part.
impl From<ReadableBy> for Owner {
    fn from(readable_by: ReadableBy) -> Self {
        match readable_by {
            ReadableBy::Privileged | ReadableBy::User(0) => Owner::Privileged,
            ReadableBy::User(uid) => Owner::User(uid),
        }
    }
}

/// The credentials /proc/PID/status shows, as far as the rule needs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Credentials {
    /// Real, effective, saved.
    uids: [u32; 3],
    gids: [u32; 3],
    /// `CapPrm:`, the permitted capabilities.
    permitted: u64,
}

/// Reads who may read process `pid` now.
pub fn readable_by(proc: &ProcRoot, pid: u32) -> ReadableBy {
    match proc.read(pid, "status") {
        Ok(status) => readable_by_status(proc, pid, &status),
        Err(_) => ReadableBy::Privileged,
    }
}

/// As [`readable_by`], with the status already read. The rest is read
/// after it: a process that execs a set-uid program in between is found
/// undumpable (owned by root) then, so a race errs towards hiding.
pub fn readable_by_status(proc: &ProcRoot, pid: u32, status: &str) -> ReadableBy {
    let Some(credentials) = credentials_in(status) else {
        return ReadableBy::Privileged;
    };
    // The kernel shows /proc/PID as owned by the task's effective uid only
    // while it is dumpable, else by root (task_dump_owner): the one place
    // /proc tells another process's dumpable flag.
    let Ok(dump_owner) = std::fs::metadata(proc.process(pid)).map(|meta| meta.uid()) else {
        return ReadableBy::Privileged;
    };
    decide(credentials, dump_owner, || namespace_owner(proc, pid))
}

/// The rule, given the credentials, the owner of /proc/PID and (asked only
/// when the process holds capabilities) the owner of the user namespace it
/// runs in, when that is not the daemon's.
fn decide(
    credentials: Credentials,
    dump_owner: u32,
    namespace_owner: impl FnOnce() -> Option<u32>,
) -> ReadableBy {
    let [uid, euid, suid] = credentials.uids;
    let [gid, egid, sgid] = credentials.gids;
    // A caller passes the kernel's check only if its uid is each of the
    // target's real, effective and saved uids (and likewise for gids):
    // set-uid and set-gid programs fail it.
    if uid != euid || uid != suid || gid != egid || gid != sgid {
        return ReadableBy::Privileged;
    }
    if dump_owner != uid {
        return ReadableBy::Privileged;
    }
    // Root's processes hold every capability: only root (who sees all) may
    // read them whatever the rest says.
    if uid == 0 {
        return ReadableBy::User(0);
    }
    // The kernel also refuses a caller who lacks capabilities the target
    // holds (a file-capability binary), unless the target's capabilities
    // are those of a user namespace the caller owns (a rootless container),
    // in which the caller holds every capability.
    if credentials.permitted != 0 && namespace_owner() != Some(uid) {
        return ReadableBy::Privileged;
    }
    ReadableBy::User(uid)
}

fn credentials_in(status: &str) -> Option<Credentials> {
    let ids = |prefix: &str| -> Option<[u32; 3]> {
        let mut fields = status
            .lines()
            .find_map(|line| line.strip_prefix(prefix))?
            .split_whitespace()
            .map(|id| id.parse::<u32>().ok());
        Some([fields.next()??, fields.next()??, fields.next()??])
    };
    let permitted = status
        .lines()
        .find_map(|line| line.strip_prefix("CapPrm:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())?;
    Some(Credentials {
        uids: ids("Uid:")?,
        gids: ids("Gid:")?,
        permitted,
    })
}

/// User namespaces nest at most 32 deep.
const MAX_NAMESPACE_DEPTH: usize = 33;

/// The owner of the user namespace below the daemon's that process `pid`
/// runs in (or under, when nested): the user who holds every capability
/// there. None when the process is in the daemon's own namespace, or when
/// it cannot be told.
fn namespace_owner(proc: &ProcRoot, pid: u32) -> Option<u32> {
    let ours = std::fs::metadata("/proc/self/ns/user").ok()?;
    let same = |file: &File| {
        file.metadata()
            .is_ok_and(|meta| meta.ino() == ours.ino() && meta.dev() == ours.dev())
    };
    let mut namespace: File = File::open(proc.file(pid, "ns/user")).ok()?;
    if same(&namespace) {
        return None;
    }
    for _ in 0..MAX_NAMESPACE_DEPTH {
        // SAFETY: NS_GET_PARENT takes no argument and returns a new file
        // descriptor (or -1) for the parent namespace of the open one.
        let parent = unsafe { libc::ioctl(namespace.as_raw_fd(), libc::NS_GET_PARENT) };
        if parent < 0 {
            return None;
        }
        // SAFETY: the descriptor was just returned to us and nothing else owns it.
        let parent = File::from(unsafe { OwnedFd::from_raw_fd(parent) });
        if same(&parent) {
            let mut owner: libc::uid_t = 0;
            // SAFETY: NS_GET_OWNER_UID writes one uid_t to the pointer,
            // which points to one that lives across the call.
            let result =
                unsafe { libc::ioctl(namespace.as_raw_fd(), libc::NS_GET_OWNER_UID, &raw mut owner) };
            return (result == 0).then_some(owner);
        }
        namespace = parent;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const USER: u32 = 1002;

    #[test]
    fn the_uid_check_reads_the_fixture_proc() {
        use crate::procfs::fixture::{FixtureProc, own_ids};
        let fixture = FixtureProc::new("readable");
        let (uid, gid) = own_ids();
        // Each process's directory is ours, as a dumpable process's of ours is.
        fixture.write(1, "status", &FixtureProc::status([uid; 3], [gid; 3], 0, &[1]));
        fixture.write(
            2,
            "status",
            &FixtureProc::status([uid, uid + 1, uid + 1], [gid; 3], 0, &[2]),
        );
        fixture.write(3, "status", "Name:\tbroken\n");
        let proc = fixture.root();
        assert_eq!(readable_by(&proc, 1), ReadableBy::User(uid));
        assert_eq!(readable_by(&proc, 2), ReadableBy::Privileged, "set-uid");
        assert_eq!(readable_by(&proc, 3), ReadableBy::Privileged, "malformed");
        assert_eq!(readable_by(&proc, 4), ReadableBy::Privileged, "absent");
    }

    #[test]
    fn root_and_unknown_owners_are_privileged_every_other_uid_a_user() {
        assert_eq!(Owner::from(ReadableBy::Privileged), Owner::Privileged);
        assert_eq!(Owner::from(ReadableBy::User(0)), Owner::Privileged);
        assert_eq!(Owner::from(ReadableBy::User(999)), Owner::User(999));
        assert_eq!(Owner::from(ReadableBy::User(1000)), Owner::User(1000));
    }

    fn credentials(uids: [u32; 3], gids: [u32; 3], permitted: u64) -> Credentials {
        Credentials {
            uids,
            gids,
            permitted,
        }
    }

    fn no_namespace() -> Option<u32> {
        None
    }

    #[test]
    fn a_plain_process_is_its_users() {
        let plain = credentials([USER; 3], [100; 3], 0);
        assert_eq!(decide(plain, USER, no_namespace), ReadableBy::User(USER));
    }

    #[test]
    fn set_uid_set_gid_and_changed_credentials_are_privileged() {
        for (uids, gids) in [
            ([USER, 0, 0], [100; 3]),
            ([USER, USER, 0], [100; 3]),
            ([0, USER, USER], [100; 3]),
            ([USER; 3], [100, 42, 42]),
            ([USER; 3], [100, 100, 42]),
        ] {
            assert_eq!(
                decide(credentials(uids, gids, 0), USER, no_namespace),
                ReadableBy::Privileged,
                "uids {uids:?} gids {gids:?}"
            );
        }
    }

    #[test]
    fn an_undumpable_process_is_privileged() {
        // /proc/PID owned by root: not dumpable.
        let plain = credentials([USER; 3], [100; 3], 0);
        assert_eq!(decide(plain, 0, no_namespace), ReadableBy::Privileged);
    }

    #[test]
    fn capabilities_are_privileged_unless_of_the_users_own_namespace() {
        let capable = credentials([USER; 3], [100; 3], 0x20_0000);
        assert_eq!(decide(capable, USER, no_namespace), ReadableBy::Privileged);
        assert_eq!(decide(capable, USER, || Some(0)), ReadableBy::Privileged);
        assert_eq!(decide(capable, USER, || Some(USER + 1)), ReadableBy::Privileged);
        assert_eq!(decide(capable, USER, || Some(USER)), ReadableBy::User(USER));
        let root = credentials([0; 3], [0; 3], 0x1ff_ffff_ffff);
        assert_eq!(decide(root, 0, no_namespace), ReadableBy::User(0));
    }

    #[test]
    fn malformed_status_is_privileged() {
        for status in [
            "",
            "Uid:\t1002\t1002\t1002\t1002\nGid:\t100\t100\t100\t100\n",
            "Uid:\t1002\t1002\nGid:\t100\t100\t100\t100\nCapPrm:\t0000000000000000\n",
            "Uid:\t1002\t1002\tx\t1002\nGid:\t100\t100\t100\t100\nCapPrm:\t0000000000000000\n",
            "Uid:\t1002\t1002\t1002\t1002\nGid:\t100\t100\t100\t100\nCapPrm:\tzz\n",
        ] {
            assert_eq!(credentials_in(status), None, "{status:?}");
        }
        assert_eq!(
            credentials_in(
                "Uid:\t1002\t1002\t1002\t1002\nGid:\t100\t100\t100\t100\nCapPrm:\t0000000000000000\n"
            ),
            Some(credentials([USER; 3], [100; 3], 0))
        );
    }

    #[test]
    fn this_process_is_readable_by_its_user() {
        // The tests run as root (the daemon's own kind of process).
        let uid = nix::unistd::getuid().as_raw();
        assert_eq!(
            readable_by(&ProcRoot::default(), std::process::id()),
            ReadableBy::User(uid)
        );
        assert_eq!(
            namespace_owner(&ProcRoot::default(), std::process::id()),
            None,
            "the daemon's own namespace"
        );
        assert_eq!(
            readable_by(&ProcRoot::default(), u32::MAX),
            ReadableBy::Privileged,
            "no such process"
        );
    }
}
