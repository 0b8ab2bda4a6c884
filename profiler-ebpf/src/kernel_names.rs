//! Names kernel addresses for the daemon's symbolizer with the kernel's own
//! symbol lookup (`%ps` of `bpf_snprintf`): a raw tracepoint program that is
//! never attached, only run by the daemon through `BPF_PROG_TEST_RUN`, with
//! the addresses as its arguments (see `profiler_common::KernelNames`).

use aya_ebpf::{
    EbpfContext, helpers::generated::bpf_snprintf, macros::map, macros::raw_tracepoint, maps::Array,
    programs::RawTracePointContext,
};
use profiler_common::{KERNEL_NAME_BYTES, KERNEL_NAMES_BATCH, KernelNames};

#[map]
static KERNEL_NAMES: Array<KernelNames> = Array::with_max_entries(1, 0);

/// `%ps` prints the symbol covering an address, as `name [module]`: the
/// address itself is looked up (the symbolizer already moved a return
/// address back into its call). A static, so it lives in the frozen
/// `.rodata` map, where `bpf_snprintf` requires its format to be.
static FORMAT: [u8; 4] = *b"%ps\0";

/// Names its arguments (0: no address) into `KERNEL_NAMES`. Only the daemon
/// runs it, from one thread, and reads the map after each run.
#[raw_tracepoint]
pub fn kernel_names(ctx: RawTracePointContext) -> i32 {
    let Some(out) = KERNEL_NAMES.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: a raw tracepoint's context is its u64 arguments, and the
    // daemon's test run passes all 12 (the kernel refuses a run whose
    // context is shorter than the offsets the program reads). Read whole,
    // at fixed offsets: the verifier refuses a context read at a variable one.
    let addresses = unsafe { core::ptr::read(ctx.as_ptr() as *const [u64; KERNEL_NAMES_BATCH]) };
    for (slot, &address) in addresses.iter().enumerate() {
        // SAFETY: `out` is the map's one value, valid for the run; the
        // daemon reads it only once the run is over.
        let (name, printed) = unsafe { (&mut (*out).names[slot], &mut (*out).printed[slot]) };
        // A failed print leaves the buffer as it was: empty it first, so no
        // name of a previous run is taken for this address's.
        name[0] = 0;
        *printed = 0;
        if address == 0 {
            continue;
        }
        let mut data = [address];
        // SAFETY: the output is this slot's bytes with their exact size, the
        // format a NUL-terminated static, the data one u64 as `%ps` reads.
        *printed = unsafe {
            bpf_snprintf(
                name.as_mut_ptr().cast(),
                KERNEL_NAME_BYTES as u32,
                FORMAT.as_ptr().cast(),
                data.as_mut_ptr(),
                core::mem::size_of_val(&data) as u32,
            )
        };
    }
    0
}
