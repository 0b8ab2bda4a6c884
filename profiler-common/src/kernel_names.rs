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

/// Bytes of one print, its NUL included: the kernel's longest name
/// (KSYM_NAME_LEN); a module's name after it may be cut.
pub const KERNEL_NAME_BYTES: usize = 512;

/// One run's names, as the kernel's `%ps` prints them: the name, then
/// ` [module]` for a module's code; `0x...` for an address that is no
/// symbol's. Slot `i` is argument `i`'s.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelNames {
    /// `bpf_snprintf`'s result for each slot: the bytes printed with the
    /// NUL, or a negative errno (the slot's name is then empty); 0 for an
    /// argument 0 (no address).
    pub printed: [i64; KERNEL_NAMES_BATCH],
    pub names: [[u8; KERNEL_NAME_BYTES]; KERNEL_NAMES_BATCH],
}

const _: () = assert!(core::mem::size_of::<KernelNames>() == (8 + KERNEL_NAME_BYTES) * KERNEL_NAMES_BATCH);
