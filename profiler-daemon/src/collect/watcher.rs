//! Reads the sampler's process events and snapshots each new process at once:
//! a process that lives 150 ms is gone long before the next drain.

use std::{
    os::fd::AsRawFd,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use aya::maps::{MapData, RingBuf};
use profiler_common::{ProcessEvent, ProcessEventKind};

use super::{ProcessSnapshot, process_snapshot::SnapshotReader};

/// What the watcher tells the symbolizer.
#[derive(Debug)]
pub enum ProcessNotice {
    Started(ProcessSnapshot),
    /// The instance will get no new samples; drop its data after the next drain.
    Exited { pid: u32, instance: u32 },
}

/// Counts kept by the watcher (read by metrics).
#[derive(Debug, Default)]
pub struct WatcherStats {
    pub snapshots: AtomicU64,
    /// Processes gone (or unreadable) before their mappings could be read.
    pub snapshot_failures: AtomicU64,
}

pub struct ProcessWatcher {
    events: RingBuf<MapData>,
    reader: SnapshotReader,
    pub stats: Arc<WatcherStats>,
}

impl ProcessWatcher {
    pub fn new(events: RingBuf<MapData>) -> Self {
        Self {
            events,
            reader: SnapshotReader::default(),
            stats: Arc::default(),
        }
    }

    /// Runs until `stop` is set or `send` reports the receiver gone.
    pub fn run(mut self, stop: &AtomicBool, mut send: impl FnMut(ProcessNotice) -> bool) {
        let fd = self.events.as_raw_fd();
        while !stop.load(Ordering::Relaxed) {
            let mut pollfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd; the timeout bounds how late we see `stop`.
            let ready = unsafe { libc::poll(&mut pollfd, 1, 200) };
            if ready < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() != std::io::ErrorKind::Interrupted {
                    tracing::error!("polling process events: {err}");
                    return;
                }
                continue;
            }
            loop {
                let event = {
                    let Some(item) = self.events.next() else {
                        break;
                    };
                    parse_event(&item)
                };
                let Some(event) = event else {
                    tracing::warn!("malformed process event skipped");
                    continue;
                };
                if let Some(notice) = self.notice(event)
                    && !send(notice)
                {
                    return;
                }
            }
        }
    }

    fn notice(&mut self, event: ProcessEvent) -> Option<ProcessNotice> {
        match ProcessEventKind::from_u32(event.kind)? {
            ProcessEventKind::Started => match self.reader.read(event.tgid, event.instance) {
                Ok(snapshot) => {
                    self.stats.snapshots.fetch_add(1, Ordering::Relaxed);
                    Some(ProcessNotice::Started(snapshot))
                }
                Err(err) => {
                    self.stats.snapshot_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(pid = event.tgid, "snapshot failed: {err}");
                    None
                }
            },
            ProcessEventKind::Exited => Some(ProcessNotice::Exited {
                pid: event.tgid,
                instance: event.instance,
            }),
        }
    }
}

fn parse_event(bytes: &[u8]) -> Option<ProcessEvent> {
    (bytes.len() >= size_of::<ProcessEvent>())
        // SAFETY: length checked; ProcessEvent is plain integers, any bit pattern is valid.
        .then(|| unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<ProcessEvent>()) })
}
