//! Answers by key: the computations in flight (a request with the same key
//! waits for the one running instead of starting its own) and the finished
//! answers of the newest drain, bounded in bytes.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
};

use axum::body::Bytes;
use tokio::sync::OnceCell;

use super::{admission::Refusal, key::ShareKey};
use crate::serve::HttpError;

/// An encoded answer, served as is to every request with its key.
#[derive(Clone, Debug)]
pub struct Answer {
    pub body: Bytes,
    pub content_type: &'static str,
    /// Sent as a download (`Content-Disposition: attachment`), as pprof is.
    pub attachment: bool,
}

/// Why a computation gave no answer: the error for every request that
/// waited for it, and the refusal it was, if one.
pub type Failure = (HttpError, Option<Refusal>);

/// Filled once, by whichever of its waiters computes it first (if that one
/// goes away, the next waiter computes it). A failure is given to the
/// requests that waited for it, and forgotten.
pub type Flight = OnceCell<Result<Answer, Failure>>;

/// How a request found its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// Nobody had it: this request computes it (or, if it fails, a waiter does).
    New,
    /// A request with the same key is computing it.
    InFlight,
    /// Already computed.
    Done,
}

struct Slot {
    flight: Arc<Flight>,
    /// Body bytes counted against the bound, once filled and kept.
    bytes: usize,
}

#[derive(Default)]
struct Inner {
    slots: HashMap<ShareKey, Slot>,
    bytes: usize,
    /// The newest generation (drain) an answer was kept for.
    newest: u64,
}

pub struct Answers {
    inner: Mutex<Inner>,
    max_bytes: usize,
}

impl Answers {
    pub fn new(max_bytes: usize) -> Self {
        Self {
            inner: Mutex::default(),
            max_bytes,
        }
    }

    /// The flight for `key`, joined or started.
    pub fn flight(&self, key: &ShareKey) -> (Arc<Flight>, Found) {
        let mut inner = self.lock();
        if let Some(slot) = inner.slots.get(key) {
            match slot.flight.get() {
                Some(Ok(_)) => return (slot.flight.clone(), Found::Done),
                None => return (slot.flight.clone(), Found::InFlight),
                // Failed, and not yet forgotten: start afresh.
                Some(Err(_)) => {}
            }
        }
        let flight = Arc::new(Flight::new());
        inner.slots.insert(
            key.clone(),
            Slot {
                flight: flight.clone(),
                bytes: 0,
            },
        );
        (flight, Found::New)
    }

    /// Called by the request that filled `flight`: keeps the answer for
    /// later requests if it fits, and drops the answers of older drains.
    pub fn settle(&self, key: &ShareKey, flight: &Arc<Flight>) {
        let Some(Ok(answer)) = flight.get() else {
            return self.abandon(key, flight);
        };
        let size = answer.body.len();
        let mut inner = self.lock();
        let generation = key.generation();
        if generation > inner.newest {
            inner.newest = generation;
            let newest = inner.newest;
            let mut freed = 0;
            inner.slots.retain(|key, slot| {
                let keep = key.generation() >= newest;
                if !keep {
                    freed += slot.bytes;
                }
                keep
            });
            inner.bytes -= freed;
        }
        let stale = generation < inner.newest;
        let fits = inner.bytes + size <= self.max_bytes;
        let Some(slot) = inner
            .slots
            .get_mut(key)
            .filter(|slot| Arc::ptr_eq(&slot.flight, flight))
        else {
            return;
        };
        if slot.bytes > 0 {
            return;
        }
        if stale || !fits {
            // Its waiters hold the flight and still get the answer; later
            // requests compute their own.
            inner.slots.remove(key);
            return;
        }
        slot.bytes = size;
        inner.bytes += size;
    }

    /// Forgets a flight that failed, so the next request with its key starts
    /// afresh.
    pub fn abandon(&self, key: &ShareKey, flight: &Arc<Flight>) {
        let mut inner = self.lock();
        if inner
            .slots
            .get(key)
            .is_some_and(|slot| Arc::ptr_eq(&slot.flight, flight) && slot.bytes == 0)
        {
            inner.slots.remove(key);
        }
    }

    /// Bytes of the answers kept.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing here panics while holding the lock; a poisoned lock still
        // holds consistent counts.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        profile::Filter,
        profile::Window,
        serve::{access::Scope, scrape::key::Format},
    };

    fn key(end_ms: u64, pid: u32) -> ShareKey {
        ShareKey::new(
            Window {
                start_ms: end_ms.saturating_sub(10_000),
                end_ms,
            },
            Filter {
                pids: vec![pid],
                ..Filter::default()
            },
            Scope::ALL,
            crate::kind::ProfileType::Cpu,
            Format::Pprof,
        )
    }

    fn fill(flight: &Flight, size: usize) {
        flight
            .set(Ok(Answer {
                body: Bytes::from(vec![7; size]),
                content_type: "application/octet-stream",
                attachment: true,
            }))
            .expect("a fresh flight");
    }

    #[test]
    fn the_second_request_joins_and_the_third_finds_it_done() {
        let answers = Answers::new(1 << 20);
        let (first, found) = answers.flight(&key(100, 1));
        assert_eq!(found, Found::New);
        let (second, found) = answers.flight(&key(100, 1));
        assert_eq!(found, Found::InFlight);
        assert!(Arc::ptr_eq(&first, &second));
        fill(&first, 10);
        answers.settle(&key(100, 1), &first);
        let (third, found) = answers.flight(&key(100, 1));
        assert_eq!(found, Found::Done);
        assert!(Arc::ptr_eq(&first, &third));
        assert_eq!(answers.bytes(), 10);
    }

    #[test]
    fn a_newer_drain_drops_the_older_answers() {
        let answers = Answers::new(1 << 20);
        for pid in 1..=3 {
            let (flight, _) = answers.flight(&key(100, pid));
            fill(&flight, 100);
            answers.settle(&key(100, pid), &flight);
        }
        assert_eq!(answers.bytes(), 300);
        let (flight, _) = answers.flight(&key(200, 1));
        fill(&flight, 50);
        answers.settle(&key(200, 1), &flight);
        assert_eq!(answers.bytes(), 50);
        assert_eq!(answers.flight(&key(100, 2)).1, Found::New);
        // An answer of an older drain, finished late, is not kept.
        let (late, _) = answers.flight(&key(150, 9));
        fill(&late, 10);
        answers.settle(&key(150, 9), &late);
        assert_eq!(answers.bytes(), 50);
        assert_eq!(answers.flight(&key(150, 9)).1, Found::New);
    }

    #[test]
    fn answers_past_the_bound_are_served_but_not_kept() {
        let answers = Answers::new(1000);
        let (big, _) = answers.flight(&key(100, 1));
        fill(&big, 1001);
        answers.settle(&key(100, 1), &big);
        assert_eq!(answers.bytes(), 0);
        assert_eq!(answers.flight(&key(100, 1)).1, Found::New);
        for pid in 2..=20 {
            let (flight, _) = answers.flight(&key(100, pid));
            fill(&flight, 300);
            answers.settle(&key(100, pid), &flight);
            assert!(answers.bytes() <= 1000, "{} bytes kept", answers.bytes());
        }
        assert_eq!(answers.bytes(), 900);
    }

    #[test]
    fn a_failed_flight_is_forgotten() {
        let answers = Answers::new(1000);
        let (flight, _) = answers.flight(&key(100, 1));
        let (joined, found) = answers.flight(&key(100, 1));
        assert_eq!(found, Found::InFlight);
        let busy = HttpError::new(axum::http::StatusCode::SERVICE_UNAVAILABLE, "busy");
        flight
            .set(Err((busy.clone(), Some(Refusal::QueueFull))))
            .expect("a fresh flight");
        // The request that waited gets the same refusal.
        assert!(
            matches!(joined.get(), Some(Err((error, Some(Refusal::QueueFull)))) if *error == busy),
            "the waiter sees the refusal"
        );
        answers.settle(&key(100, 1), &flight);
        assert_eq!(answers.flight(&key(100, 1)).1, Found::New);
        assert_eq!(answers.bytes(), 0);
    }
}
