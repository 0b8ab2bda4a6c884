//! Which drain a scrape is answered from. A scrape needs the samples taken
//! up to its arrival, so it asks for a drain; but a drain that began at most
//! `share` before it arrived (a periodic one, or one another request asked
//! for, done or still under way) serves it as well, and then so does every
//! answer computed from that drain. Requests that arrive together therefore
//! see the same drain, the same window, and can share one answer; a request
//! with no drain that recent gets one of its own.

use std::{
    future::Future,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use tokio::sync::OnceCell;

#[derive(Clone, Copy, Debug)]
struct Drained {
    /// When the drain was asked for: it started at or after this.
    asked: Instant,
    time_ms: u64,
}

struct Pending {
    asked: Instant,
    drain: Arc<OnceCell<u64>>,
}

#[derive(Default)]
struct State {
    last: Option<Drained>,
    pending: Option<Pending>,
}

pub struct DrainGate {
    share: Duration,
    state: Mutex<State>,
}

/// Whether a request's drain was its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drain {
    Own,
    Shared,
}

impl DrainGate {
    pub fn new(share: Duration) -> Self {
        Self {
            share,
            state: Mutex::default(),
        }
    }

    /// The time of a drain asked for no earlier than `share` before
    /// `arrival` — `periodic` (the newest drain stored, asked for by no
    /// one: (when it began, its time)), or one a request asked for — running
    /// `drain` for a new one if there is none.
    pub async fn drained<E, F, Fut>(
        &self,
        arrival: Instant,
        periodic: Option<(Instant, u64)>,
        drain: F,
    ) -> Result<(u64, Drain), E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<u64, E>>,
    {
        let recent = |asked: Instant| arrival.saturating_duration_since(asked) <= self.share;
        let (asked, cell, kind) = {
            let mut state = self.lock();
            if let Some((asked, time_ms)) = periodic
                && state.last.is_none_or(|last| last.asked < asked)
            {
                state.last = Some(Drained { asked, time_ms });
            }
            if let Some(last) = state.last.filter(|last| recent(last.asked)) {
                return Ok((last.time_ms, Drain::Shared));
            }
            match &state.pending {
                Some(pending) if recent(pending.asked) => {
                    (pending.asked, pending.drain.clone(), Drain::Shared)
                }
                _ => {
                    let asked = Instant::now();
                    let drain = Arc::new(OnceCell::new());
                    state.pending = Some(Pending {
                        asked,
                        drain: drain.clone(),
                    });
                    (asked, drain, Drain::Own)
                }
            }
        };
        // If the request running the drain goes away, a waiter runs it.
        let time_ms = *cell.get_or_try_init(drain).await?;
        let mut state = self.lock();
        if state.last.is_none_or(|last| last.asked < asked) {
            state.last = Some(Drained { asked, time_ms });
        }
        if state
            .pending
            .as_ref()
            .is_some_and(|pending| Arc::ptr_eq(&pending.drain, &cell))
        {
            state.pending = None;
        }
        Ok((time_ms, kind))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding it.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// Counts drains; each answers a distinct time.
    #[derive(Default)]
    struct Drains(AtomicU64);

    impl Drains {
        async fn run(&self, delay: Duration) -> Result<u64, ()> {
            tokio::time::sleep(delay).await;
            Ok(1000 + self.0.fetch_add(1, Ordering::Relaxed))
        }

        fn count(&self) -> u64 {
            self.0.load(Ordering::Relaxed)
        }
    }

    #[tokio::test]
    async fn requests_together_share_one_drain() {
        let gate = DrainGate::new(Duration::from_millis(500));
        let drains = Drains::default();
        let arrival = Instant::now();
        let slow = Duration::from_millis(50);
        let (a, b, c) = tokio::join!(
            gate.drained(arrival, None, || drains.run(slow)),
            gate.drained(arrival, None, || drains.run(slow)),
            gate.drained(arrival, None, || drains.run(slow)),
        );
        assert_eq!(drains.count(), 1);
        assert_eq!(a, Ok((1000, Drain::Own)));
        assert_eq!(b, Ok((1000, Drain::Shared)));
        assert_eq!(c, Ok((1000, Drain::Shared)));
        // Done, and asked for within `share` of this arrival: reused.
        let d = gate.drained(Instant::now(), None, || drains.run(slow)).await;
        assert_eq!(d, Ok((1000, Drain::Shared)));
        assert_eq!(drains.count(), 1);
    }

    #[tokio::test]
    async fn a_request_after_the_share_window_drains_again() {
        let gate = DrainGate::new(Duration::from_millis(20));
        let drains = Drains::default();
        let first = gate
            .drained(Instant::now(), None, || drains.run(Duration::ZERO))
            .await;
        assert_eq!(first, Ok((1000, Drain::Own)));
        tokio::time::sleep(Duration::from_millis(40)).await;
        let second = gate
            .drained(Instant::now(), None, || drains.run(Duration::ZERO))
            .await;
        assert_eq!(second, Ok((1001, Drain::Own)));
        assert_eq!(drains.count(), 2);
    }

    #[tokio::test]
    async fn with_no_sharing_a_request_never_reuses_an_earlier_drain() {
        let gate = DrainGate::new(Duration::ZERO);
        let drains = Drains::default();
        for expected in 1000..1005 {
            tokio::time::sleep(Duration::from_millis(2)).await;
            let got = gate
                .drained(Instant::now(), None, || drains.run(Duration::ZERO))
                .await;
            assert_eq!(got, Ok((expected, Drain::Own)));
        }
    }

    #[tokio::test]
    async fn a_recent_periodic_drain_serves_and_an_old_one_does_not() {
        let gate = DrainGate::new(Duration::from_millis(100));
        let drains = Drains::default();
        let now = Instant::now();
        let recent = Some((now, 500));
        let got = gate
            .drained(now + Duration::from_millis(50), recent, || {
                drains.run(Duration::ZERO)
            })
            .await;
        assert_eq!(got, Ok((500, Drain::Shared)));
        let got = gate
            .drained(now + Duration::from_millis(150), recent, || {
                drains.run(Duration::ZERO)
            })
            .await;
        assert_eq!(
            got,
            Ok((1000, Drain::Own)),
            "a drain older than `share` does not serve"
        );
        assert_eq!(drains.count(), 1);
    }

    #[tokio::test]
    async fn a_failed_drain_is_retried_by_the_next_request() {
        let gate = DrainGate::new(Duration::from_secs(10));
        let failed: Result<(u64, Drain), &str> = gate
            .drained(Instant::now(), None, || async { Err("stopped") })
            .await;
        assert_eq!(failed, Err("stopped"));
        let drains = Drains::default();
        let next = gate
            .drained(Instant::now(), None, || drains.run(Duration::ZERO))
            .await;
        assert_eq!(next.map(|(ms, _)| ms), Ok(1000));
    }
}
