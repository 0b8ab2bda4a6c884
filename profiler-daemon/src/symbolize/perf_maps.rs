//! JIT-compiled code named from its runtime's perf map: the file
//! `/tmp/perf-PID.map` that Node (`--perf-basic-prof`), the JVM
//! (`jcmd PID Compiler.perfmap`), .NET (`DOTNET_PerfMapEnabled=1`) and
//! CPython 3.12+ (`-X perf`) write, one `START SIZE NAME` line per compiled
//! function, appended as they compile.
//!
//! The file lives in a directory every user may write and is written by the
//! process's owner: hostile input to a root daemon. So it is the file the
//! process itself would see (its own root's `/tmp`, its pid in its own
//! namespace), resolved inside that root with no symbolic link followed
//! anywhere on the way, opened without blocking, taken only if it is a
//! regular file owned by the process's owner (or root's, readable by
//! anyone: what the owner could read anyway), and read by the sandboxed
//! worker in bounded chunks from where the last read ended (runtimes
//! append; a file whose first bytes changed was written anew, and is read
//! again from its start). A later line for the same address wins over an
//! earlier one.

mod open;

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use super::{resolver::Resolver, stack::Line};
use crate::procfs::ProcRoot;

/// A process's map is looked at again at most this often while it runs JIT
/// code its map does not name: a few times per drain, so a function
/// compiled since the last look is named in the drain after it.
const CHECK_UNNAMED_EVERY: Duration = Duration::from_millis(250);
/// This often while it has no map the daemon could read.
const CHECK_WITHOUT_MAP_EVERY: Duration = Duration::from_secs(1);
/// And this often while all its JIT code is named (a map written anew with
/// other names for the same code).
const CHECK_NAMED_EVERY: Duration = Duration::from_secs(5);
/// Chunks (of 4 MiB) read per look: the rest waits for the next.
const CHUNKS_PER_CHECK: usize = 4;
/// Read per batch over every process, at most: the rest waits.
const MAX_CHUNKS_PER_BATCH: usize = 8;
/// What one process's map may make the daemon keep and read.
const MAX_SYMBOLS_PER_PROCESS: usize = 262_144;
const MAX_BYTES_PER_PROCESS: u64 = 256 << 20;
/// What every map together may make the daemon keep: names and entries.
const MAX_HELD_BYTES: u64 = 64 << 20;
/// What an entry costs besides its name (the tree's node, the frame).
const ENTRY_BYTES: u64 = 96;
/// Processes remembered as looked at (with a map or not); past it, forgotten
/// (looked at again).
const MAX_LOOKED: usize = 8192;

/// Perf map figures for /metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct PerfMapStats {
    /// Chunks read by the worker.
    pub reads: u64,
    /// Maps not read: not a regular file, another user's, a link, FUSE.
    pub refused: u64,
    /// Lines that were no symbol.
    pub bad_lines: u64,
    /// Maps that hit a bound (symbols, bytes, all maps' memory): the rest
    /// is not read.
    pub capped: u64,
    /// Symbols held now.
    pub symbols: u64,
}

#[derive(Default)]
struct JitProcess {
    /// The map's (dev, inode) as last read: another file starts over.
    file: Option<(u64, u64)>,
    read_to: u64,
    /// By start: (end, the function as a frame shows it).
    symbols: BTreeMap<u64, (u64, Arc<[Line]>)>,
    /// What `symbols` costs, in [`MAX_HELD_BYTES`]'s terms.
    held: u64,
    capped: bool,
    /// The length and hash of the file's head when first read: another head
    /// is another file written over this one.
    head: Option<(u64, u64)>,
}

pub struct PerfMaps {
    proc: ProcRoot,
    /// Processes with a map read.
    processes: HashMap<(u32, u32), JitProcess>,
    /// When each process was last looked at.
    looked: HashMap<(u32, u32), Instant>,
    held: u64,
    chunks_this_batch: usize,
    pub stats: PerfMapStats,
}

impl PerfMaps {
    pub fn new(proc: ProcRoot) -> Self {
        Self {
            proc,
            processes: HashMap::new(),
            looked: HashMap::new(),
            held: 0,
            chunks_this_batch: 0,
            stats: PerfMapStats::default(),
        }
    }

    /// The JIT-compiled function at `address` in the process, as a frame.
    pub fn lines(&self, pid: u32, instance: u32, address: u64) -> Option<Arc<[Line]>> {
        let process = self.processes.get(&(pid, instance))?;
        let (_, (end, name)) = process.symbols.range(..=address).next_back()?;
        (address < *end).then(|| name.clone())
    }

    pub fn exited(&mut self, pid: u32, instance: u32) {
        self.looked.remove(&(pid, instance));
        self.forget(pid, instance);
    }

    /// Drops what the process's map said.
    fn forget(&mut self, pid: u32, instance: u32) {
        if let Some(process) = self.processes.remove(&(pid, instance)) {
            self.stats.symbols -= process.symbols.len() as u64;
            self.held -= process.held;
        }
    }

    /// A new batch: its reads start from nothing.
    pub fn begin_batch(&mut self) {
        self.chunks_this_batch = 0;
    }

    /// Reads what is new in the perf map of the process (`ns_pid`: its pid
    /// in its own namespace, the one in the file's name), whether it has
    /// one or not: at most every [`CHECK_UNNAMED_EVERY`] when it ran code
    /// the map does not name (`unnamed`), else every [`CHECK_NAMED_EVERY`].
    pub fn refresh(
        &mut self,
        pid: u32,
        instance: u32,
        ns_pid: Option<u32>,
        unnamed: bool,
        resolver: &mut Resolver,
    ) {
        let key = (pid, instance);
        // A process without a readable map (yet) is looked at once a second:
        // each look reads its mount table, which its owner may make large.
        let every = match (unnamed, self.processes.contains_key(&key)) {
            (true, true) => CHECK_UNNAMED_EVERY,
            (true, false) => CHECK_WITHOUT_MAP_EVERY,
            (false, _) => CHECK_NAMED_EVERY,
        };
        if self.looked.get(&key).is_some_and(|at| at.elapsed() < every)
            || self.chunks_this_batch >= MAX_CHUNKS_PER_BATCH
        {
            return;
        }
        if self.looked.len() >= MAX_LOOKED {
            self.looked.clear();
        }
        self.looked.insert(key, Instant::now());
        let (fd, identity) = match open::open(&self.proc, pid, ns_pid.unwrap_or(pid)) {
            Ok(Some(opened)) => opened,
            // No map (or no more): what an earlier one said still names the
            // code it described.
            Ok(None) => return,
            Err(reason) => {
                // A map refused now shows nothing it said before either.
                self.forget(pid, instance);
                self.stats.refused += 1;
                tracing::debug!(pid, "perf map not read: {reason}");
                return;
            }
        };
        let mut process = self.processes.remove(&key).unwrap_or_default();
        if process.file != Some((identity.dev, identity.inode)) || identity.size < process.read_to {
            // Another file, or this one truncated: what it said is gone.
            self.drop_symbols(&mut process);
            process = JitProcess {
                file: Some((identity.dev, identity.inode)),
                ..JitProcess::default()
            };
        }
        let mut started_over = false;
        for _ in 0..CHUNKS_PER_CHECK {
            if process.capped
                || process.read_to >= identity.size
                || self.chunks_this_batch >= MAX_CHUNKS_PER_BATCH
            {
                break;
            }
            self.chunks_this_batch += 1;
            let head_bytes = process.head.map_or(0, |(len, _)| len);
            let chunk = match resolver.perf_map(&fd, identity, process.read_to, head_bytes) {
                Ok(chunk) => chunk,
                Err(err) => {
                    tracing::debug!(pid, "perf map: {}", crate::error::Chain(&err));
                    break;
                }
            };
            self.stats.reads += 1;
            match process.head {
                // Truncated and written anew past where the last read ended:
                // what it said is gone; read again from its start.
                Some((_, hash)) if chunk.head_hash != hash => {
                    self.drop_symbols(&mut process);
                    process = JitProcess {
                        file: process.file,
                        ..JitProcess::default()
                    };
                    if std::mem::replace(&mut started_over, true) {
                        break;
                    }
                    continue;
                }
                Some(_) => {}
                None if chunk.head_len > 0 && chunk.head_hash != 0 => {
                    process.head = Some((chunk.head_len, chunk.head_hash));
                }
                None => {}
            }
            self.stats.bad_lines += chunk.bad_lines;
            let advanced = chunk.read_to > process.read_to;
            process.read_to = chunk.read_to;
            for (start, end, name) in chunk.symbols {
                if process.symbols.len() >= MAX_SYMBOLS_PER_PROCESS || self.held >= MAX_HELD_BYTES {
                    process.capped = true;
                    break;
                }
                self.insert(&mut process, start, end, &name);
            }
            if process.read_to >= MAX_BYTES_PER_PROCESS {
                process.capped = true;
            }
            if process.capped {
                self.stats.capped += 1;
                tracing::info!(pid, "perf map past its bounds: the rest is not read");
            }
            if !advanced {
                break;
            }
        }
        self.processes.insert(key, process);
    }

    /// Adds a symbol; a later one replaces what it overlaps (code space
    /// reused for another function).
    fn insert(&mut self, process: &mut JitProcess, start: u64, end: u64, name: &str) {
        let mut overlapped: Vec<u64> = process.symbols.range(start..end).map(|(&at, _)| at).collect();
        if let Some((&at, &(before_end, _))) = process.symbols.range(..start).next_back()
            && before_end > start
        {
            overlapped.push(at);
        }
        for at in overlapped {
            if let Some((_, lines)) = process.symbols.remove(&at) {
                let cost = entry_cost(&lines);
                process.held -= cost;
                self.held -= cost;
                self.stats.symbols -= 1;
            }
        }
        // As the runtime wrote it: Node's `JS:*hot /srv/app.js:3:14`, the
        // JVM's `void Main.hot(int)`.
        let lines = Line::named(name.into());
        let cost = entry_cost(&lines);
        process.held += cost;
        self.held += cost;
        self.stats.symbols += 1;
        process.symbols.insert(start, (end, lines));
    }

    fn drop_symbols(&mut self, process: &mut JitProcess) {
        self.stats.symbols -= process.symbols.len() as u64;
        self.held -= process.held;
        process.symbols.clear();
        process.held = 0;
    }
}

fn entry_cost(lines: &[Line]) -> u64 {
    ENTRY_BYTES
        + lines
            .iter()
            .map(|line| line.function.name.len() as u64)
            .sum::<u64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name_at(maps: &PerfMaps, address: u64) -> Option<String> {
        maps.lines(1, 1, address)
            .map(|lines| lines[0].function.name.to_string())
    }

    #[test]
    fn a_later_symbol_replaces_what_it_overlaps_and_the_memory_is_counted() {
        let mut maps = PerfMaps::new(ProcRoot::default());
        let mut process = JitProcess::default();
        maps.insert(&mut process, 0x1000, 0x1100, "old_a");
        maps.insert(&mut process, 0x1100, 0x1200, "old_b");
        maps.insert(&mut process, 0x3000, 0x3100, "kept");
        // Code space reused: one function over both.
        maps.insert(&mut process, 0x1080, 0x1180, "new");
        maps.processes.insert((1, 1), process);
        assert_eq!(name_at(&maps, 0x1000), None, "old_a was overlapped");
        assert_eq!(name_at(&maps, 0x1090).as_deref(), Some("new"));
        assert_eq!(name_at(&maps, 0x1190), None, "old_b was overlapped");
        assert_eq!(name_at(&maps, 0x3050).as_deref(), Some("kept"));
        assert_eq!(name_at(&maps, 0x3100), None, "the end is exclusive");
        assert_eq!(maps.stats.symbols, 2);
        assert_eq!(maps.held, 2 * ENTRY_BYTES + 3 + 4);
        maps.exited(1, 1);
        assert_eq!((maps.stats.symbols, maps.held), (0, 0));
    }
}
