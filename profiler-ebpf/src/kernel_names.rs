//! Names kernel addresses for the daemon's symbolizer with the kernel's own
//! symbol lookup (`%pB` of `bpf_snprintf`): a raw tracepoint program that is
//! never attached, only run by the daemon through `BPF_PROG_TEST_RUN`, with
//! the addresses as its arguments (see `profiler_common::KernelNames`).

use aya_ebpf::{
    helpers::generated::bpf_snprintf, macros::map, macros::raw_tracepoint, maps::Array,
    programs::RawTracePointContext,
};
use profiler_common::{KERNEL_NAME_BYTES, KERNEL_NAMES_BATCH, KernelNames};

#[map]
static KERNEL_NAMES: Array<KernelNames> = Array::with_max_entries(1, 0);

/// `%pB` prints the symbol of `address - 1` (a return address's call), as
/// `name+offset/size [module]`. A static, so it lives in the frozen
/// `.rodata` map, where `bpf_snprintf` requires its format to be.
static FORMAT: [u8; 4] = *b"%pB\0";

/// Names its arguments (0: no address) into `KERNEL_NAMES`. Only the daemon
/// runs it, from one thread, and reads the map after each run.
#[raw_tracepoint]
pub fn kernel_names(ctx: RawTracePointContext) -> i32 {
    let Some(out) = KERNEL_NAMES.get_ptr_mut(0) else {
        return 1;
    };
    for slot in 0..KERNEL_NAMES_BATCH {
        let address: u64 = ctx.arg(slot);
        // SAFETY: `out` is the map's one value, valid for the run; the
        // daemon reads it only once the run is over.
        let name = unsafe { &mut (*out).names[slot] };
        // A failed print leaves the buffer as it was: empty it first, so no
        // name of a previous run is taken for this address's.
        name[0] = 0;
        if address == 0 {
            continue;
        }
        // The symbolizer names the address itself (a sampled instruction or
        // a return address alike): `%pB` subtracts one.
        let mut data = [address.wrapping_add(1)];
        // SAFETY: the output is this slot's bytes with their exact size, the
        // format a NUL-terminated static, the data one u64 as `%pB` reads.
        unsafe {
            bpf_snprintf(
                name.as_mut_ptr().cast(),
                KERNEL_NAME_BYTES as u32,
                FORMAT.as_ptr().cast(),
                data.as_mut_ptr(),
                core::mem::size_of_val(&data) as u32,
            );
        }
    }
    0
}
