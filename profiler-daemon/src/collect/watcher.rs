//! Reads the sampler's process events and snapshots each new process at once:
//! a process that lives 150 ms is gone long before the next drain.

use std::{
    collections::VecDeque,
    os::fd::AsFd,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use nix::{
    errno::Errno,
    poll::{PollFd, PollFlags, PollTimeout, poll},
};
use profiler_common::{ProcessEvent, ProcessEventKind};

use super::{ProcessSnapshot, process_snapshot::SnapshotReader};
use crate::stop::Stop;

/// What the watcher tells the symbolizer.
#[derive(Debug)]
pub enum ProcessNotice {
    Started(ProcessSnapshot),
    /// The instance will get no new samples; drop its data after the next drain.
    Exited {
        pid: u32,
        instance: u32,
    },
}

/// Counts kept by the watcher (read by metrics).
#[derive(Debug, Default)]
pub struct WatcherStats {
    pub snapshots: AtomicU64,
    /// Processes gone (or unreadable) before their mappings could be read.
    pub snapshot_failures: AtomicU64,
}

/// A process is first sampled as early as its first tick after exec, possibly
/// while the dynamic loader is still mapping libraries: read it once more then.
const SECOND_LOOK: Duration = Duration::from_millis(50);

pub struct ProcessWatcher {
    events: RingBuf<MapData>,
    reader: SnapshotReader,
    second_looks: VecDeque<(Instant, ProcessSnapshot)>,
    /// An event the daemon announced itself (see [`Self::met`]), handled
    /// before the ring's.
    met: Option<ProcessEvent>,
    pub stats: Arc<WatcherStats>,
}

impl ProcessWatcher {
    pub fn new(events: RingBuf<MapData>, reader: SnapshotReader) -> Self {
        Self {
            events,
            reader,
            second_looks: VecDeque::new(),
            met: None,
            stats: Arc::default(),
        }
    }

    /// Handles `event` first, as if read from the ring: a process the
    /// daemon handed an instance itself ([`super::Sampler::meet_own_process`]).
    pub fn met(mut self, event: Option<ProcessEvent>) -> Self {
        self.met = event;
        self
    }

    /// Runs until `stop` is set or `send` reports the receiver gone. Sleeps
    /// until an event, a second look or stop is due.
    pub fn run(mut self, stop: &Stop, mut send: impl FnMut(ProcessNotice) -> bool) {
        if let Some(event) = self.met.take()
            && let Some(notice) = self.notice(event)
            && !send(notice)
        {
            return;
        }
        while !stop.is_set() {
            let timeout = self.second_looks.front().map_or(PollTimeout::NONE, |(due, _)| {
                // Rounded up: a look due in 0.4 ms is not polled for 0 ms, again and again.
                let wait_ms = due
                    .saturating_duration_since(Instant::now())
                    .as_micros()
                    .div_ceil(1000);
                PollTimeout::try_from(wait_ms).unwrap_or(PollTimeout::MAX)
            });
            let mut pollfd = [
                PollFd::new(self.events.as_fd(), PollFlags::POLLIN),
                PollFd::new(stop.fd(), PollFlags::POLLIN),
            ];
            match poll(&mut pollfd, timeout) {
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(err) => {
                    tracing::error!("polling process events: {}", std::io::Error::from(err));
                    return;
                }
            }
            while let Some(notice) = self.due_second_look() {
                if !send(notice) {
                    return;
                }
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
                    self.second_looks
                        .push_back((Instant::now() + SECOND_LOOK, snapshot.clone()));
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

impl ProcessWatcher {
    /// The next due second look that found new mappings, if any.
    fn due_second_look(&mut self) -> Option<ProcessNotice> {
        while self
            .second_looks
            .front()
            .is_some_and(|(due, _)| *due <= Instant::now())
        {
            let (_, first) = self.second_looks.pop_front()?;
            let Ok(second) = self.reader.read(first.pid, first.instance) else {
                continue;
            };
            // Only an extension of the same image counts: after an exec the
            // pid shows another program, whose samples have another instance.
            let extends = first.mappings.iter().all(|old| {
                second
                    .mappings
                    .iter()
                    .any(|new| new.start == old.start && new.path == old.path)
            });
            if extends && second.mappings.len() > first.mappings.len() {
                self.stats.snapshots.fetch_add(1, Ordering::Relaxed);
                return Some(ProcessNotice::Started(second));
            }
        }
        None
    }
}

fn parse_event(bytes: &[u8]) -> Option<ProcessEvent> {
    (bytes.len() >= size_of::<ProcessEvent>())
        // SAFETY: length checked; ProcessEvent is plain integers, any bit pattern is valid.
        .then(|| unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<ProcessEvent>()) })
}
