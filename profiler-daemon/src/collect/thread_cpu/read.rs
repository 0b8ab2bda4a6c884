//! Reading the threads' CPU times the ledger credits: /proc for the threads
//! alive at a drain, the sampler's THREAD_EXITS map for those gone since.
//!
//! `task/TID/schedstat`'s first field is the thread's `se.sum_exec_runtime`,
//! the counter the sampler reads at every sample: the two agree to the
//! nanosecond. What other users control here is their threads' names (any
//! bytes, cut to the kernel's 16) and counts (the ledger bounds the threads
//! followed); files are read as bytes, at most a page.

use std::{
    fs::File,
    io::Read,
    path::{Path, PathBuf},
};

use aya::maps::{HashMap, IterableMap as _, MapData, MapError};
use nix::time::{ClockId, clock_gettime};
use profiler_common::{COMM_LEN, ThreadExit, maps};

use super::{Changes, CpuLedger, MAX_FOLLOWED_THREADS, NewThread, ProcessReading, Readings, ThreadReading};
use crate::{collect::batch, procfs::ProcRoot};

/// The sampler's maps the ledger reads and keeps.
pub struct LedgerMaps {
    pub exits: HashMap<MapData, u32, ThreadExit>,
    pub followed: HashMap<MapData, u32, u32>,
    /// tid -> runtime at its last sample.
    pub thread_times: HashMap<MapData, u32, u64>,
}

/// What reading one process's threads gave.
enum Listing {
    /// Its threads (None: it is gone).
    Read(Option<ProcessReading>),
    /// Not read this time (its task directory could not be opened).
    NotNow,
    /// More threads than the budget left.
    TooMany,
}

/// Reads what the ledger needs at every drain.
pub struct ThreadClock {
    proc: ProcRoot,
    maps: LedgerMaps,
    /// Nanoseconds per clock tick (/proc/PID/stat's start time unit).
    tick_ns: u64,
    /// CLOCK_BOOTTIME, in those ticks, of the previous drain's reads (at
    /// first, of the sampler's attach).
    previous_ticks: u64,
    bytes: Vec<u8>,
    exit_tids: Vec<u32>,
    exit_values: Vec<ThreadExit>,
    /// Each followed thread's schedstat, held open: a drain re-reads it
    /// with one pread (a seq_file read at offset 0 is generated afresh),
    /// where opening it again walks /proc's path each time (measured: 16 us
    /// a thread against 2 on this VM). The descriptor names the thread, not
    /// its tid: once it exits, reads fail, even if another takes the tid.
    schedstats: std::collections::HashMap<u32, std::collections::HashMap<u32, File>>,
}

impl ThreadClock {
    /// None when this kernel's schedstat does not count CPU time (no
    /// SCHED_INFO, or delay accounting off before 5.14): the ledger would
    /// then take back what the samples measured.
    pub fn new(proc: ProcRoot, maps: LedgerMaps) -> Option<Self> {
        let mut bytes = Vec::new();
        let own = read_into(Path::new("/proc/thread-self/schedstat"), &mut bytes)
            .then(|| first_number(&bytes))
            .flatten();
        if !own.is_some_and(|ns| ns > 0) {
            tracing::warn!(
                "/proc/thread-self/schedstat does not count CPU time here: CPU time is credited at samples only"
            );
            return None;
        }
        let ticks_per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .and_then(|ticks| u64::try_from(ticks).ok())
            .filter(|&ticks| (1..=1_000_000_000).contains(&ticks))
            .unwrap_or(100);
        let tick_ns = 1_000_000_000 / ticks_per_second;
        Some(Self {
            previous_ticks: boot_ns() / tick_ns,
            proc,
            maps,
            tick_ns,
            bytes,
            exit_tids: Vec::new(),
            exit_values: Vec::new(),
            schedstats: std::collections::HashMap::new(),
        })
    }

    /// Threads of a process, as `status` says (0 if gone or unreadable).
    pub fn threads_of(&mut self, tgid: u32) -> usize {
        // `Threads:` comes before the long lines (Groups: comes earlier, but
        // holds at most NGROUPS_MAX ids): the whole file is read, bounded.
        if !read_bounded(&self.proc.file(tgid, "status"), &mut self.bytes, 64 * 1024) {
            return 0;
        }
        String::from_utf8_lossy(&self.bytes)
            .lines()
            .find_map(|line| line.strip_prefix("Threads:"))
            .and_then(|count| count.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Every thread of each of `tgids`, and the exits recorded since the
    /// previous drain (taken out of the map; on an error, those read so far,
    /// the error counted in `read_errors`).
    pub fn read(&mut self, ledger: &CpuLedger, tgids: &[u32], read_errors: &mut u64) -> Readings {
        let now_ticks = boot_ns() / self.tick_ns;
        let mut readings = Readings::default();
        // Only the processes read now hold descriptors (a resting one opens
        // them again when it wakes): at most the budget below.
        let reading: std::collections::HashSet<u32> = tgids.iter().copied().collect();
        self.schedstats.retain(|tgid, _| reading.contains(tgid));
        let mut budget = MAX_FOLLOWED_THREADS;
        for &tgid in tgids {
            match self.read_process(ledger, tgid, &mut budget) {
                Listing::Read(reading) => readings.processes.push((tgid, reading)),
                Listing::NotNow => {}
                Listing::TooMany => readings.too_many.push(tgid),
            }
        }
        self.previous_ticks = now_ticks;
        if let Err(err) = batch::read_all(
            self.maps.exits.map(),
            true,
            &mut self.exit_tids,
            &mut self.exit_values,
        ) {
            *read_errors += 1;
            tracing::debug!("reading {}: {err}", maps::THREAD_EXITS);
        }
        readings.exits = self
            .exit_tids
            .iter()
            .copied()
            .zip(self.exit_values.iter().copied())
            .collect();
        readings
    }

    /// Tells the sampler which processes are followed now (those no longer
    /// first: a process evicted and followed again in one drain stays), and
    /// the baselines of evicted threads.
    pub fn follow(&mut self, changes: Changes, errors: &mut u64) {
        for tgid in changes.stopped {
            self.schedstats.remove(&tgid);
            match self.maps.followed.remove(&tgid) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(err) => {
                    *errors += 1;
                    tracing::debug!("no longer following {tgid}: {err}");
                }
            }
        }
        for tgid in changes.started {
            if let Err(err) = self.maps.followed.insert(&tgid, &1, 0) {
                *errors += 1;
                tracing::debug!("following {tgid}: {err}");
            }
        }
        for (tid, credited_ns) in changes.credited {
            // Only ever raised: a sample between the read and the write
            // raised it already (the sampler's value only grows).
            let behind = self
                .maps
                .thread_times
                .get(&tid, 0)
                .is_ok_and(|sampled_ns| sampled_ns < credited_ns);
            if behind && self.maps.thread_times.insert(&tid, &credited_ns, 0).is_err() {
                *errors += 1;
            }
        }
    }

    /// One process's threads, within `budget` threads read this drain (a
    /// process its owner grew past it is no longer followed: its threads
    /// would cost a descriptor and a read each, every drain).
    fn read_process(&mut self, ledger: &CpuLedger, tgid: u32, budget: &mut usize) -> Listing {
        let tasks = self.proc.file(tgid, "task");
        if let Some(threads) = self.read_unchanged(ledger, tgid, &tasks, budget) {
            return Listing::Read(Some(ProcessReading { threads }));
        }
        let entries = match std::fs::read_dir(&tasks) {
            Ok(entries) => entries,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                self.schedstats.remove(&tgid);
                return Listing::Read(None);
            }
            // Out of descriptors, say: not read this time (as if resting).
            Err(_) => return Listing::NotNow,
        };
        let mut tids = Vec::new();
        for entry in entries.flatten() {
            if tids.len() == *budget {
                self.schedstats.remove(&tgid);
                return Listing::TooMany;
            }
            if let Some(tid) = entry
                .file_name()
                .to_str()
                .and_then(|name| name.parse::<u32>().ok())
            {
                tids.push(tid);
            }
        }
        *budget -= tids.len();
        let mut held = self.schedstats.remove(&tgid).unwrap_or_default();
        let mut still = std::collections::HashMap::with_capacity(held.len());
        let mut threads = Vec::new();
        for tid in tids {
            let task = tasks.join(tid.to_string());
            let file = held
                .remove(&tid)
                .or_else(|| File::open(task.join("schedstat")).ok());
            // None: exited since the listing (its exit record says), or
            // unreadable this once (left as it was).
            let runtime_ns = file.as_ref().and_then(|file| self.pread_number(file));
            if let (Some(file), Some(_)) = (file, runtime_ns) {
                still.insert(tid, file);
            }
            let new = (!ledger.knows(tgid, tid)).then(|| NewThread {
                comm: self.comm(task.join("comm")),
                started_since_previous: self
                    .started_ticks(task.join("stat"))
                    .map(|ticks| ticks >= self.previous_ticks),
                sampled_ns: self.maps.thread_times.get(&tid, 0).ok(),
            });
            threads.push(ThreadReading { tid, runtime_ns, new });
        }
        // Threads no longer listed: their descriptors close here.
        self.schedstats.insert(tgid, still);
        Listing::Read(Some(ProcessReading { threads }))
    }

    /// The threads of a process as listed at the previous drain, read
    /// without listing `task/` again (the listing, a dentry per thread,
    /// cost more than the reads: 1,800 threads took 3.4 us each a drain
    /// here) when its set of threads cannot have changed: `task/`'s link
    /// count (its threads + 2) is the number held, each known to the ledger
    /// and still readable. A thread that exited fails its read; one created
    /// after `read` took the time is new at the next drain, as with a
    /// listing. None: list them.
    ///
    /// Why that is the live set: the kernel's `proc_task_getattr` gives
    /// `task/` 2 links plus `nr_threads`, which changes with the thread list
    /// under the same lock. The count is taken before the reads; a read
    /// that succeeds after it means its thread was alive at it (a held
    /// descriptor names its thread, and fails once it is released, even if
    /// another takes the tid). Held threads all alive, as many as the
    /// count: no other thread. Reading first and counting after would not
    /// hold.
    fn read_unchanged(
        &mut self,
        ledger: &CpuLedger,
        tgid: u32,
        tasks: &Path,
        budget: &mut usize,
    ) -> Option<Vec<ThreadReading>> {
        use std::os::unix::fs::MetadataExt as _;
        let held = self.schedstats.get(&tgid)?;
        let threads_now = std::fs::metadata(tasks).ok()?.nlink().checked_sub(2)?;
        if held.is_empty()
            || held.len() > *budget
            || threads_now != held.len() as u64
            || !ledger.knows_all(tgid, held.keys().copied())
        {
            return None;
        }
        let mut threads = Vec::with_capacity(held.len());
        for (&tid, file) in held {
            let runtime_ns = pread_first_number(file, &mut self.bytes)?;
            threads.push(ThreadReading {
                tid,
                runtime_ns: Some(runtime_ns),
                new: None,
            });
        }
        *budget -= threads.len();
        Some(threads)
    }

    fn pread_number(&mut self, file: &File) -> Option<u64> {
        pread_first_number(file, &mut self.bytes)
    }

    /// `stat`'s 22nd field: when the thread started, in clock ticks since boot.
    fn started_ticks(&mut self, path: PathBuf) -> Option<u64> {
        if !read_into(&path, &mut self.bytes) {
            return None;
        }
        // The name (field 2) may hold any bytes, ')' and spaces included:
        // fields are counted after its last ')'.
        let close = self.bytes.iter().rposition(|&byte| byte == b')')?;
        let after_name = std::str::from_utf8(&self.bytes[close + 1..]).ok()?;
        after_name.split_whitespace().nth(22 - 3)?.parse().ok()
    }

    fn comm(&mut self, path: PathBuf) -> [u8; COMM_LEN] {
        let mut comm = [0; COMM_LEN];
        if read_into(&path, &mut self.bytes) {
            let name = self.bytes.strip_suffix(b"\n").unwrap_or(&self.bytes);
            let len = name.len().min(COMM_LEN - 1);
            comm[..len].copy_from_slice(&name[..len]);
        }
        comm
    }
}

/// The first number of a held /proc file (at most 256 bytes of it), read
/// afresh: a seq_file read at offset 0 is generated anew.
fn pread_first_number(file: &File, bytes: &mut Vec<u8>) -> Option<u64> {
    pread_numbers(file, bytes).map(|[number]| number)
}

/// The first N numbers of a held /proc file (at most 256 bytes of it),
/// read afresh.
pub(in crate::collect) fn pread_numbers<const N: usize>(
    file: &File,
    bytes: &mut Vec<u8>,
) -> Option<[u64; N]> {
    use std::os::unix::fs::FileExt as _;
    bytes.resize(256, 0);
    let read = file.read_at(bytes, 0).ok()?;
    numbers(&bytes[..read])
}

/// The first whitespace-separated field, as a number.
fn first_number(bytes: &[u8]) -> Option<u64> {
    numbers(bytes).map(|[number]| number)
}

/// The first N whitespace-separated fields, as numbers.
fn numbers<const N: usize>(bytes: &[u8]) -> Option<[u64; N]> {
    let mut fields = std::str::from_utf8(bytes).ok()?.split_whitespace();
    let mut numbers = [0; N];
    for number in &mut numbers {
        *number = fields.next()?.parse().ok()?;
    }
    Some(numbers)
}

/// Reads a small /proc file (these are at most a page) into `bytes`.
fn read_into(path: &Path, bytes: &mut Vec<u8>) -> bool {
    read_bounded(path, bytes, 4096)
}

fn read_bounded(path: &Path, bytes: &mut Vec<u8>, limit: u64) -> bool {
    bytes.clear();
    match File::open(path) {
        Ok(file) => file.take(limit).read_to_end(bytes).is_ok(),
        Err(_) => false,
    }
}

/// CLOCK_BOOTTIME now, in ns (the clock of a thread's start time in /proc).
fn boot_ns() -> u64 {
    clock_gettime(ClockId::CLOCK_BOOTTIME).map_or(0, |now| {
        (now.tv_sec() as u64) * 1_000_000_000 + now.tv_nsec() as u64
    })
}
