//! Kernel addresses to function names: asked of the kernel (the sampler's
//! `kernel_names` program, see [`KernelNamer`]), or read from
//! /proc/kallsyms (blazesym) where that program cannot run or once it
//! failed. Either way a name only: no inlining, no lines.

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer as Blaze,
    source::{Kernel, Source},
};

use super::resolver::ResolverStats;
use crate::{collect::KernelNamer, error::Chain};

pub struct KernelSymbols {
    /// None where the kernel cannot name addresses for us (or failed to).
    namer: Option<KernelNamer>,
    /// Reads kallsyms at its first use only: never, while `namer` works.
    kallsyms: Blaze,
}

impl KernelSymbols {
    pub fn new(namer: Option<KernelNamer>) -> Self {
        Self {
            namer,
            // We demangle ourselves so pprof can keep both names.
            kallsyms: Blaze::builder().enable_demangling(false).build(),
        }
    }

    /// The name of each address, in order (None: no symbol covers it);
    /// None when no source could be read. Counted in `stats`.
    pub fn names(&mut self, addresses: &[u64], stats: &mut ResolverStats) -> Option<Vec<Option<String>>> {
        let names = match self.named_by_kernel(addresses, stats) {
            Some(names) => names,
            None => self.named_by_kallsyms(addresses, stats)?,
        };
        stats.unresolved += names.iter().filter(|name| name.is_none()).count() as u64;
        Some(names)
    }

    fn named_by_kernel(
        &mut self,
        addresses: &[u64],
        stats: &mut ResolverStats,
    ) -> Option<Vec<Option<String>>> {
        match self.namer.as_mut()?.names(addresses) {
            Ok(names) => {
                stats.kernel_named += names.len() as u64;
                Some(names)
            }
            Err(err) => {
                // Not retried: a program that failed once is not trusted again.
                stats.source_errors += 1;
                tracing::warn!(
                    "kernel frames named from /proc/kallsyms from now on: {}",
                    Chain(&err)
                );
                self.namer = None;
                None
            }
        }
    }

    fn named_by_kallsyms(
        &mut self,
        addresses: &[u64],
        stats: &mut ResolverStats,
    ) -> Option<Vec<Option<String>>> {
        let source = Source::Kernel(Kernel {
            // Debug info for the kernel is rarely installed and slow to parse.
            debug_syms: false,
            ..Kernel::default()
        });
        let results = match self.kallsyms.symbolize(&source, Input::AbsAddr(addresses)) {
            Ok(results) => results,
            Err(err) => {
                stats.source_errors += 1;
                tracing::debug!("kernel symbolization failed: {}", Chain(&err));
                return None;
            }
        };
        stats.kallsyms_named += results.len() as u64;
        Some(
            results
                .iter()
                .map(|result| match result {
                    Symbolized::Sym(sym) => Some(sym.name.to_string()),
                    Symbolized::Unknown(_) => None,
                })
                .collect(),
        )
    }
}
