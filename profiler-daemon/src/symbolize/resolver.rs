//! Long-lived caches in front of the symbolizers: user frames by (file,
//! file offset), resolved by the isolated worker process, so a library's
//! symbols are shared by every process that maps it and survive the process;
//! kernel frames by address, named by the kernel (the sampler's
//! `kernel_names` program), or from kallsyms where it cannot run (read
//! here: the kernel is not hostile input).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use crate::collect::{FileKey, FileVersion, KernelLookup, KernelNamer, MappedFile};
use crate::shares::Owner;

use super::{
    demangle::demangle,
    kernel_symbols::{KernelStats, KernelSymbols},
    stack::{Function, Line},
    worker::{FileIdentity, Symbols, WorkerClient, WorkerConfig, WorkerError, WorkerStats},
};

/// Caches are dropped wholesale past these sizes: re-symbolizing is cheap,
/// unbounded growth over months is not.
const MAX_USER_ENTRIES: usize = 1 << 20;
const MAX_KERNEL_ENTRIES: usize = 1 << 18;
const MAX_FUNCTIONS: usize = 1 << 20;
/// Batches in a row a file may fail (its worker crashed or timed out) before
/// its addresses are cached as unresolvable; the worker quarantines it sooner.
const MAX_FILE_FAILURES: u32 = 3;

/// Cache and resolution counters (cumulative).
#[derive(Clone, Copy, Debug, Default)]
pub struct ResolverStats {
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Addresses that could not be resolved (they keep a placeholder frame).
    pub unresolved: u64,
    /// Files that could not be read at all.
    pub source_errors: u64,
    /// Naming kernel addresses.
    pub kernel: KernelStats,
    /// Files whose own debug link was not followed.
    pub debug_links_refused: u64,
    /// Cached files that changed on disk (same inode, new size or mtime):
    /// their entry was replaced.
    pub files_replaced: u64,
    /// Addresses left for a later batch: this batch's time budget was
    /// spent, or the kernel's naming of them failed.
    pub deferred: u64,
    /// Addresses of files whose descriptor the open-file bound had closed.
    pub files_closed: u64,
    pub worker: WorkerStats,
}

/// Resolved lines by address (or file offset); None: unresolvable.
type LineCache = HashMap<u64, Option<Arc<[Line]>>>;

/// One file's cache, for one version of its contents.
struct UserCache {
    version: FileVersion,
    lines: LineCache,
}

pub struct Resolver {
    kernel_symbols: KernelSymbols,
    worker: WorkerClient,
    /// How long one batch may spend in the worker: a file that hangs it costs
    /// this batch at most about this; the rest waits for a later batch.
    batch_budget: Duration,
    user: HashMap<FileKey, UserCache>,
    user_entries: usize,
    kernel: LineCache,
    /// The file itself, not a descriptor number: holding it keeps the file
    /// open until the batch is resolved, even if the mapping that wanted it
    /// is replaced meanwhile.
    /// Each file's offsets wanted, and whose turn it is served in (root's
    /// if any privileged process wants it).
    pending_user: HashMap<FileKey, (Arc<MappedFile>, Vec<u64>, Owner)>,
    /// Batches resolved: rotates which user's files go first.
    batches: usize,
    /// Files whose resolution failed, and how often: retried a few times (a
    /// failure may be transient), then their addresses stay unresolved.
    failed_files: HashMap<FileKey, u32>,
    pending_kernel: Vec<u64>,
    functions: HashSet<Arc<Function>>,
    build_ids: HashMap<FileKey, (FileVersion, Option<Arc<str>>)>,
    pub stats: ResolverStats,
}

impl Resolver {
    /// The perf map lines of `fd` from byte `from` on, and the hash of its
    /// first `head_bytes`, read by the worker.
    pub fn perf_map(
        &mut self,
        fd: &std::os::fd::OwnedFd,
        identity: FileIdentity,
        from: u64,
        head_bytes: u64,
    ) -> Result<super::worker::JitSymbols, super::worker::PerfMapError> {
        self.worker.perf_map(fd, identity, from, head_bytes)
    }

    pub fn new(worker: WorkerConfig, kernel_namer: Option<KernelNamer>) -> Self {
        Self {
            kernel_symbols: KernelSymbols::new(kernel_namer),
            batch_budget: worker.deadline,
            worker: WorkerClient::new(worker),
            user: HashMap::new(),
            user_entries: 0,
            kernel: HashMap::new(),
            pending_user: HashMap::new(),
            batches: 0,
            pending_kernel: Vec::new(),
            failed_files: HashMap::new(),
            functions: HashSet::new(),
            build_ids: HashMap::new(),
            stats: ResolverStats::default(),
        }
    }

    /// Notes that `file_offset` in `file` will be needed by [`Self::user`],
    /// for a process of `owner`.
    pub fn want_user(&mut self, file: &Arc<MappedFile>, file_offset: u64, owner: Owner) {
        if self
            .user
            .get(&file.key)
            .is_some_and(|cache| cache.version == file.version && cache.lines.contains_key(&file_offset))
        {
            self.stats.cache_hits += 1;
            return;
        }
        self.stats.cache_misses += 1;
        let pending = self
            .pending_user
            .entry(file.key)
            .or_insert_with(|| (file.clone(), Vec::new(), owner));
        pending.1.push(file_offset);
        pending.2 = pending.2.min(owner);
    }

    pub fn want_kernel(&mut self, address: u64) {
        if self.kernel.contains_key(&address) {
            self.stats.cache_hits += 1;
            return;
        }
        self.stats.cache_misses += 1;
        self.pending_kernel.push(address);
    }

    /// Resolves everything wanted since the last call, a worker request per file.
    pub fn resolve_pending(&mut self) {
        if self.user_entries > MAX_USER_ENTRIES {
            self.user.clear();
            self.user_entries = 0;
        }
        if self.kernel.len() > MAX_KERNEL_ENTRIES {
            self.kernel.clear();
        }
        if self.functions.len() > MAX_FUNCTIONS {
            // Cached lines keep their Arcs; only the interning starts afresh.
            self.functions.clear();
        }
        let budget_end = Instant::now() + self.batch_budget;
        let pending = std::mem::take(&mut self.pending_user)
            .into_iter()
            .map(|(key, (file, offsets, owner))| (owner, (key, file, offsets)))
            .collect();
        self.batches = self.batches.wrapping_add(1);
        for (key, file, mut offsets) in super::turns::in_turns(pending, self.batches) {
            offsets.sort_unstable();
            offsets.dedup();
            if Instant::now() >= budget_end {
                // Not cached: wanted again when sampled again.
                self.stats.deferred += offsets.len() as u64;
                continue;
            }
            self.resolve_file(key, &file, offsets);
        }
        self.stats.worker = self.worker.stats;
        let mut addresses = std::mem::take(&mut self.pending_kernel);
        if !addresses.is_empty() {
            addresses.sort_unstable();
            addresses.dedup();
            let lookups = self.kernel_symbols.names(&addresses);
            self.stats.kernel = self.kernel_symbols.stats;
            for (address, lookup) in addresses.into_iter().zip(lookups) {
                match lookup {
                    KernelLookup::Named(name) => {
                        let line = kernel_line(&mut self.functions, &name);
                        self.kernel.insert(address, Some(line));
                    }
                    KernelLookup::NoSymbol => {
                        self.stats.unresolved += 1;
                        self.kernel.insert(address, None);
                    }
                    // Not cached: asked again when sampled again.
                    KernelLookup::Failed => self.stats.deferred += 1,
                }
            }
        }
    }

    fn resolve_file(&mut self, key: FileKey, file: &MappedFile, offsets: Vec<u64>) {
        let Some(fd) = file.descriptor() else {
            // The open-file bound closed it and its process is gone: these
            // frames stay unknown. Not cached: a process that maps the file
            // later brings a new descriptor.
            self.stats.files_closed += offsets.len() as u64;
            return;
        };
        file.touch();
        let identity = FileIdentity {
            dev: key.dev,
            inode: key.inode,
            size: file.version.size,
            mtime_ns: file.version.mtime_ns,
        };
        match self.worker.symbolize(&fd, identity, &offsets) {
            Ok(response) => {
                self.failed_files.remove(&key);
                if self
                    .build_ids
                    .get(&key)
                    .is_none_or(|(version, _)| *version != file.version)
                {
                    self.stats.debug_links_refused += u64::from(response.debug_link_refused);
                    let id = (!response.build_id.is_empty()).then(|| Arc::from(hex(&response.build_id)));
                    self.build_ids.insert(key, (file.version, id));
                }
                if !response.error.is_empty() {
                    self.stats.source_errors += 1;
                    tracing::debug!(?key, "symbolizing a file failed: {}", response.error);
                    self.cache_user(key, file.version, offsets, None);
                    return;
                }
                let lines = response
                    .symbols
                    .iter()
                    .map(|symbols| self.lines_of(symbols))
                    .collect();
                self.cache_user(key, file.version, offsets, Some(lines));
            }
            Err(WorkerError::Quarantined) => self.cache_user(key, file.version, offsets, None),
            Err(err) => {
                tracing::debug!(?key, "symbolizing a file failed: {err}");
                let failures = self.failed_files.entry(key).or_default();
                *failures += 1;
                if *failures >= MAX_FILE_FAILURES {
                    self.failed_files.remove(&key);
                    self.cache_user(key, file.version, offsets, None);
                }
                // Else not cached: the next batch that wants them tries again.
            }
        }
    }

    /// Caches a file's results (None: all unresolvable). A file that changed
    /// replaces its entry, never adds one.
    fn cache_user(
        &mut self,
        key: FileKey,
        version: FileVersion,
        offsets: Vec<u64>,
        lines: Option<Vec<Option<Arc<[Line]>>>>,
    ) {
        let cache = self.user.entry(key).or_insert_with(|| UserCache {
            version,
            lines: HashMap::new(),
        });
        if cache.version != version {
            self.user_entries = self.user_entries.saturating_sub(cache.lines.len());
            cache.lines.clear();
            cache.version = version;
            self.stats.files_replaced += 1;
        }
        self.user_entries += offsets.len();
        match lines {
            Some(lines) => {
                self.stats.unresolved += lines.iter().filter(|lines| lines.is_none()).count() as u64;
                cache.lines.extend(offsets.into_iter().zip(lines));
            }
            None => {
                self.stats.unresolved += offsets.len() as u64;
                cache
                    .lines
                    .extend(offsets.into_iter().map(|offset| (offset, None)));
            }
        }
    }

    /// The lines for a user address resolved by [`Self::resolve_pending`];
    /// None when unresolvable.
    pub fn user(&self, file: &MappedFile, file_offset: u64) -> Option<Arc<[Line]>> {
        let cache = self.user.get(&file.key)?;
        if cache.version != file.version {
            return None;
        }
        cache.lines.get(&file_offset)?.clone()
    }

    pub fn kernel(&self, address: u64) -> Option<Arc<[Line]>> {
        self.kernel.get(&address)?.clone()
    }

    /// GNU build id of a file, lowercase hex, once the worker has read it.
    pub fn build_id(&self, file: &MappedFile) -> Option<Arc<str>> {
        let (version, id) = self.build_ids.get(&file.key)?;
        if *version == file.version {
            id.clone()
        } else {
            None
        }
    }

    /// Forgets a file no process maps any more (its descriptor is about to close).
    pub fn forget_file(&mut self, file: &MappedFile) {
        if let Some(cache) = self.user.remove(&file.key) {
            self.user_entries = self.user_entries.saturating_sub(cache.lines.len());
        }
        self.build_ids.remove(&file.key);
        self.failed_files.remove(&file.key);
    }

    fn lines_of(&mut self, symbols: &Symbols) -> Option<Arc<[Line]>> {
        if symbols.lines.is_empty() {
            return None;
        }
        Some(
            symbols
                .lines
                .iter()
                .map(|line| Line {
                    function: intern(
                        &mut self.functions,
                        Function {
                            name: line.name.as_str().into(),
                            system_name: line.system_name.as_str().into(),
                            filename: line.filename.as_deref().map(Arc::from),
                        },
                    ),
                    line: line.line,
                })
                .collect(),
        )
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A kernel function's one line: kernel names have no inlining or lines here.
fn kernel_line(functions: &mut HashSet<Arc<Function>>, name: &str) -> Arc<[Line]> {
    let function = intern(
        functions,
        Function {
            name: demangle(name).into(),
            system_name: name.into(),
            filename: None,
        },
    );
    Arc::from([Line { function, line: 0 }])
}

fn intern(functions: &mut HashSet<Arc<Function>>, function: Function) -> Arc<Function> {
    if let Some(existing) = functions.get(&function) {
        return existing.clone();
    }
    let function = Arc::new(function);
    functions.insert(function.clone());
    function
}
