//! Kernel addresses named by the kernel itself: the daemon runs the
//! `kernel_names` program (a raw tracepoint never attached, run through
//! `BPF_PROG_TEST_RUN`) with up to [`KERNEL_NAMES_BATCH`] addresses as its
//! arguments, and reads their names back from the `KERNEL_NAMES` map.
//!
//! Why: naming a few hundred addresses this way costs about a millisecond,
//! where reading /proc/kallsyms (every symbol of the kernel, formatted by
//! the kernel) cost the daemon about 50 ms of CPU and 5 MB of memory.

/// Addresses named per run: a raw tracepoint's test run passes at most 12
/// arguments.
pub const KERNEL_NAMES_BATCH: usize = 12;

/// Bytes kept of one name, its NUL included. The kernel allows 512
/// (KSYM_NAME_LEN), but its C names are far shorter; a longer one (some
/// Rust-for-Linux names) is kept cut, and still tells the function.
pub const KERNEL_NAME_BYTES: usize = 256;

/// One run's names, as the kernel's `%pB` prints them: `name+off/size`,
/// then ` [module]` for a module's code; `0x...` for an address that is no
/// symbol's; empty when printing failed. Slot `i` is argument `i`'s.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelNames {
    pub names: [[u8; KERNEL_NAME_BYTES]; KERNEL_NAMES_BATCH],
}

const _: () = assert!(core::mem::size_of::<KernelNames>() == KERNEL_NAME_BYTES * KERNEL_NAMES_BATCH);
