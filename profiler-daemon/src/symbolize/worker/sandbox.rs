//! What the worker process may do: nothing the daemon's privileges allow.
//! Set between fork and exec, so it holds from the worker's first instruction.

use std::io;

use nix::{
    sys::{
        prctl,
        resource::{Resource, getrlimit, setrlimit},
        signal::{SigHandler, Signal, signal},
    },
    unistd::{Gid, Uid, geteuid, getuid, setgroups, setresgid, setresuid},
};

/// The unprivileged identity a worker started by root takes.
const NOBODY: u32 = 65534;
/// Descriptors the worker may hold: its cached files and what blazesym opens.
const WORKER_MAX_FILES: u64 = 1024;

/// Runs in the child between fork and exec: only async-signal-safe calls
/// (setrlimit, prctl and raw syscalls, no allocation: nix's wrappers of
/// these are the bare calls on stack values).
///
/// # Safety
/// Must only be called in a freshly forked child before exec.
pub unsafe fn confine(memory_bytes: u64) -> io::Result<()> {
    prctl::set_pdeathsig(Signal::SIGKILL)?;
    // Ctrl-C at `profilerd record` reaches the whole process group:
    // the daemon stops the worker itself.
    // SAFETY: SIG_IGN installs no handler, so no code of ours can run in
    // signal context; the disposition survives exec, as intended.
    let _ = unsafe { signal(Signal::SIGINT, SigHandler::SigIgn) };
    limit(Resource::RLIMIT_DATA, memory_bytes)?;
    limit(Resource::RLIMIT_CORE, 0)?;
    limit(Resource::RLIMIT_NOFILE, WORKER_MAX_FILES)?;
    // Ambient capabilities (a systemd unit's AmbientCapabilities) would
    // survive exec: clear them first. nix has no PR_CAP_AMBIENT.
    // SAFETY: a plain prctl on this process with integer arguments only;
    // it neither allocates nor takes a lock.
    check(unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) })?;
    if geteuid().is_root() || getuid().is_root() {
        // Leaving uid 0 clears the permitted and effective sets too.
        let (uid, gid) = (Uid::from_raw(NOBODY), Gid::from_raw(NOBODY));
        setgroups(&[])?;
        setresgid(gid, gid, gid)?;
        setresuid(uid, uid, uid)?;
    }
    // With no ambient set, a uid other than 0 and no_new_privs (file
    // capabilities ignored), exec leaves the worker no capability: it
    // checks that itself (`verify_unprivileged`). No capset here: a
    // systemd unit's ~@privileged filter refuses it.
    Ok(prctl::set_no_new_privs()?)
}

/// Lowers a limit (never above the current hard limit: raising it would need
/// CAP_SYS_RESOURCE).
fn limit(resource: Resource, value: u64) -> io::Result<()> {
    let (_, hard) = getrlimit(resource)?;
    let value = value.min(hard);
    Ok(setrlimit(resource, value, value)?)
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The worker checks, once running, that it holds no capability at all:
/// a sandbox that silently failed must not parse hostile files.
pub fn verify_unprivileged() -> Result<(), String> {
    let status =
        std::fs::read_to_string("/proc/self/status").map_err(|err| format!("/proc/self/status: {err}"))?;
    for field in ["CapEff:", "CapPrm:", "CapAmb:"] {
        let value = status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .map(str::trim)
            .ok_or_else(|| format!("{field} missing from /proc/self/status"))?;
        if u64::from_str_radix(value, 16) != Ok(0) {
            return Err(format!("the worker still has capabilities ({field} {value})"));
        }
    }
    let no_new_privs = status
        .lines()
        .find_map(|line| line.strip_prefix("NoNewPrivs:"))
        .map(str::trim);
    if no_new_privs != Some("1") {
        return Err("no_new_privs is not set".into());
    }
    Ok(())
}
