//! Reads of other processes' memory that never hold the caller longer than
//! a deadline.
//!
//! `process_vm_readv(2)` faults the target's pages in as the target itself
//! would, and waits for that. The target's owner chooses what its pages
//! are: a mapping of a file on a FUSE filesystem it mounted (`fusermount`
//! is setuid) pages in only when the owner's FUSE server answers, and a
//! server that never answers blocks the read forever. FUSE waits only
//! killably, so no signal but a fatal one gets the reading thread out.
//! (BPF's `probe_read` never faults pages in, so the sampler is safe.
//! `userfaultfd` could do the same as FUSE, but handling faults of kernel
//! accesses needs privilege while `vm.unprivileged_userfaultfd` is 0, the
//! default; the user-mode-only handlers anyone may make do not see them.)
//!
//! So the reads run on a reader thread and the caller waits for the answer
//! at most [`DEADLINE`]. A read that takes longer fails with
//! [`MemoryError::TimedOut`]; its process instance is then *stalled*: every
//! further read of it fails at once ([`MemoryError::Stalled`]), without a
//! syscall, until it exits (the handle, [`ReaderMemory`], is dropped with
//! the process's cache). The blocked thread is abandoned, to return when
//! the kernel lets it go, and the next read starts a fresh one. Each read
//! has an answer channel of its own, dropped by a caller that stopped
//! waiting, so a late answer is never delivered to anyone.
//!
//! A user can make a new stalled process at will, so abandoned threads are
//! bounded: with [`MAX_ABANDONED`] of them still blocked, every read fails
//! at once ([`MemoryError::Saturated`]) until one returns, and a warning is
//! logged the first time. That turns Python frame names off for everyone
//! meanwhile (frames keep a placeholder), which is the price of not
//! letting anyone grow the daemon's threads without end.
//!
//! Concurrent callers share one reader thread; a read queued behind one
//! that blocks fails with [`MemoryError::NotStarted`] and stalls nobody
//! (the one that blocked does). The daemon has one caller, the symbolizer.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::python::memory::{Memory, MemoryError, ProcessMemory};

/// The longest a read holds its caller. A read of resident memory takes
/// microseconds; one that pages in from swap or from a local disk's page
/// cache miss takes milliseconds; a process whose read takes longer loses
/// its Python names until it exits, so the deadline sits well above those.
/// Each stalled process costs the symbolizer this much once.
pub const DEADLINE: Duration = Duration::from_millis(50);

/// Reader threads left blocked at most, before reads are refused. Each
/// costs a thread's stack (a small one, [`STACK_SIZE`]) until it returns.
pub const MAX_ABANDONED: usize = 8;

/// A reader thread's stack: it runs one system call and a copy.
const STACK_SIZE: usize = 64 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReaderLimits {
    /// See [`DEADLINE`].
    pub deadline: Duration,
    /// See [`MAX_ABANDONED`].
    pub max_abandoned: usize,
}

impl Default for ReaderLimits {
    fn default() -> Self {
        Self {
            deadline: DEADLINE,
            max_abandoned: MAX_ABANDONED,
        }
    }
}

/// The reader's own counters (the ones named "now" are gauges).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReaderStats {
    /// Reads that did not end within the deadline (each stalls its process).
    pub timeouts: u64,
    /// Process instances stalled now (not read until they exit).
    pub stalled_processes: u64,
    /// Reads of a stalled process refused without a syscall.
    pub refused_stalled: u64,
    /// Reads refused as [`ReaderLimits::max_abandoned`] threads were blocked.
    pub refused_saturated: u64,
    /// Reads the reader thread did not start within the deadline (queued
    /// behind another caller's, or the thread not scheduled).
    pub not_started: u64,
    /// Reader threads blocked in a read nobody waits for any more, now.
    pub abandoned_threads: u64,
    /// Reader threads started: the first, and each taking over from one
    /// abandoned (or lost).
    pub threads_started: u64,
}

/// What the reader thread runs: read `buffer.len()` bytes at `address` of
/// process `pid` (tests put fake memory here).
type Backend = dyn Fn(u32, u64, &mut [u8]) -> Result<(), MemoryError> + Send + Sync;

/// What reader threads share with the reader (not the reader itself: a
/// thread holding it would keep its own request channel open).
struct Shared {
    backend: Box<Backend>,
    /// Reader threads alive: the current one and the abandoned ones.
    threads: AtomicUsize,
}

struct Request {
    pid: u32,
    address: u64,
    len: usize,
    /// Set by whichever comes first: the thread starting the read, or the
    /// caller giving up on it before (then the thread skips it).
    claim: Arc<AtomicBool>,
    /// This read's own answer channel: once the caller stops waiting its
    /// end is gone and a late answer is dropped here.
    answer: SyncSender<Result<Vec<u8>, MemoryError>>,
}

/// The thread taking requests now.
struct Current {
    requests: Sender<Request>,
    /// Tells this thread from its successors, so that a caller giving up
    /// retires only the thread its read went to.
    generation: u64,
}

struct Inner {
    shared: Arc<Shared>,
    limits: ReaderLimits,
    /// Held only to look up, start or retire the current thread, never
    /// while waiting for an answer.
    current: Mutex<Option<Current>>,
    generation: AtomicU64,
    warned: AtomicBool,
    timeouts: AtomicU64,
    stalled_processes: AtomicU64,
    refused_stalled: AtomicU64,
    refused_saturated: AtomicU64,
    not_started: AtomicU64,
    threads_started: AtomicU64,
}

/// The reader (see the module's documentation); clones share it.
#[derive(Clone)]
pub struct Reader {
    inner: Arc<Inner>,
}

impl Reader {
    /// The daemon's reader, shared by every caller: the bound on abandoned
    /// threads holds for the whole daemon, across restarts of the
    /// symbolizer stage (a fresh reader there would start from zero while
    /// its predecessor's threads are still blocked).
    pub fn daemon() -> Reader {
        static READER: OnceLock<Reader> = OnceLock::new();
        READER
            .get_or_init(|| Reader::new(ReaderLimits::default()))
            .clone()
    }

    /// A reader of live processes with `process_vm_readv(2)`.
    pub fn new(limits: ReaderLimits) -> Reader {
        Self::with_backend(limits, |pid, address, buffer| {
            ProcessMemory::new(pid).read(address, buffer)
        })
    }

    /// A reader whose threads run `backend` for each read.
    pub fn with_backend(
        limits: ReaderLimits,
        backend: impl Fn(u32, u64, &mut [u8]) -> Result<(), MemoryError> + Send + Sync + 'static,
    ) -> Reader {
        let shared = Arc::new(Shared {
            backend: Box::new(backend),
            threads: AtomicUsize::new(0),
        });
        let inner = Inner {
            shared,
            limits,
            current: Mutex::new(None),
            generation: AtomicU64::new(0),
            warned: AtomicBool::new(false),
            timeouts: AtomicU64::new(0),
            stalled_processes: AtomicU64::new(0),
            refused_stalled: AtomicU64::new(0),
            refused_saturated: AtomicU64::new(0),
            not_started: AtomicU64::new(0),
            threads_started: AtomicU64::new(0),
        };
        Reader {
            inner: Arc::new(inner),
        }
    }

    /// The memory of one process instance: open it again for another
    /// instance of the pid (a stalled instance stays so, the next is read).
    pub fn open(&self, pid: u32) -> ReaderMemory {
        ReaderMemory::new(pid, self.clone())
    }

    pub fn stats(&self) -> ReaderStats {
        let inner = &*self.inner;
        let current = usize::from(inner.lock_current().is_some());
        let threads = inner.shared.threads.load(Ordering::Acquire);
        ReaderStats {
            timeouts: inner.timeouts.load(Ordering::Relaxed),
            stalled_processes: inner.stalled_processes.load(Ordering::Relaxed),
            refused_stalled: inner.refused_stalled.load(Ordering::Relaxed),
            refused_saturated: inner.refused_saturated.load(Ordering::Relaxed),
            not_started: inner.not_started.load(Ordering::Relaxed),
            // A current thread that died is not counted in `threads` but
            // still in `current` until a read finds out: hence saturating.
            abandoned_threads: threads.saturating_sub(current) as u64,
            threads_started: inner.threads_started.load(Ordering::Relaxed),
        }
    }
}

impl Inner {
    fn lock_current(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        // Nothing panics while holding it (spawn failures are errors), and
        // its state is valid at every step anyway.
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current thread's request channel, started if there is none and
    /// the bound allows.
    fn current(&self) -> Result<(Sender<Request>, u64), MemoryError> {
        let mut current = self.lock_current();
        if let Some(current) = &*current {
            return Ok((current.requests.clone(), current.generation));
        }
        // With no current thread, every live one is abandoned.
        let abandoned = self.shared.threads.load(Ordering::Acquire);
        if abandoned >= self.limits.max_abandoned {
            self.refused_saturated.fetch_add(1, Ordering::Relaxed);
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "{abandoned} reads of processes' memory are blocked (pages that never come in, \
                     e.g. a mapping of a file on a FUSE filesystem that does not answer): \
                     Python frames are not named until one returns"
                );
            }
            return Err(MemoryError::Saturated { abandoned });
        }
        let (requests, receiver) = mpsc::channel();
        let shared = self.shared.clone();
        // Counted before it runs, so that its exit (which uncounts it) cannot come first.
        shared.threads.fetch_add(1, Ordering::AcqRel);
        let spawned = std::thread::Builder::new()
            .name("python-reader".into())
            .stack_size(STACK_SIZE)
            .spawn(move || serve(shared, receiver));
        if let Err(error) = spawned {
            self.shared.threads.fetch_sub(1, Ordering::AcqRel);
            return Err(MemoryError::Spawn(error));
        }
        self.threads_started.fetch_add(1, Ordering::Relaxed);
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        *current = Some(Current {
            requests: requests.clone(),
            generation,
        });
        Ok((requests, generation))
    }

    /// Lets go of thread `generation` if it is still the current one: its
    /// request channel closes, so it ends once its read returns.
    fn retire(&self, generation: u64) {
        let mut current = self.lock_current();
        if current
            .as_ref()
            .is_some_and(|current| current.generation == generation)
        {
            *current = None;
        }
    }

    /// Reads on the reader thread, waiting at most the deadline. The
    /// checks of `ReaderMemory::read` are done.
    fn read(&self, pid: u32, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        let start = Instant::now();
        let deadline = self.limits.deadline;
        let (requests, generation) = self.current()?;
        let claim = Arc::new(AtomicBool::new(false));
        let (answer, answers) = mpsc::sync_channel(1);
        let request = Request {
            pid,
            address,
            len: buffer.len(),
            claim: claim.clone(),
            answer,
        };
        if requests.send(request).is_err() {
            // The thread is gone (its backend panicked): the next read starts another.
            self.retire(generation);
            return Err(MemoryError::ReaderLost);
        }
        let outcome = match answers.recv_timeout(deadline.saturating_sub(start.elapsed())) {
            Ok(outcome) => outcome,
            Err(RecvTimeoutError::Disconnected) => {
                // The thread dropped the request unanswered: it panicked.
                self.retire(generation);
                return Err(MemoryError::ReaderLost);
            }
            Err(RecvTimeoutError::Timeout) => {
                if !claim.swap(true, Ordering::AcqRel) {
                    // Not started, and now it never will be: the thread is
                    // busy with another caller's read (which, if it blocks,
                    // retires it) or was not scheduled. Not this process's doing.
                    self.not_started.fetch_add(1, Ordering::Relaxed);
                    return Err(MemoryError::NotStarted { pid, deadline });
                }
                // Started: it may have ended between the timeout and now.
                match answers.try_recv() {
                    Ok(outcome) => outcome,
                    Err(_) => {
                        self.timeouts.fetch_add(1, Ordering::Relaxed);
                        self.retire(generation);
                        return Err(MemoryError::TimedOut {
                            pid,
                            address,
                            len: buffer.len(),
                            deadline,
                        });
                    }
                }
            }
        };
        let bytes = outcome?;
        // The thread fills a buffer of the length asked; anything else is
        // a bug there, reported rather than trusted.
        if bytes.len() != buffer.len() {
            return Err(MemoryError::Short {
                address,
                wanted: buffer.len(),
                got: bytes.len(),
            });
        }
        buffer.copy_from_slice(&bytes);
        Ok(())
    }
}

/// A reader thread: serves requests until the reader lets go of it.
fn serve(shared: Arc<Shared>, requests: Receiver<Request>) {
    /// Uncounts the thread however it ends (a panicking backend included).
    struct Alive(Arc<Shared>);
    impl Drop for Alive {
        fn drop(&mut self) {
            self.0.threads.fetch_sub(1, Ordering::AcqRel);
        }
    }
    let alive = Alive(shared);
    // Ends when the reader drops its end: this thread was abandoned (and
    // its read has now returned) or the reader is gone.
    for request in requests {
        if request.claim.swap(true, Ordering::AcqRel) {
            // Its caller gave up before it started.
            continue;
        }
        let mut bytes = vec![0; request.len];
        let outcome = (alive.0.backend)(request.pid, request.address, &mut bytes).map(|()| bytes);
        // Fails if the caller stopped waiting: the late answer goes nowhere.
        let _ = request.answer.send(outcome);
    }
}

mod memory;
pub use memory::ReaderMemory;

#[cfg(test)]
mod fuse;
#[cfg(test)]
mod tests;
