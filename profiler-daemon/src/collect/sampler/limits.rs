//! The process limits loading the sampler needs lifted.

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK: lift it so they
/// load. Every mapped file of every sampled process is held open: lift the
/// descriptor limit to its hard maximum.
pub(super) fn raise_limits() {
    let mut files = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write one valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut files) == 0 && files.rlim_cur < files.rlim_max {
            files.rlim_cur = files.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &files);
        }
    }
    let limit = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads a valid, initialised struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) } != 0 {
        tracing::debug!(
            "could not raise RLIMIT_MEMLOCK: {}",
            std::io::Error::last_os_error()
        );
    }
}
