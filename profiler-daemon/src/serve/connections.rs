//! The bounds on HTTP connections: how many the daemon holds, and how long
//! one may hold a slot without a request in flight.
//!
//! Every admitted connection owns a semaphore permit and a [`Slot`] that its
//! task keeps up to date: waiting for a request's headers, busy (a request or
//! its unwritten response), or idle between keep-alive requests. When every
//! permit is taken, a new connection asks the one idle the longest to close
//! and takes its permit; if all of them are busy the new one is refused. So
//! an attacker holding idle connections can delay a scraper by one eviction,
//! never lock it out, and the daemon's sockets stay at the maximum + 1.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// The configured bounds (flags/config keys `http_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    /// From accept (or from the first byte after an idle spell) to a
    /// request's complete headers.
    pub header_timeout: Duration,
    /// A keep-alive connection with nothing in flight.
    pub idle_timeout: Duration,
}

/// Why the daemon closed a connection (the `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    HeaderTimeout,
    IdleTimeout,
    Evicted,
    Refused,
}

impl CloseReason {
    pub const ALL: [Self; 4] = [
        Self::HeaderTimeout,
        Self::IdleTimeout,
        Self::Evicted,
        Self::Refused,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::HeaderTimeout => "header_timeout",
            Self::IdleTimeout => "idle_timeout",
            Self::Evicted => "evicted",
            Self::Refused => "refused",
        }
    }
}

/// How long the accept loop waits for an evicted connection to let go of its
/// permit before it asks the next one (its task only has to be scheduled).
const EVICTION_WAIT: Duration = Duration::from_millis(250);
const EVICTION_ATTEMPTS: usize = 4;

/// For /metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct ConnectionStats {
    pub open: usize,
    pub max: usize,
    /// By [`CloseReason::ALL`]'s order.
    pub closed: [u64; 4],
    pub accept_errors: u64,
}

pub struct ConnectionTable {
    limits: ConnectionLimits,
    permits: Arc<Semaphore>,
    slots: Mutex<HashMap<u64, Arc<Slot>>>,
    next_id: AtomicU64,
    /// Slots keep their times as milliseconds after this instant.
    epoch: Instant,
    closed: [AtomicU64; 4],
    accept_errors: AtomicU64,
}

impl ConnectionTable {
    pub fn new(limits: ConnectionLimits) -> Self {
        Self {
            limits,
            permits: Arc::new(Semaphore::new(limits.max_connections)),
            slots: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            epoch: Instant::now(),
            closed: Default::default(),
            accept_errors: AtomicU64::new(0),
        }
    }

    pub fn limits(&self) -> ConnectionLimits {
        self.limits
    }

    pub fn stats(&self) -> ConnectionStats {
        ConnectionStats {
            open: self.lock().len(),
            max: self.limits.max_connections,
            closed: self.closed.each_ref().map(|count| count.load(Ordering::Relaxed)),
            accept_errors: self.accept_errors.load(Ordering::Relaxed),
        }
    }

    pub fn count_closed(&self, reason: CloseReason) {
        let index = CloseReason::ALL.iter().position(|&r| r == reason).unwrap_or(0);
        self.closed[index].fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_accept_error(&self) {
        self.accept_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// A slot for a new connection, evicting the longest-idle one if the
    /// table is full; `None` (counted as refused) if every one is busy.
    pub async fn admit(self: &Arc<Self>) -> Option<Admission> {
        let mut permit = self.permits.clone().try_acquire_owned().ok();
        for _ in 0..EVICTION_ATTEMPTS {
            if permit.is_some() {
                break;
            }
            let victim = self.longest_idle()?;
            victim.request_eviction();
            permit = tokio::time::timeout(EVICTION_WAIT, self.permits.clone().acquire_owned())
                .await
                .ok()
                .and_then(Result::ok);
        }
        let Some(permit) = permit else {
            self.count_closed(CloseReason::Refused);
            return None;
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot::new(self.epoch));
        self.lock().insert(id, slot.clone());
        Some(Admission {
            table: self.clone(),
            id,
            slot,
            _permit: permit,
        })
    }

    /// The connection without a request in flight for the longest, not
    /// already asked to close. Counts a refusal when there is none.
    fn longest_idle(&self) -> Option<Arc<Slot>> {
        let victim = self
            .lock()
            .values()
            .filter(|slot| !slot.is_busy() && !slot.evict.load(Ordering::Relaxed))
            .min_by_key(|slot| slot.since_ms.load(Ordering::Relaxed))
            .cloned();
        if victim.is_none() {
            self.count_closed(CloseReason::Refused);
        }
        victim
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
        // The map holds plain handles: a panic elsewhere cannot leave it torn.
        self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A connection's place in the table; frees it (and its permit) on drop.
/// Dropped after the socket, so the count never undercounts descriptors.
pub struct Admission {
    table: Arc<ConnectionTable>,
    id: u64,
    slot: Arc<Slot>,
    _permit: OwnedSemaphorePermit,
}

impl Admission {
    pub fn slot(&self) -> &Arc<Slot> {
        &self.slot
    }

    pub fn table(&self) -> &ConnectionTable {
        &self.table
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.table.lock().remove(&self.id);
    }
}

const WAITING_HEADERS: u8 = 0;
const WAITING_IDLE: u8 = 1;

/// What one connection is doing. Written only by its own task (the hyper
/// connection, its reads and its service all run there); the accept loop
/// only reads it to choose whom to evict, and the connection re-checks
/// before it obeys, so a stale read can only pick a slightly worse victim.
pub struct Slot {
    /// Requests whose response has not been handed to hyper in full.
    requests: AtomicU32,
    /// A response write is waiting for the client to read.
    write_blocked: AtomicBool,
    /// When not busy: waiting for headers or idle.
    waiting: AtomicU8,
    /// When the current busy or waiting spell began (ms after the epoch).
    since_ms: AtomicU64,
    evict: AtomicBool,
    /// Wakes the connection's task: its phase changed, or it should close.
    wake: Notify,
    epoch: Instant,
}

impl Slot {
    fn new(epoch: Instant) -> Self {
        let slot = Self {
            requests: AtomicU32::new(0),
            write_blocked: AtomicBool::new(false),
            waiting: AtomicU8::new(WAITING_HEADERS),
            since_ms: AtomicU64::new(0),
            evict: AtomicBool::new(false),
            wake: Notify::new(),
            epoch,
        };
        slot.mark_since();
        slot
    }

    pub fn is_busy(&self) -> bool {
        self.requests.load(Ordering::Relaxed) > 0 || self.write_blocked.load(Ordering::Relaxed)
    }

    fn mark_since(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.since_ms.store(ms, Ordering::Relaxed);
    }

    fn since(&self) -> Instant {
        self.epoch + Duration::from_millis(self.since_ms.load(Ordering::Relaxed))
    }

    /// A request's headers arrived; it is in flight until the guard drops.
    pub fn begin_request(self: &Arc<Self>) -> RequestGuard {
        if self.requests.fetch_add(1, Ordering::Relaxed) == 0 {
            self.mark_since();
        }
        self.wake.notify_one();
        RequestGuard(self.clone())
    }

    /// Bytes came in: after an idle spell, a new request has begun and its
    /// headers are now on the clock.
    pub fn on_read(&self) {
        if !self.is_busy() && self.waiting.load(Ordering::Relaxed) == WAITING_IDLE {
            self.waiting.store(WAITING_HEADERS, Ordering::Relaxed);
            self.mark_since();
            self.wake.notify_one();
        }
    }

    /// Whether a response write is stuck on the client (counts as busy).
    pub fn set_write_blocked(&self, blocked: bool) {
        if self.write_blocked.swap(blocked, Ordering::Relaxed) != blocked {
            self.became_idle_if_done();
        }
    }

    fn became_idle_if_done(&self) {
        if !self.is_busy() {
            self.waiting.store(WAITING_IDLE, Ordering::Relaxed);
            self.mark_since();
        }
        self.wake.notify_one();
    }

    /// When this connection times out if nothing changes, and why; `None`
    /// while it is busy.
    pub fn deadline(&self, limits: &ConnectionLimits) -> Option<(Instant, CloseReason)> {
        if self.is_busy() {
            return None;
        }
        Some(match self.waiting.load(Ordering::Relaxed) {
            WAITING_HEADERS => (self.since() + limits.header_timeout, CloseReason::HeaderTimeout),
            _ => (self.since() + limits.idle_timeout, CloseReason::IdleTimeout),
        })
    }

    fn request_eviction(&self) {
        self.evict.store(true, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// Whether the accept loop asked this connection to make room, and it
    /// still can (nothing in flight). A busy one keeps its place.
    pub fn take_eviction(&self) -> bool {
        self.evict.swap(false, Ordering::Relaxed) && !self.is_busy()
    }

    /// Resolves when [`Slot::wake`] is notified (a permit is kept if the
    /// task was not waiting, so no change is missed).
    pub async fn changed(&self) {
        self.wake.notified().await;
    }
}

/// Held by a request from its headers to the end of its response body.
pub struct RequestGuard(Arc<Slot>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let slot = &self.0;
        if slot.requests.fetch_sub(1, Ordering::Relaxed) == 1 {
            slot.became_idle_if_done();
        }
    }
}

#[cfg(test)]
mod tests;
