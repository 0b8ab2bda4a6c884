//! Kernel addresses to function names: asked of the kernel (the sampler's
//! `kernel_names` program, see [`KernelNamer`]), or read from
//! /proc/kallsyms (blazesym) where that program cannot run or keeps
//! failing. Either way a name only: no inlining, no lines.

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer as Blaze,
    source::{Kernel, Source},
};

use crate::{
    collect::{KernelLookup, KernelNamer},
    error::Chain,
};

/// Runs of the naming program that may fail in a row before it is given
/// up for kallsyms: one failure may be passing (memory), three are not.
const MAX_NAMER_FAILURES: u32 = 3;

/// What naming kernel addresses did (cumulative).
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelStats {
    /// Addresses looked up by the kernel's lookup / in kallsyms.
    pub by_kernel: u64,
    pub by_kallsyms: u64,
    /// Runs of the naming program that failed, and kallsyms reads.
    pub errors: u64,
}

pub struct KernelSymbols {
    pub stats: KernelStats,
    /// None where the kernel cannot name addresses for us (or kept failing).
    namer: Option<KernelNamer>,
    namer_failures: u32,
    /// Reads kallsyms at its first use only: never, while `namer` works.
    kallsyms: Blaze,
}

impl KernelSymbols {
    pub fn new(namer: Option<KernelNamer>) -> Self {
        Self {
            stats: KernelStats::default(),
            namer,
            namer_failures: 0,
            // We demangle ourselves so pprof can keep both names.
            kallsyms: Blaze::builder().enable_demangling(false).build(),
        }
    }

    /// What is known of each address, in order: `Failed` for every address
    /// of a run of the naming program that failed (they are asked again),
    /// `NoSymbol` for all when kallsyms cannot be read.
    pub fn names(&mut self, addresses: &[u64]) -> Vec<KernelLookup> {
        if let Some(namer) = &mut self.namer {
            return match namer.names(addresses) {
                Ok(names) => {
                    self.namer_failures = 0;
                    self.stats.by_kernel += names.len() as u64;
                    names
                }
                Err(err) => {
                    self.stats.errors += 1;
                    self.namer_failures += 1;
                    if self.namer_failures >= MAX_NAMER_FAILURES {
                        tracing::warn!(
                            "kernel frames named from /proc/kallsyms from now on: {}",
                            Chain(&err)
                        );
                        self.namer = None;
                    } else {
                        tracing::debug!("naming kernel addresses failed: {}", Chain(&err));
                    }
                    vec![KernelLookup::Failed; addresses.len()]
                }
            };
        }
        self.named_by_kallsyms(addresses)
    }

    fn named_by_kallsyms(&mut self, addresses: &[u64]) -> Vec<KernelLookup> {
        let source = Source::Kernel(Kernel {
            // Debug info for the kernel is rarely installed and slow to parse.
            debug_syms: false,
            ..Kernel::default()
        });
        match self.kallsyms.symbolize(&source, Input::AbsAddr(addresses)) {
            Ok(results) => {
                self.stats.by_kallsyms += results.len() as u64;
                results
                    .iter()
                    .map(|result| match result {
                        Symbolized::Sym(sym) => KernelLookup::Named(sym.name.to_string()),
                        Symbolized::Unknown(_) => KernelLookup::NoSymbol,
                    })
                    .collect()
            }
            Err(err) => {
                // Read whole or not at all (unreadable, as under the unit):
                // not worth asking again for the same addresses.
                self.stats.errors += 1;
                tracing::debug!("kernel symbolization failed: {}", Chain(&err));
                vec![KernelLookup::NoSymbol; addresses.len()]
            }
        }
    }
}
