//! profilerd: a system-wide continuous CPU profiler.
//!
//! The data flows through four stages, one module each:
//!
//! 1. [`collect`]: the BPF sampler counts (thread, stack) pairs in-kernel; the
//!    daemon drains them as [`collect::RawBatch`]es of raw addresses, and
//!    snapshots every new process's mappings while it still runs.
//! 2. [`symbolize`]: addresses become functions ([`symbolize::SymbolizedStack`]).
//! 3. [`store`]: a bounded store of one-second buckets answers queries with a
//!    [`profile::Profile`].
//! 4. Output: [`profile`] formats (folded stacks, pprof), written by
//!    [`record`] or served over HTTP by [`serve`] in the [`daemon`].
//!
//! Every sample carries its [`kind`] (CPU, or an off-CPU wait) from the BPF
//! key to the encoders; a profile type selects and names them.
//!
//! [`push`] sends windows of the store to a fleet's profile store
//! (Pyroscope, Parca). [`pipeline`] wires the stages together; [`supervise`] makes the end of
//! any of them the end of the daemon. Each stage registers its own metrics
//! into one [`telemetry::Telemetry`] as it is built; `/metrics` encodes it.
//! `docs/architecture.md` draws it.

pub mod cgroup;
pub mod cli;
pub mod collect;
pub mod config;
pub mod daemon;
pub mod entry;
pub mod error;
pub mod filter;
pub mod kind;
pub mod own_pages;
pub mod pipeline;
pub mod procfs;
pub mod profile;
pub mod push;
pub mod python;
pub mod record;
pub mod serve;
pub mod shares;
pub mod stop;
pub mod store;
pub mod supervise;
pub mod symbolize;
pub mod telemetry;

/// CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID), in ns: what a
/// piece of work costs, whatever else the machine is doing.
pub fn thread_cpu_ns() -> u64 {
    let Ok(now) = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID) else {
        return 0;
    };
    u64::try_from(now.tv_sec()).unwrap_or(0) * 1_000_000_000 + u64::try_from(now.tv_nsec()).unwrap_or(0)
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}
