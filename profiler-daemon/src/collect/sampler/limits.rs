//! The process limits loading the sampler needs lifted.

use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit, setrlimit};

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK: lift it so they
/// load. Every mapped file of every sampled process is held open: lift the
/// descriptor limit to its hard maximum.
pub(super) fn raise_limits() {
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
    {
        // Best effort: the daemon warns about a low limit itself.
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
    if let Err(err) = setrlimit(Resource::RLIMIT_MEMLOCK, RLIM_INFINITY, RLIM_INFINITY) {
        tracing::debug!("could not raise RLIMIT_MEMLOCK: {}", std::io::Error::from(err));
    }
}
