//! Which computations run: at most `concurrency` at once, at most `queue`
//! more waiting for their turn (the rest refused at once), and together
//! within a memory budget reserved before each one encodes.

use std::{
    sync::atomic::{AtomicBool, AtomicUsize, Ordering},
    time::Duration,
};

use tokio::sync::{Semaphore, SemaphorePermit};

/// The budget is counted in KiB: a semaphore counts permits in u32.
const UNIT: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmissionLimits {
    pub concurrency: usize,
    pub queue: usize,
    pub memory_bytes: usize,
    /// Longest wait for a turn or for memory.
    pub max_wait: Duration,
}

/// Why a computation was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `queue` computations are already waiting.
    QueueFull,
    /// Waited `max_wait` without getting a turn or the memory.
    Timeout,
    /// Needs more memory than the whole budget.
    TooLarge { needs: usize },
    /// Needed more memory while holding some, and another computation was
    /// already waiting so: waiting too could deadlock the two.
    Contended,
}

impl Refusal {
    pub const REASONS: [&'static str; 4] = ["queue_full", "timeout", "too_large", "contended"];

    /// Index into [`Self::REASONS`] (the metrics label).
    pub fn index(self) -> usize {
        match self {
            Refusal::QueueFull => 0,
            Refusal::Timeout => 1,
            Refusal::TooLarge { .. } => 2,
            Refusal::Contended => 3,
        }
    }
}

pub struct Admission {
    limits: AdmissionLimits,
    turns: Semaphore,
    memory: Semaphore,
    memory_units: usize,
    waiting: AtomicUsize,
    /// A computation waits for more memory while holding some.
    holding_waiter: AtomicBool,
}

/// A computation's turn; ends when dropped.
pub struct Turn<'a> {
    _permit: SemaphorePermit<'a>,
}

/// Memory reserved for one computation; given back when dropped.
pub struct Reserved<'a> {
    _permit: Option<SemaphorePermit<'a>>,
}

/// Counts a waiter for as long as it waits.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Lowers the flag when the wait ends, however it ends.
struct ClearOnDrop<'a>(&'a AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Admission {
    pub fn new(limits: AdmissionLimits) -> Self {
        let memory_units = (limits.memory_bytes / UNIT).clamp(1, Semaphore::MAX_PERMITS);
        Self {
            limits,
            turns: Semaphore::new(limits.concurrency.clamp(1, Semaphore::MAX_PERMITS)),
            memory: Semaphore::new(memory_units),
            memory_units,
            waiting: AtomicUsize::new(0),
            holding_waiter: AtomicBool::new(false),
        }
    }

    /// A turn at once if one is free, else a place in the queue and the
    /// turn when it comes (FIFO); refused if the queue is full or the turn
    /// does not come within `max_wait`.
    pub async fn turn(&self) -> Result<Turn<'_>, Refusal> {
        if let Ok(permit) = self.turns.try_acquire() {
            return Ok(Turn { _permit: permit });
        }
        let queue = self.limits.queue;
        self.waiting
            .try_update(Ordering::Relaxed, Ordering::Relaxed, |waiting| {
                (waiting < queue).then_some(waiting + 1)
            })
            .map_err(|_| Refusal::QueueFull)?;
        let _waiting = Waiting(&self.waiting);
        match tokio::time::timeout(self.limits.max_wait, self.turns.acquire()).await {
            Ok(Ok(permit)) => Ok(Turn { _permit: permit }),
            // The semaphore is never closed; treat it as a wait that ended.
            Ok(Err(_)) | Err(_) => Err(Refusal::Timeout),
        }
    }

    /// Reserves `bytes` of the budget, waiting (at most `max_wait`) for
    /// computations that hold it to finish.
    pub async fn reserve(&self, bytes: usize) -> Result<Reserved<'_>, Refusal> {
        let units = bytes.div_ceil(UNIT);
        if units > self.memory_units {
            return Err(Refusal::TooLarge { needs: bytes });
        }
        if units == 0 {
            return Ok(Reserved { _permit: None });
        }
        // Fits in u32: at most memory_units, itself at most MAX_PERMITS.
        let units = u32::try_from(units).map_err(|_| Refusal::TooLarge { needs: bytes })?;
        match tokio::time::timeout(self.limits.max_wait, self.memory.acquire_many(units)).await {
            Ok(Ok(permit)) => Ok(Reserved {
                _permit: Some(permit),
            }),
            Ok(Err(_)) | Err(_) => Err(Refusal::Timeout),
        }
    }

    /// Reserves `bytes` more for a computation that already holds a
    /// reservation. Two holders waiting for each other's memory would stall
    /// until both time out, so at most one holder waits at a time: any
    /// other is refused at once, and the memory it gives back lets the one
    /// waiting (and those encoding) finish.
    pub async fn reserve_more(&self, bytes: usize) -> Result<Reserved<'_>, Refusal> {
        if let Ok(units) = u32::try_from(bytes.div_ceil(UNIT))
            && units as usize <= self.memory_units
        {
            if units == 0 {
                return Ok(Reserved { _permit: None });
            }
            if let Ok(permit) = self.memory.try_acquire_many(units) {
                return Ok(Reserved {
                    _permit: Some(permit),
                });
            }
        }
        if self.holding_waiter.swap(true, Ordering::AcqRel) {
            return Err(Refusal::Contended);
        }
        let _clear = ClearOnDrop(&self.holding_waiter);
        self.reserve(bytes).await
    }

    pub fn limits(&self) -> AdmissionLimits {
        self.limits
    }

    /// Computations running now.
    pub fn running(&self) -> usize {
        self.limits.concurrency - self.turns.available_permits()
    }

    /// Computations waiting for a turn now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Bytes of the budget reserved now.
    pub fn reserved_bytes(&self) -> usize {
        (self.memory_units - self.memory.available_permits()) * UNIT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(concurrency: usize, queue: usize, memory_bytes: usize) -> Admission {
        Admission::new(AdmissionLimits {
            concurrency,
            queue,
            memory_bytes,
            max_wait: Duration::from_secs(5),
        })
    }

    #[tokio::test]
    async fn a_queued_request_gets_the_next_turn_and_the_next_is_refused() {
        let admission: &'static Admission = Box::leak(Box::new(admission(1, 1, 1 << 20)));
        let running = admission.turn().await.expect("a free turn");
        let queued = tokio::spawn(async move { admission.turn().await.map(drop) });
        // Bounded: the spawned request takes its place in the queue.
        for _ in 0..1000 {
            if admission.waiting() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(admission.waiting(), 1, "the second request should be queued");
        assert_eq!(admission.turn().await.err(), Some(Refusal::QueueFull));
        drop(running);
        let turn = tokio::time::timeout(Duration::from_secs(5), queued)
            .await
            .expect("the queued request gets its turn within 5 s")
            .expect("joins");
        assert_eq!(turn, Ok(()));
        assert_eq!(admission.waiting(), 0);
        assert_eq!(admission.running(), 0);
    }

    #[tokio::test]
    async fn a_wait_past_the_limit_is_refused() {
        let admission = Admission::new(AdmissionLimits {
            concurrency: 1,
            queue: 4,
            memory_bytes: 1 << 20,
            max_wait: Duration::from_millis(20),
        });
        let _running = admission.turn().await.expect("a free turn");
        assert_eq!(admission.turn().await.err(), Some(Refusal::Timeout));
        assert_eq!(admission.waiting(), 0, "a refused waiter leaves the queue");
    }

    #[tokio::test]
    async fn memory_is_reserved_within_the_budget() {
        let admission = Admission::new(AdmissionLimits {
            concurrency: 4,
            queue: 4,
            memory_bytes: 1 << 20,
            max_wait: Duration::from_millis(20),
        });
        assert!(matches!(
            admission.reserve((1 << 20) + 1).await.err(),
            Some(Refusal::TooLarge { .. })
        ));
        let most = admission.reserve(700 << 10).await.expect("fits");
        assert_eq!(admission.reserved_bytes(), 700 << 10);
        // 700 + 400 KiB > 1 MiB: waits, then times out.
        assert_eq!(admission.reserve(400 << 10).await.err(), Some(Refusal::Timeout));
        let _rest = admission.reserve(300 << 10).await.expect("fits beside the first");
        drop(most);
        assert_eq!(admission.reserved_bytes(), 300 << 10);
        let _again = admission.reserve(700 << 10).await.expect("fits once given back");
    }

    #[tokio::test]
    async fn two_holders_never_wait_for_each_others_memory() {
        let admission = Admission::new(AdmissionLimits {
            concurrency: 2,
            queue: 2,
            memory_bytes: 1 << 20,
            max_wait: Duration::from_secs(5),
        });
        let first = admission.reserve(400 << 10).await.expect("fits");
        let second = admission.reserve(400 << 10).await.expect("fits");
        // Both now want 400 KiB more: the first waits, the second is
        // refused at once and gives its memory back, so the first goes on.
        let started = std::time::Instant::now();
        let (waited, refused) = tokio::join!(admission.reserve_more(400 << 10), async {
            tokio::task::yield_now().await;
            let refused = admission.reserve_more(400 << 10).await.err();
            drop(second);
            refused
        });
        assert_eq!(
            refused,
            Some(Refusal::Contended),
            "the second holder should be refused"
        );
        assert!(
            waited.is_ok(),
            "the first holder should get its memory once the second gave it back"
        );
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "no wait should last until max_wait, took {:?}",
            started.elapsed()
        );
        drop(waited);
        drop(first);
        assert_eq!(admission.reserved_bytes(), 0);
        // Memory free at once needs no wait, whoever else waits.
        let _a = admission
            .reserve_more(100 << 10)
            .await
            .expect("free memory is given at once");
    }
}
