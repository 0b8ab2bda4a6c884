//! The clock the BPF side stamps with.

use nix::time::{ClockId, clock_gettime};

/// CLOCK_MONOTONIC now, the clock bpf_ktime_get_ns() and task start times use.
pub fn monotonic_now_ns() -> u64 {
    // CLOCK_MONOTONIC cannot fail; were it to, 0 (as before).
    clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, |now| {
        (now.tv_sec() as u64) * 1_000_000_000 + now.tv_nsec() as u64
    })
}
