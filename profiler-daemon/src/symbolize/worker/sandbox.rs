//! What the worker process may do: nothing the daemon's privileges allow.
//! Set between fork and exec, so it holds from the worker's first instruction.

use std::io;

/// The unprivileged identity a worker started by root takes.
const NOBODY: libc::uid_t = 65534;
/// Descriptors the worker may hold: its cached files and what blazesym opens.
const WORKER_MAX_FILES: libc::rlim_t = 1024;

/// Runs in the child between fork and exec: only async-signal-safe calls
/// (setrlimit, prctl and raw syscalls, no allocation).
///
/// # Safety
/// Must only be called in a freshly forked child before exec.
pub unsafe fn confine(memory_bytes: u64) -> io::Result<()> {
    // SAFETY: (all calls below) plain syscalls on this process with valid
    // arguments; none allocates or takes a lock.
    unsafe {
        check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0))?;
        // Ctrl-C at `profilerd record` reaches the whole process group:
        // the daemon stops the worker itself.
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        limit(libc::RLIMIT_DATA, memory_bytes)?;
        limit(libc::RLIMIT_CORE, 0)?;
        limit(libc::RLIMIT_NOFILE, WORKER_MAX_FILES)?;
        // Ambient capabilities (a systemd unit's AmbientCapabilities) would
        // survive exec: clear them first.
        check(libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        ))?;
        if libc::geteuid() == 0 || libc::getuid() == 0 {
            // Leaving uid 0 clears the permitted and effective sets too.
            check(libc::setgroups(0, std::ptr::null()))?;
            check(libc::setresgid(NOBODY, NOBODY, NOBODY))?;
            check(libc::setresuid(NOBODY, NOBODY, NOBODY))?;
        }
        // With no ambient set, a uid other than 0 and no_new_privs (file
        // capabilities ignored), exec leaves the worker no capability: it
        // checks that itself (`verify_unprivileged`). No capset here: a
        // systemd unit's ~@privileged filter refuses it.
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
    }
}

/// Lowers a limit (never above the current hard limit: raising it would need
/// CAP_SYS_RESOURCE).
unsafe fn limit(resource: libc::__rlimit_resource_t, value: u64) -> io::Result<()> {
    let mut current = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit out-parameter for this process.
    check(unsafe { libc::getrlimit(resource, &mut current) })?;
    let value = value.min(current.rlim_max);
    let limit = libc::rlimit {
        rlim_cur: value,
        rlim_max: value,
    };
    // SAFETY: a valid rlimit for this process.
    check(unsafe { libc::setrlimit(resource, &limit) })
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
