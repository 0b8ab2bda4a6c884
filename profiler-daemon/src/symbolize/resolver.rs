//! blazesym behind long-lived caches: user frames by (file, file offset), so a
//! library's symbols are shared by every process that maps it and survive the
//! process; kernel frames by address, from kallsyms.

use std::{collections::HashMap, sync::Arc};

use crate::collect::{FileKey, MappedFile};

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer as Blaze,
    source::{Elf, Kernel, Source},
};

use super::{
    demangle::demangle,
    stack::{Function, Line},
};

/// Caches are dropped wholesale past these sizes: re-symbolizing is cheap,
/// unbounded growth over months is not.
const MAX_USER_ENTRIES: usize = 1 << 20;
const MAX_KERNEL_ENTRIES: usize = 1 << 18;
/// Batches in a row a file may fail to be read before its addresses are
/// cached as unresolvable.
const MAX_FILE_FAILURES: u32 = 3;

/// Cache and resolution counters (cumulative).
#[derive(Clone, Copy, Debug, Default)]
pub struct ResolverStats {
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Addresses blazesym could not resolve (they keep a placeholder frame).
    pub unresolved: u64,
    /// Files or kallsyms that could not be read at all.
    pub source_errors: u64,
}

/// Resolved lines by address (or file offset); None: unresolvable.
type LineCache = HashMap<u64, Option<Arc<[Line]>>>;

pub struct Resolver {
    blaze: Blaze,
    user: HashMap<FileKey, LineCache>,
    user_entries: usize,
    kernel: LineCache,
    /// The file itself, not its `/proc/self/fd/N` path: holding it keeps the
    /// descriptor open (and N naming it) until the batch is resolved, even
    /// if the mapping that wanted it is replaced meanwhile.
    pending_user: HashMap<FileKey, (Arc<MappedFile>, Vec<u64>)>,
    /// Files whose reading failed, and how often: retried a few times (a
    /// failure may be transient), then their addresses stay unresolved.
    failed_files: HashMap<FileKey, u32>,
    pending_kernel: Vec<u64>,
    functions: HashMap<Arc<Function>, ()>,
    build_ids: HashMap<FileKey, Option<Arc<str>>>,
    pub stats: ResolverStats,
}

impl Default for Resolver {
    fn default() -> Self {
        Self {
            // We demangle ourselves so pprof can keep both names.
            blaze: Blaze::builder().enable_demangling(false).build(),
            user: HashMap::new(),
            user_entries: 0,
            kernel: HashMap::new(),
            pending_user: HashMap::new(),
            pending_kernel: Vec::new(),
            failed_files: HashMap::new(),
            functions: HashMap::new(),
            build_ids: HashMap::new(),
            stats: ResolverStats::default(),
        }
    }
}

impl Resolver {
    /// Notes that `file_offset` in `file` will be needed by [`Self::user`].
    pub fn want_user(&mut self, file: &Arc<MappedFile>, file_offset: u64) {
        if self
            .user
            .get(&file.key)
            .is_some_and(|cache| cache.contains_key(&file_offset))
        {
            self.stats.cache_hits += 1;
            return;
        }
        self.stats.cache_misses += 1;
        self.pending_user
            .entry(file.key)
            .or_insert_with(|| (file.clone(), Vec::new()))
            .1
            .push(file_offset);
    }

    pub fn want_kernel(&mut self, address: u64) {
        if self.kernel.contains_key(&address) {
            self.stats.cache_hits += 1;
            return;
        }
        self.stats.cache_misses += 1;
        self.pending_kernel.push(address);
    }

    /// Resolves everything wanted since the last call, a batch per file.
    pub fn resolve_pending(&mut self) {
        if self.user_entries > MAX_USER_ENTRIES {
            self.user.clear();
            self.user_entries = 0;
        }
        if self.kernel.len() > MAX_KERNEL_ENTRIES {
            self.kernel.clear();
        }
        let pending = std::mem::take(&mut self.pending_user);
        for (key, (file, mut offsets)) in pending {
            offsets.sort_unstable();
            offsets.dedup();
            let source = Source::Elf(Elf::new(&file.access_path));
            let Some(results) = self.symbolize(&source, Input::FileOffset(&offsets)) else {
                let failures = self.failed_files.entry(key).or_default();
                *failures += 1;
                if *failures < MAX_FILE_FAILURES {
                    // Not cached: the next batch that wants them tries again.
                    continue;
                }
                self.failed_files.remove(&key);
                self.stats.unresolved += offsets.len() as u64;
                let cache = self.user.entry(key).or_default();
                self.user_entries += offsets.len();
                cache.extend(offsets.into_iter().map(|offset| (offset, None)));
                continue;
            };
            self.failed_files.remove(&key);
            let cache = self.user.entry(key).or_default();
            self.user_entries += offsets.len();
            cache.extend(offsets.into_iter().zip(results));
        }
        let mut addresses = std::mem::take(&mut self.pending_kernel);
        if !addresses.is_empty() {
            addresses.sort_unstable();
            addresses.dedup();
            let source = Source::Kernel(Kernel {
                // Debug info for the kernel is rarely installed and slow to parse.
                debug_syms: false,
                ..Kernel::default()
            });
            // kallsyms is read whole: a failure is not worth retrying per batch.
            let results = self
                .symbolize(&source, Input::AbsAddr(&addresses))
                .unwrap_or_else(|| {
                    self.stats.unresolved += addresses.len() as u64;
                    vec![None; addresses.len()]
                });
            self.kernel.extend(addresses.into_iter().zip(results));
        }
    }

    /// The lines for a user address resolved by [`Self::resolve_pending`];
    /// None when unresolvable.
    pub fn user(&self, file: &MappedFile, file_offset: u64) -> Option<Arc<[Line]>> {
        self.user.get(&file.key)?.get(&file_offset)?.clone()
    }

    pub fn kernel(&self, address: u64) -> Option<Arc<[Line]>> {
        self.kernel.get(&address)?.clone()
    }

    /// GNU build id of a file, lowercase hex, cached.
    pub fn build_id(&mut self, file: &MappedFile) -> Option<Arc<str>> {
        if let Some(id) = self.build_ids.get(&file.key) {
            return id.clone();
        }
        let id = blazesym::helper::read_elf_build_id(&file.access_path)
            .ok()
            .flatten()
            .map(|bytes| {
                let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
                Arc::from(hex)
            });
        self.build_ids.insert(file.key, id.clone());
        id
    }

    /// Forgets a file no process maps any more (its descriptor is about to close).
    pub fn forget_file(&mut self, file: &MappedFile) {
        if let Some(cache) = self.user.remove(&file.key) {
            self.user_entries = self.user_entries.saturating_sub(cache.len());
        }
        self.build_ids.remove(&file.key);
        self.failed_files.remove(&file.key);
        let evict =
            blazesym::symbolize::evict::Evict::Elf(blazesym::symbolize::evict::Elf::new(&file.access_path));
        let _ = self.blaze.evict(&evict);
    }

    /// None when the source could not be read at all (the caller decides
    /// whether its addresses count as unresolved or are retried).
    fn symbolize(&mut self, source: &Source, input: Input<&[u64]>) -> Option<Vec<Option<Arc<[Line]>>>> {
        let results = match self.blaze.symbolize(source, input) {
            Ok(results) => results,
            Err(err) => {
                self.stats.source_errors += 1;
                tracing::debug!("symbolization source failed: {err}");
                return None;
            }
        };
        let mut out = Vec::with_capacity(results.len());
        let mut unresolved = 0;
        for result in &results {
            match result {
                Symbolized::Sym(sym) => out.push(Some(lines_of(&mut self.functions, sym))),
                Symbolized::Unknown(_) => {
                    unresolved += 1;
                    out.push(None);
                }
            }
        }
        self.stats.unresolved += unresolved;
        Some(out)
    }
}

/// pprof's Lines for one address, innermost first. blazesym reports the
/// outermost function with its inlined callees outer to inner; each callee's
/// code info is its call site (a line of its caller), and the symbol's own
/// code info is the address's line in the innermost function.
fn lines_of(functions: &mut HashMap<Arc<Function>, ()>, sym: &blazesym::symbolize::Sym<'_>) -> Arc<[Line]> {
    let mut names: Vec<(&str, Option<&blazesym::symbolize::CodeInfo<'_>>)> =
        Vec::with_capacity(sym.inlined.len() + 1);
    names.push((&sym.name, None));
    names.extend(sym.inlined.iter().map(|inlined| (&*inlined.name, None)));
    // Shift code infos: the outermost gets the first callee's call site, ...,
    // the innermost gets the symbol's own location.
    for (index, inlined) in sym.inlined.iter().enumerate() {
        names[index].1 = inlined.code_info.as_ref();
    }
    if let Some(last) = names.last_mut() {
        last.1 = sym.code_info.as_deref();
    }
    names
        .iter()
        .rev()
        .map(|(system_name, code_info)| {
            let filename = code_info.map(|info| {
                let path = info.to_path();
                Arc::<str>::from(path.to_string_lossy())
            });
            Line {
                function: intern(functions, system_name, filename),
                line: code_info.and_then(|info| info.line).unwrap_or(0),
            }
        })
        .collect()
}

fn intern(
    functions: &mut HashMap<Arc<Function>, ()>,
    system_name: &str,
    filename: Option<Arc<str>>,
) -> Arc<Function> {
    let function = Function {
        name: demangle(system_name).into(),
        system_name: system_name.into(),
        filename,
    };
    if let Some((existing, ())) = functions.get_key_value(&function) {
        return existing.clone();
    }
    let function = Arc::new(function);
    functions.insert(function.clone(), ());
    function
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::SnapshotReader;

    #[inline(never)]
    fn marker_function_for_the_resolver_test() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn a_wanted_file_stays_readable_after_its_mapping_is_dropped() {
        let mut reader = SnapshotReader::default();
        let snapshot = reader.read(std::process::id(), 1).expect("our own mappings");
        let address = marker_function_for_the_resolver_test as fn() -> u64 as usize as u64;
        assert_eq!(marker_function_for_the_resolver_test(), 42);
        let mapping = snapshot
            .mappings
            .iter()
            .find(|mapping| (mapping.start..mapping.end).contains(&address))
            .expect("the test binary maps the marker function");
        let file = mapping.file.clone().expect("the test binary is a file");
        let offset = address - mapping.start + mapping.offset;
        let mut resolver = Resolver::default();
        resolver.want_user(&file, offset);
        // The snapshot that wanted it is replaced before the batch resolves
        // (a refresh): the descriptor must outlive it.
        let key = file.key;
        drop(file);
        drop(snapshot);
        drop(reader);
        resolver.resolve_pending();
        assert_eq!(resolver.stats.source_errors, 0, "the file could not be read");
        // Another descriptor of the same file finds the cached lines.
        let again = SnapshotReader::default()
            .read(std::process::id(), 1)
            .expect("our own mappings");
        let file = again
            .mappings
            .iter()
            .filter_map(|mapping| mapping.file.clone())
            .find(|file| file.key == key)
            .expect("the test binary is still mapped");
        let lines = resolver.user(&file, offset).expect("the marker resolves");
        assert!(
            lines[0]
                .function
                .name
                .contains("marker_function_for_the_resolver_test"),
            "resolved to {:?}",
            lines[0].function.name
        );
    }
}
