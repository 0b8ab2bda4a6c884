//! Types shared by the BPF sampler and the daemon.
//!
//! Everything here crosses the kernel boundary through BPF maps, so every type is
//! `#[repr(C)]`, has no implicit padding (asserted beside each type), and its layout is the
//! contract between `profiler-ebpf` and `profiler-daemon`.
#![no_std]

pub mod python;

/// Length of a task's `comm` as the kernel stores it (TASK_COMM_LEN).
pub const COMM_LEN: usize = 16;

/// Frames kept per stack; the kernel's own limit (PERF_MAX_STACK_DEPTH).
pub const MAX_STACK_DEPTH: usize = 127;

/// Frames the sampler's own walk keeps for a user stack: twice the kernel's
/// limit, so that 128 Python frames (one slot each on 3.11+) fit with the
/// native frames around them. The frames past [`MAX_STACK_DEPTH`] are stored
/// apart, under the stack's key in the unwound-tails maps; most stacks are
/// not that deep, so those maps are small.
pub const MAX_USER_DEPTH: usize = 2 * MAX_STACK_DEPTH;

mod alloc;
mod counter;
mod kernel_names;
mod names;
mod sample;
mod unwind;

pub use alloc::*;
pub use counter::Counter;
pub use kernel_names::*;
pub use names::{globals, maps, programs};
pub use sample::*;
pub use unwind::*;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: repr(C), only integer fields, no padding (asserted in their modules).
    unsafe impl aya::Pod for super::SampleKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ProcessEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SpilledSample {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SampleValue {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::UnwindRowChunk {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::UnwindTableRange {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::UnwindProcess {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::UnwoundStack {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Wait {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ThreadExit {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::AllocThread {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::AllocTraced {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::AllocBlockKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::AllocBlock {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::AllocStackKey {}
    // SAFETY: repr(C), twelve i64s then bytes (asserted size, 8-aligned):
    // no padding, any bit pattern valid.
    unsafe impl aya::Pod for super::KernelNames {}
}
