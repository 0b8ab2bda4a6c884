//! Which switches the off-CPU program records: one in N
//! (`--off-cpu-sample-every`), halved while the CPU switches faster than the
//! budget (`--off-cpu-budget`), drawn without a helper call. What the
//! daemon sets: OFF_CPU_RECORD_BELOW (2^32 / N) and OFF_CPU_BUDGET_NS (the
//! least time OFF_CPU_RATE_SWITCHES switches may take within the budget).

use aya_ebpf::{
    Global,
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns},
    macros::map,
    maps::PerCpuArray,
};
use profiler_common::globals::OFF_CPU_RATE_SWITCHES;

/// Each CPU's draw: its generator and the rate its switches come at.
#[map]
static OFF_CPU_DRAW: PerCpuArray<CpuDraw> = PerCpuArray::with_max_entries(1, 0);

/// Halvings stop before a weight above this, 2^20 (`every` is at most 10^6,
/// below it): a wait of up to 2^44 ns, 4.9 hours, times its weight still
/// fits the counts' u64.
const MAX_WEIGHT: u64 = 1 << 20;

#[derive(Clone, Copy)]
#[repr(C)]
struct CpuDraw {
    /// xorshift64 state for [`draw`] (0: not seeded yet).
    rng: u64,
    /// Switches seen on this CPU (with a budget only).
    switches: u64,
    /// When the last RATE_SWITCHES of them were counted.
    measured_ns: u64,
    /// The odds of one in `every` are halved this many times: the budget
    /// over the rate of the last RATE_SWITCHES switches.
    halvings: u64,
}

/// A switch is recorded when a random u32 is below this: 2^32 / N, so one
/// in N (2^32: every switch). A compare, where `% N` is a 64-bit division.
#[unsafe(no_mangle)]
static OFF_CPU_RECORD_BELOW: Global<u64> = Global::new(1 << 32);
/// The budget (recorded switches per CPU per second, at most: the odds
/// halve, so between half that and that) as the least time
/// OFF_CPU_RATE_SWITCHES switches may take at the odds of one in N
/// (`globals::OFF_CPU_BUDGET_NS`); 0: no budget.
#[unsafe(no_mangle)]
pub(super) static OFF_CPU_BUDGET_NS: Global<u64> = Global::new(0);

/// Whether this switch is recorded, and what its wait then weighs: one in
/// `every`, halved as many times as this CPU's switch rate needs to stay
/// within the budget (`budget_ns`, OFF_CPU_BUDGET_NS).
#[inline(always)]
pub(super) fn drawn(every: u64, budget_ns: u64) -> Option<u64> {
    let state = OFF_CPU_DRAW.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot; the program runs with interrupts off inside
    // the scheduler, so nothing else on this CPU uses it meanwhile.
    let state = unsafe { &mut *state };
    if budget_ns != 0 {
        state.switches += 1;
        if state.switches & (OFF_CPU_RATE_SWITCHES - 1) == 0 {
            retune(state, every, budget_ns);
        }
    }
    let halvings = state.halvings;
    let below = OFF_CPU_RECORD_BELOW.load() >> halvings;
    if below < 1 << 32 && u64::from(draw(state)) >= below {
        return None;
    }
    Some(every << halvings)
}

/// The halvings for the rate of this CPU's last OFF_CPU_RATE_SWITCHES
/// switches: the fewest that keep them within the budget, i.e. make them
/// last at least `budget_ns` once divided by 2^halvings. Unbiased whatever
/// they are: a wait weighs one over the odds it was drawn with, which
/// depend on the switches before it, not on it.
#[inline(always)]
fn retune(state: &mut CpuDraw, every: u64, budget_ns: u64) {
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let mut elapsed = now.saturating_sub(state.measured_ns);
    state.measured_ns = now;
    let mut halvings = 0;
    let mut weight = every;
    // At most log2(MAX_WEIGHT) rounds.
    for _ in 0..20 {
        if elapsed >= budget_ns || weight > MAX_WEIGHT / 2 {
            break;
        }
        // No overflow: `elapsed` < `budget_ns` (at most 2.56e11, under
        // 2^38) before it doubles.
        elapsed <<= 1;
        weight <<= 1;
        halvings += 1;
    }
    state.halvings = halvings;
}

/// A uniform random u32 from this CPU's xorshift64 generator (Marsaglia's
/// 13, 7, 17 triple: period 2^64 - 1 over the nonzero states; a draw keeps
/// the high half). `bpf_get_prandom_u32` does the same job, but its call
/// alone cost 22 ns a switch here (`bpf_stats`, a program of just that
/// call against an empty one), two thirds of an unrecorded switch; the
/// per-CPU array's lookup is inlined by the verifier. Whether a switch is
/// recorded stays independent of what the thread does: nothing the
/// workload sees or sets feeds the state, only how many switches drew.
#[inline(always)]
fn draw(state: &mut CpuDraw) -> u32 {
    let mut x = state.rng;
    if x == 0 {
        // Seeded once per CPU from the kernel's generator; never 0 again.
        // SAFETY: helpers without arguments.
        x = unsafe { (u64::from(bpf_get_prandom_u32()) << 32) | u64::from(bpf_get_prandom_u32()) | 1 };
    }
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    state.rng = x;
    (x >> 32) as u32
}
