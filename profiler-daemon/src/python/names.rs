//! Names of the Python frames of samples: the code objects read, cached
//! per process instance.
//!
//! A frame's slot holds the code object's address, the instruction and 5
//! bits of key ([`profiler_common::python`]). The code object is read once
//! per (pid, process instance, address) and kept; it is used for a slot
//! only if its key (from `co_firstlineno`) equals the slot's: otherwise the
//! address may now hold another code object (the first freed, its memory
//! reused), so the object is read again once, and if the key still
//! differs the frame gets a placeholder (counted in `key_mismatches`; the
//! keys seen differing are remembered for [`Limits::negative_ttl`], so a
//! stream of such slots costs one read per key, not one per slot).
//!
//! Bounds, as the process decides what its stacks hold:
//! - an address that cannot be read is remembered as such (a negative
//!   entry) for [`Limits::negative_ttl`], so a forged stack of garbage
//!   addresses costs one read each, not one per sample;
//! - at most [`Limits::per_process`] entries (negative ones included) and
//!   [`Limits::bytes_per_process`] bytes per process instance, and
//!   [`Limits::total`] entries and [`Limits::bytes_total`] bytes in all.
//!   Past a bound, the least recently used eighth of that process's (or of
//!   all) entries go at once: a sort every few thousand new entries instead
//!   of an ordered list kept on every use.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use profiler_common::python::{decode_frame, is_python_frame};

use crate::python::code::{CodeError, CodeObject, read_code_with};
use crate::python::layout::Layout;
use crate::python::memory::{Memory, ProcessMemory};
use crate::python::reader::ReaderStats;
use entries::{Cached, Entry, Process, State, cached};

/// Bytes counted for a negative entry (its map slot).
const NEGATIVE_WEIGHT: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub per_process: usize,
    pub total: usize,
    pub bytes_per_process: usize,
    pub bytes_total: usize,
    /// How long an unreadable address stays so before it is tried again (an
    /// arena unmapped then mapped again may hold code objects later).
    pub negative_ttl: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            per_process: 4096,
            total: 65536,
            // A real code object weighs a few hundred bytes; a forged one
            // up to ~90 KiB (capped names, filename, line table).
            bytes_per_process: 8 << 20,
            bytes_total: 64 << 20,
            negative_ttl: Duration::from_secs(60),
        }
    }
}

/// A Python frame, named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonFrame {
    /// The qualified name (3.11+) or name; a placeholder if not resolved.
    pub function: Arc<str>,
    pub filename: Option<Arc<str>>,
    /// 0 when unknown.
    pub line: u32,
    pub resolved: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonNameStats {
    /// Code objects read (attempts).
    pub reads: u64,
    /// Time spent reading them (system calls and parsing).
    pub read_ns: u64,
    pub read_errors: u64,
    /// Code objects read ahead of their samples, while their process lived.
    pub read_ahead: u64,
    pub key_mismatches: u64,
    pub evictions: u64,
    /// Entries held now, negative ones included.
    pub cached: u64,
    /// The memory reader's own counters: [`PythonNames`] reads through a
    /// [`Memory`] it knows nothing more of and leaves them zero; the owner
    /// of the reader (the symbolizer's `PythonFrames`) fills them in.
    pub reader: ReaderStats,
}

/// The cache (see the module's documentation).
pub struct PythonNames<M: Memory = ProcessMemory> {
    open: Box<dyn Fn(u32) -> M + Send>,
    limits: Limits,
    processes: HashMap<(u32, u32), Process<M>>,
    entries: usize,
    bytes: usize,
    clock: u64,
    stats: PythonNameStats,
}

impl PythonNames {
    /// Reads with plain `process_vm_readv(2)`, which a process can make
    /// block forever: for tests and tools. The daemon reads through
    /// [`crate::python::reader`], which bounds each read's time.
    pub fn new() -> Self {
        Self::with_memory(ProcessMemory::new, Limits::default())
    }
}

impl Default for PythonNames {
    fn default() -> Self {
        Self::new()
    }
}

impl<M: Memory> PythonNames<M> {
    /// A cache reading each process with `open(pid)` (tests use fake memory).
    pub fn with_memory(open: impl Fn(u32) -> M + Send + 'static, limits: Limits) -> Self {
        Self {
            open: Box::new(open),
            limits,
            processes: HashMap::new(),
            entries: 0,
            bytes: 0,
            clock: 0,
            stats: PythonNameStats::default(),
        }
    }

    /// Names the Python frame of `slot`, sampled in `pid` (that `instance`
    /// of it), whose interpreter has `layout`.
    pub fn resolve(&mut self, pid: u32, instance: u32, layout: &Layout, slot: u64) -> PythonFrame {
        let (address, instruction, key) = decode_frame(slot);
        if !is_python_frame(slot) {
            return placeholder(address);
        }
        self.clock += 1;
        let clock = self.clock;
        let open = &self.open;
        let process = self.processes.entry((pid, instance)).or_insert_with(|| Process {
            memory: open(pid),
            code_type: None,
            entries: HashMap::new(),
            bytes: 0,
        });
        // The cached entry answers, unless it must be read again.
        let seen = match cached(process, address, key, clock, self.limits.negative_ttl) {
            Cached::Code(code) => return frame(code, instruction),
            Cached::Mismatched => {
                self.stats.key_mismatches += 1;
                return placeholder(address);
            }
            Cached::Unreadable => return placeholder(address),
            Cached::Stale(seen) => seen,
        };
        self.stats.reads += 1;
        let read = Instant::now();
        let outcome = read_code_with(&process.memory, layout, address, &mut process.code_type);
        self.stats.read_ns += u64::try_from(read.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let (state, answer) = match outcome {
            Ok(code) if code.key() == key => {
                let answer = frame(&code, instruction);
                let state = State::Code {
                    code: Arc::new(code),
                    mismatched: 0,
                    read,
                };
                (state, answer)
            }
            Ok(code) => {
                self.stats.key_mismatches += 1;
                // The keys seen differing still differ if the object did not change.
                let kept = match seen {
                    Some((seen_key, mismatched)) if seen_key == code.key() => mismatched,
                    _ => 0,
                };
                let state = State::Code {
                    code: Arc::new(code),
                    mismatched: kept | (1 << key),
                    read,
                };
                (state, placeholder(address))
            }
            Err(CodeError::Read { source, .. }) if source.is_transient() => {
                // The reader could not read now (too many reads blocked):
                // no word on the address, so nothing is remembered of it.
                tracing::trace!(pid, "python code object: {source}");
                self.stats.read_errors += 1;
                return placeholder(address);
            }
            Err(error) => {
                tracing::trace!(pid, "python code object: {error}");
                self.stats.read_errors += 1;
                (State::Unreadable { since: read }, placeholder(address))
            }
        };
        self.remember((pid, instance), address, state, clock);
        answer
    }

    /// Caches what was read of `address` in the process `key`, within the
    /// cache's bounds.
    fn remember(&mut self, key: (u32, u32), address: u64, state: State, clock: u64) {
        let Some(process) = self.processes.get_mut(&key) else {
            return;
        };
        let weight = match &state {
            State::Code { code, .. } => code.weight(),
            State::Unreadable { .. } => NEGATIVE_WEIGHT,
        };
        let entry = Entry {
            state,
            used: clock,
            weight,
        };
        process.bytes += weight;
        self.bytes += weight;
        match process.entries.insert(address, entry) {
            Some(old) => {
                process.bytes -= old.weight;
                self.bytes -= old.weight;
            }
            None => self.entries += 1,
        }
        self.bound(key);
    }

    /// Takes in a code object read ahead of its samples (see
    /// [`super::prefetch`]): a short-lived process may be gone by the time
    /// they are named. An address already cached keeps its entry.
    pub fn read_ahead(&mut self, pid: u32, instance: u32, address: u64, code: CodeObject) {
        self.clock += 1;
        let clock = self.clock;
        let open = &self.open;
        let process = self.processes.entry((pid, instance)).or_insert_with(|| Process {
            memory: open(pid),
            code_type: None,
            entries: HashMap::new(),
            bytes: 0,
        });
        if process.entries.contains_key(&address) {
            return;
        }
        let weight = code.weight();
        let entry = Entry {
            state: State::Code {
                code: Arc::new(code),
                mismatched: 0,
                read: Instant::now(),
            },
            used: clock,
            weight,
        };
        process.bytes += weight;
        self.bytes += weight;
        process.entries.insert(address, entry);
        self.entries += 1;
        self.stats.read_ahead += 1;
        self.bound((pid, instance));
    }

    /// Forgets a process instance (it exited or exec'd).
    pub fn exited(&mut self, pid: u32, instance: u32) {
        if let Some(process) = self.processes.remove(&(pid, instance)) {
            self.entries -= process.entries.len();
            self.bytes -= process.bytes;
        }
    }

    pub fn stats(&self) -> PythonNameStats {
        PythonNameStats {
            cached: self.entries as u64,
            ..self.stats
        }
    }

    /// Evicts per the limits, `key`'s process first.
    fn bound(&mut self, key: (u32, u32)) {
        let limits = self.limits;
        if let Some(process) = self.processes.get(&key)
            && (process.entries.len() > limits.per_process || process.bytes > limits.bytes_per_process)
        {
            let mut candidates: Vec<(u64, (u32, u32), u64)> = process
                .entries
                .iter()
                .map(|(&address, entry)| (entry.used, key, address))
                .collect();
            self.evict(
                &mut candidates,
                limits.per_process,
                limits.bytes_per_process,
                |names| {
                    names
                        .processes
                        .get(&key)
                        .map_or((0, 0), |process| (process.entries.len(), process.bytes))
                },
            );
        }
        if self.entries > limits.total || self.bytes > limits.bytes_total {
            let mut candidates: Vec<(u64, (u32, u32), u64)> = self
                .processes
                .iter()
                .flat_map(|(&key, process)| {
                    process
                        .entries
                        .iter()
                        .map(move |(&address, entry)| (entry.used, key, address))
                })
                .collect();
            self.evict(&mut candidates, limits.total, limits.bytes_total, |names| {
                (names.entries, names.bytes)
            });
        }
    }

    /// Removes the least recently used of `candidates` (used, process,
    /// address) until `size` says at most 7/8 of both bounds are held.
    fn evict(
        &mut self,
        candidates: &mut [(u64, (u32, u32), u64)],
        entries: usize,
        bytes: usize,
        size: impl Fn(&Self) -> (usize, usize),
    ) {
        candidates.sort_unstable_by_key(|&(used, _, _)| used);
        let (entries, bytes) = (entries - entries / 8, bytes - bytes / 8);
        for &(_, key, address) in candidates.iter() {
            let (held, weight) = size(self);
            if held <= entries && weight <= bytes {
                break;
            }
            let Some(process) = self.processes.get_mut(&key) else {
                continue;
            };
            if let Some(entry) = process.entries.remove(&address) {
                process.bytes -= entry.weight;
                self.bytes -= entry.weight;
                self.entries -= 1;
                self.stats.evictions += 1;
            }
        }
    }
}

fn frame(code: &CodeObject, instruction: u64) -> PythonFrame {
    PythonFrame {
        function: code.qualname.clone(),
        filename: Some(code.filename.clone()),
        line: code.line(instruction),
        resolved: true,
    }
}

fn placeholder(address: u64) -> PythonFrame {
    PythonFrame {
        function: Arc::from(format!("[unknown python code {address:#x}]")),
        filename: None,
        line: 0,
        resolved: false,
    }
}

mod entries;
#[cfg(test)]
mod live;
#[cfg(test)]
mod tests;
