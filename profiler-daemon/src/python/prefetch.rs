//! Code objects read ahead of their samples. The symbolizer names Python
//! frames when a drain hands it their samples, up to a drain interval
//! later; a process living a few hundred milliseconds is gone by then, and
//! its memory with it. So the sampler announces each code object a CPU
//! records and has not announced lately (ring `PYTHON_CODES`, with a
//! wake-up), and this stage reads it at once, while the process most
//! likely lives, and hands it to the symbolizer's cache.
//!
//! Bounded: reads go through the daemon's [`Reader`] (never held past its
//! deadline), at most [`READS_PER_SECOND`] in all and
//! [`READS_PER_SECOND_PER_PROCESS`] per process; past them an announcement
//! is dropped (counted) and the symbolizer reads that code object itself
//! when its samples come, as it would have without this stage.

use std::{
    collections::HashMap,
    os::fd::AsFd as _,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use profiler_common::python::PythonCodeSeen;

use super::{
    code::{CodeObject, read_code_with},
    detect::Detected,
    layout::Layout,
    reader::{Reader, ReaderMemory},
};
use crate::stop::Stop;

pub const READS_PER_SECOND: u32 = 2000;
pub const READS_PER_SECOND_PER_PROCESS: u32 = 500;
/// Processes not announced for this long are forgotten (they exited, or
/// run code already read).
const FORGET_AFTER: Duration = Duration::from_secs(30);

/// What the symbolizer learns of Python processes outside its batches.
/// Payloads boxed: the queue (16,384 slots) is allocated whole at start, so
/// each byte of the message is 16 KiB of the daemon's memory at rest.
#[derive(Debug)]
pub enum PythonNews {
    /// A CPython process the table manager found.
    Found(Box<Detected>),
    /// A code object read ahead of its samples.
    Code {
        pid: u32,
        instance: u32,
        address: u64,
        code: Box<CodeObject>,
    },
}

const _: () = assert!(size_of::<PythonNews>() <= 32, "the news queue is allocated whole");

/// Counters for /metrics.
#[derive(Debug, Default)]
pub struct PrefetchStats {
    pub announced: AtomicU64,
    pub read: AtomicU64,
    pub failed: AtomicU64,
    /// Over the rate bounds, of processes not found (yet), or not taken by
    /// a lagging symbolizer.
    pub dropped: AtomicU64,
}

struct Process {
    instance: u32,
    layout: Layout,
    memory: ReaderMemory,
    code_type: Option<u64>,
    reads_this_second: u32,
    last: Instant,
}

pub struct Prefetcher {
    ring: RingBuf<MapData>,
    found: mpsc::Receiver<Detected>,
    to_symbolizer: mpsc::SyncSender<PythonNews>,
    reader: Reader,
    processes: HashMap<u32, Process>,
    reads_this_second: u32,
    second: Instant,
    stats: Arc<PrefetchStats>,
}

impl Prefetcher {
    pub fn new(
        ring: RingBuf<MapData>,
        found: mpsc::Receiver<Detected>,
        to_symbolizer: mpsc::SyncSender<PythonNews>,
    ) -> Self {
        Self {
            ring,
            found,
            to_symbolizer,
            reader: Reader::daemon(),
            processes: HashMap::new(),
            reads_this_second: 0,
            second: Instant::now(),
            stats: Arc::default(),
        }
    }

    pub fn stats(&self) -> Arc<PrefetchStats> {
        self.stats.clone()
    }

    /// Serves until `stop` is set.
    pub fn run(mut self, stop: &Stop) {
        while !stop.is_set() {
            self.wait(stop);
            self.take_found();
            if self.second.elapsed() >= Duration::from_secs(1) {
                self.new_second();
            }
            while let Some(seen) = self.ring.next().map(|item| parse(&item)) {
                let Some(seen) = seen else { continue };
                self.stats.announced.fetch_add(1, Ordering::Relaxed);
                self.take_found();
                self.read(seen);
            }
        }
    }

    /// Sleeps until the ring has something (it wakes its reader) or stop
    /// is set. The processes found meanwhile are taken on waking: the
    /// sampler announces a process's code objects only once it is found.
    fn wait(&self, stop: &Stop) {
        let mut fds = [
            PollFd::new(self.ring.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop.fd(), PollFlags::POLLIN),
        ];
        // An error (EINTR) is only an earlier look at the ring.
        let _ = poll(&mut fds, PollTimeout::NONE);
    }

    fn take_found(&mut self) {
        while let Ok(detected) = self.found.try_recv() {
            self.processes.insert(
                detected.pid,
                Process {
                    instance: detected.instance,
                    layout: detected.layout,
                    memory: self.reader.open(detected.pid),
                    code_type: None,
                    reads_this_second: 0,
                    last: Instant::now(),
                },
            );
        }
    }

    fn new_second(&mut self) {
        self.second = Instant::now();
        self.reads_this_second = 0;
        self.processes.retain(|_, process| {
            process.reads_this_second = 0;
            process.last.elapsed() < FORGET_AFTER
        });
    }

    fn read(&mut self, seen: PythonCodeSeen) {
        let Some(process) = self.processes.get_mut(&seen.tgid) else {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        process.last = Instant::now();
        if self.reads_this_second >= READS_PER_SECOND
            || process.reads_this_second >= READS_PER_SECOND_PER_PROCESS
        {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.reads_this_second += 1;
        process.reads_this_second += 1;
        match read_code_with(
            &process.memory,
            &process.layout,
            seen.code,
            &mut process.code_type,
        ) {
            Ok(code) => {
                self.stats.read.fetch_add(1, Ordering::Relaxed);
                // Cached under the instance its samples carry (the table
                // manager's may be another of the pid's, see python_frames).
                let instance = if seen.instance != 0 {
                    seen.instance
                } else {
                    process.instance
                };
                let news = PythonNews::Code {
                    pid: seen.tgid,
                    instance,
                    address: seen.code,
                    code: Box::new(code),
                };
                if self.to_symbolizer.try_send(news).is_err() {
                    self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(error) => {
                tracing::trace!(pid = seen.tgid, "reading a python code object ahead: {error}");
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn parse(bytes: &[u8]) -> Option<PythonCodeSeen> {
    let bytes: &[u8; size_of::<PythonCodeSeen>()] =
        bytes.get(..size_of::<PythonCodeSeen>())?.try_into().ok()?;
    Some(PythonCodeSeen {
        tgid: u32::from_le_bytes(bytes[0..4].try_into().ok()?),
        instance: u32::from_le_bytes(bytes[4..8].try_into().ok()?),
        code: u64::from_le_bytes(bytes[8..16].try_into().ok()?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_parse_and_short_ones_do_not() {
        let mut bytes = [0u8; 16];
        bytes[0..4].copy_from_slice(&4242u32.to_le_bytes());
        bytes[4..8].copy_from_slice(&7u32.to_le_bytes());
        bytes[8..16].copy_from_slice(&0x7f00_dead_bee0u64.to_le_bytes());
        assert_eq!(
            parse(&bytes),
            Some(PythonCodeSeen {
                tgid: 4242,
                instance: 7,
                code: 0x7f00_dead_bee0
            })
        );
        assert_eq!(parse(&bytes[..12]), None);
    }
}
