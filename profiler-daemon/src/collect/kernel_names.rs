//! Kernel addresses named by the kernel: the sampler's `kernel_names`
//! program, run on demand (see `profiler_common::KernelNames`).
//!
//! The symbolizer used to read /proc/kallsyms whole: the kernel formats
//! every one of its symbols (122k here) for that, which cost the daemon
//! tens of milliseconds of CPU at its first kernel frame and kept a table of
//! megabytes. Asking for the few hundred addresses a profile has costs
//! microseconds each (module code and BPF programs included, as they are
//! when asked) and keeps nothing. Old kernels without the helper keep the
//! kallsyms path.

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
    #[error("the kernel_names program printed no name of {0} addresses (bpf_snprintf: {1})")]
    Print(usize, i64),
    #[error("reading the names it printed")]
    Read(#[source] aya::maps::MapError),
}

/// What the kernel said of one address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelLookup {
    Named(String),
    /// No symbol covers it.
    NoSymbol,
    /// The print failed: worth asking again later.
    Failed,
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

    /// What the kernel says of each address, in order. Module code is
    /// named without its module, as in kallsyms' lines.
    pub fn names(&mut self, addresses: &[u64]) -> Result<Vec<KernelLookup>, KernelNamesError> {
        let mut out = Vec::with_capacity(addresses.len());
        for chunk in addresses.chunks(KERNEL_NAMES_BATCH) {
            let mut args = [0u64; KERNEL_NAMES_BATCH];
            args[..chunk.len()].copy_from_slice(chunk);
            let retval = self.run(&args).map_err(KernelNamesError::Run)?;
            if retval != 0 {
                return Err(KernelNamesError::Failed(retval));
            }
            let printed = self.names.get(&0, 0).map_err(KernelNamesError::Read)?;
            // Every print of a run failing says more of the program than of
            // the addresses: a run failure (the namer is given up after a few).
            // (`chunks` gives no empty chunk.)
            let results = &printed.printed[..chunk.len()];
            if results.iter().all(|&result| result < 0) {
                return Err(KernelNamesError::Print(chunk.len(), results[0]));
            }
            out.extend(
                printed.names[..chunk.len()]
                    .iter()
                    .zip(printed.printed)
                    .map(|(bytes, result)| lookup(bytes, result)),
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

/// One slot of a run: `printed` is `bpf_snprintf`'s result, `bytes` the
/// print, `name [module]`, or `0x...` for an address no symbol covers.
fn lookup(bytes: &[u8], printed: i64) -> KernelLookup {
    if printed <= 0 {
        return KernelLookup::Failed;
    }
    let end = bytes.iter().position(|&byte| byte == 0).unwrap_or(bytes.len());
    let text = String::from_utf8_lossy(&bytes[..end]);
    // Kernel symbol names have no spaces: the module's name, even cut at
    // the buffer's end, goes whole.
    match text.split(' ').next().unwrap_or_default() {
        "" => KernelLookup::NoSymbol,
        unknown if unknown.starts_with("0x") => KernelLookup::NoSymbol,
        name => KernelLookup::Named(name.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use profiler_common::KERNEL_NAME_BYTES;

    use super::{KernelLookup, lookup};

    fn named(text: &str) -> KernelLookup {
        let mut bytes = text.as_bytes().to_vec();
        bytes.resize(KERNEL_NAME_BYTES, 0);
        lookup(&bytes, text.len() as i64 + 1)
    }

    #[test]
    fn a_print_gives_the_function_without_its_module() {
        let name = |text: &str| KernelLookup::Named(text.to_owned());
        assert_eq!(named("do_syscall_64"), name("do_syscall_64"));
        assert_eq!(named("nft_do_chain [nf_tables]"), name("nft_do_chain"));
        assert_eq!(named("nft_do_chain [nf_tab"), name("nft_do_chain"));
        assert_eq!(named("nft_do_chain "), name("nft_do_chain"));
        assert_eq!(
            named("bpf_prog_6deef7357e7b4530_sample"),
            name("bpf_prog_6deef7357e7b4530_sample")
        );
        assert_eq!(named("__memcpy.cold"), name("__memcpy.cold"));
    }

    #[test]
    fn an_address_no_symbol_covers_is_no_symbol() {
        assert_eq!(named("0xffffffffc0001234"), KernelLookup::NoSymbol);
    }

    #[test]
    fn a_failed_print_is_asked_again_an_empty_one_is_no_symbol() {
        assert_eq!(lookup(&[0; 16], -16), KernelLookup::Failed);
        assert_eq!(lookup(&[0; 16], 0), KernelLookup::Failed);
        assert_eq!(named(""), KernelLookup::NoSymbol);
        assert_eq!(
            lookup(&[b'a', 0xff, 0], 3),
            KernelLookup::Named("a\u{fffd}".to_owned())
        );
    }
}
