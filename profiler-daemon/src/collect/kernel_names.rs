//! Kernel addresses named by the kernel: the sampler's `kernel_names`
//! program, run on demand (see `profiler_common::KernelNames`).
//!
//! The symbolizer used to read /proc/kallsyms whole: the kernel formats
//! every one of its symbols (122k here) for that, which cost the daemon
//! tens of milliseconds of CPU at its first kernel frame and kept a table of
//! megabytes. Asking for the few hundred addresses a profile has costs
//! microseconds each, follows modules and BPF programs as they come and go,
//! and keeps nothing. Old kernels without the helper keep the kallsyms path.

use std::{
    io,
    os::fd::{AsFd, AsRawFd, OwnedFd},
};

use aya::maps::{Array, MapData};
use aya_obj::generated::{bpf_attr, bpf_cmd};
use profiler_common::{KERNEL_NAMES_BATCH, KernelNames};

#[derive(Debug, thiserror::Error)]
pub enum KernelNamesError {
    #[error("running the kernel_names program (BPF_PROG_TEST_RUN)")]
    Run(#[source] io::Error),
    #[error("the kernel_names program failed ({0})")]
    Failed(u32),
    #[error("reading the names it printed")]
    Read(#[source] aya::maps::MapError),
}

/// The loaded program and its output map.
pub struct KernelNamer {
    program: OwnedFd,
    names: Array<MapData, KernelNames>,
}

impl KernelNamer {
    pub(super) fn new(program: OwnedFd, names: Array<MapData, KernelNames>) -> Self {
        Self { program, names }
    }

    /// The kernel's name of each address (None: no symbol covers it), in
    /// order. Module code is named without its module, as kallsyms' lines.
    pub fn names(&mut self, addresses: &[u64]) -> Result<Vec<Option<String>>, KernelNamesError> {
        let mut out = Vec::with_capacity(addresses.len());
        for chunk in addresses.chunks(KERNEL_NAMES_BATCH) {
            let mut args = [0u64; KERNEL_NAMES_BATCH];
            args[..chunk.len()].copy_from_slice(chunk);
            let retval = self.run(&args).map_err(KernelNamesError::Run)?;
            if retval != 0 {
                return Err(KernelNamesError::Failed(retval));
            }
            let printed = self.names.get(&0, 0).map_err(KernelNamesError::Read)?;
            out.extend(
                printed.names[..chunk.len()]
                    .iter()
                    .map(|bytes| function_name(bytes).map(str::to_owned)),
            );
        }
        Ok(out)
    }

    /// One run with `args` as the tracepoint's arguments; the program's
    /// return value.
    fn run(&self, args: &[u64; KERNEL_NAMES_BATCH]) -> io::Result<u32> {
        // SAFETY: all-zero is a valid bpf_attr (a union of integer structs),
        // and the one the kernel expects in every field not set below.
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        // The union's `test` member: the one BPF_PROG_TEST_RUN reads.
        attr.test.prog_fd = self.program.as_fd().as_raw_fd() as u32;
        attr.test.ctx_in = args.as_ptr() as u64;
        attr.test.ctx_size_in = std::mem::size_of_val(args) as u32;
        // SAFETY: `attr` is a valid bpf_attr of the size passed; `args`,
        // which it points to, outlives the call; the kernel writes only
        // into `attr` (the return value).
        let result = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                bpf_cmd::BPF_PROG_TEST_RUN as libc::c_long,
                &mut attr as *mut bpf_attr,
                std::mem::size_of::<bpf_attr>(),
            )
        };
        if result < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel filled the `test` member's retval.
        Ok(unsafe { attr.test.retval })
    }
}

/// The function of one `%pB` print, `name+0x1c/0x80 [module]`: the name
/// alone. None for an address no symbol covers (printed as `0x...`), or an
/// empty print (the helper failed).
fn function_name(printed: &[u8]) -> Option<&str> {
    let end = printed
        .iter()
        .position(|&byte| byte == 0)
        .unwrap_or(printed.len());
    let text = std::str::from_utf8(&printed[..end]).ok()?;
    if text.is_empty() || text.starts_with("0x") {
        return None;
    }
    // Kernel symbol names have neither spaces nor '+'; a name cut at the
    // buffer's end has neither suffix.
    let text = text.split_once(" [").map_or(text, |(name, _)| name);
    let name = text.rsplit_once('+').map_or(text, |(name, _)| name);
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::function_name;

    fn printed(text: &str) -> Vec<u8> {
        let mut bytes = text.as_bytes().to_vec();
        bytes.resize(256, 0);
        bytes
    }

    #[test]
    fn a_print_gives_the_function_without_offset_or_module() {
        assert_eq!(
            function_name(&printed("do_syscall_64+0x8a/0x190")),
            Some("do_syscall_64")
        );
        assert_eq!(
            function_name(&printed("nft_do_chain+0x9c/0x4b0 [nf_tables]")),
            Some("nft_do_chain")
        );
        assert_eq!(
            function_name(&printed("bpf_prog_6deef7357e7b4530_sample+0x1f/0x3d0")),
            Some("bpf_prog_6deef7357e7b4530_sample")
        );
        assert_eq!(
            function_name(&printed("__memcpy.cold+0x0/0x12")),
            Some("__memcpy.cold")
        );
    }

    #[test]
    fn no_symbol_or_no_print_is_no_name() {
        assert_eq!(function_name(&printed("0xffffffffc0001234")), None);
        assert_eq!(function_name(&printed("")), None);
        assert_eq!(function_name(&printed("+0x0/0x10")), None);
        assert_eq!(function_name(&[0xff, 0xfe, 0]), None);
    }

    #[test]
    fn a_name_cut_at_the_buffer_end_is_kept_as_far_as_it_goes() {
        let long = "_RNvMs_NtCs1234_6kernel4sync".repeat(10);
        let bytes = long.as_bytes()[..256].to_vec();
        assert_eq!(function_name(&bytes), Some(&long[..256]));
    }
}
