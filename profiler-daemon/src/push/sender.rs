//! A target's sender: the one owner of its spool. It queues the windows the
//! cutter hands it and sends them oldest first, one at a time, retrying
//! with backoff while the target is down or slow.

use std::{
    sync::{Arc, atomic::Ordering::Relaxed},
    time::Duration,
};

use tokio::{sync::mpsc, time::Instant};

use super::{
    backend,
    client::{Client, Failure},
    settings::Target,
    spool::{Dropped, Queued, Spool},
    stats::TargetStats,
};

/// Backoff between failed attempts: doubling from the first to the last,
/// each wait drawn in its upper half (jitter, so a fleet that lost its
/// backend together does not return in lockstep).
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const LAST_BACKOFF: Duration = Duration::from_secs(60);

/// After the cutter is gone (the daemon stops), how long the queue may
/// still be sent for.
pub const FLUSH_GRACE: Duration = Duration::from_secs(2);

pub struct Sender {
    pub target: Target,
    pub client: Client,
    pub spool: Spool,
    pub stats: Arc<TargetStats>,
    pub timeout: Duration,
}

impl Sender {
    /// Runs until `windows` closes and the queue is sent, or the flush
    /// grace after that has passed.
    pub async fn run(self, mut windows: mpsc::Receiver<Queued>) {
        let Sender {
            target,
            client,
            spool,
            stats,
            timeout,
        } = self;
        let mut queue = Queue { spool, stats };
        let mut backoff = FIRST_BACKOFF;
        let mut flush_until: Option<Instant> = None;
        queue.publish();
        loop {
            let Some(queued) = queue.spool.take() else {
                if flush_until.is_some() {
                    return;
                }
                match windows.recv().await {
                    Some(queued) => queue.enqueue(queued),
                    None => return,
                }
                continue;
            };
            if flush_until.is_some_and(|until| Instant::now() >= until) {
                queue.spool.put_back(queued);
                queue.give_up_at_exit();
                return;
            }
            let result = {
                let attempt = attempt(&client, &target, &queued, timeout);
                tokio::pin!(attempt);
                loop {
                    // Far away until the daemon stops: then the grace's end.
                    let give_up = flush_until.unwrap_or_else(|| Instant::now() + LAST_BACKOFF);
                    tokio::select! {
                        result = &mut attempt => break Some(result),
                        next = windows.recv(), if flush_until.is_none() => match next {
                            Some(next) => queue.enqueue(next),
                            None => flush_until = Some(Instant::now() + FLUSH_GRACE),
                        },
                        () = tokio::time::sleep_until(give_up), if flush_until.is_some() => break None,
                    }
                }
            };
            let Some(result) = result else {
                // Stopping, and the grace is over: the window stays queued
                // (and on disk, with a spool directory).
                queue.spool.put_back(queued);
                queue.publish();
                queue.give_up_at_exit();
                return;
            };
            match result {
                Ok(()) => {
                    backoff = FIRST_BACKOFF;
                    queue.accepted(&queued);
                }
                Err(failure) if failure.retry => {
                    queue.failed(queued, &failure.reason);
                    if flush_until.is_some() {
                        queue.give_up_at_exit();
                        return;
                    }
                    let wait = jittered(backoff);
                    backoff = (backoff * 2).min(LAST_BACKOFF);
                    if !queue
                        .wait_taking_windows(&mut windows, Instant::now() + wait)
                        .await
                    {
                        queue.give_up_at_exit();
                        return;
                    }
                }
                Err(failure) => queue.refused(&queued, &failure.reason),
            }
            queue.publish();
        }
    }
}

/// The sender's mutable half: the spool and what it tells /metrics.
struct Queue {
    spool: Spool,
    stats: Arc<TargetStats>,
}

impl Queue {
    fn accepted(&mut self, queued: &Queued) {
        let stats = &self.stats;
        stats.accepted.fetch_add(1, Relaxed);
        stats.bytes.fetch_add(queued.message.len() as u64, Relaxed);
        stats.samples.fetch_add(queued.samples, Relaxed);
        stats.last_accepted_ms.store(crate::unix_now_ms(), Relaxed);
        self.spool.done(queued);
    }

    /// A failed attempt: the window goes back to the queue's head.
    fn failed(&mut self, queued: Queued, reason: &str) {
        self.stats.failed.fetch_add(1, Relaxed);
        tracing::warn!(
            target = %self.stats.name,
            "push of window {}..{} ms failed, will retry: {reason}",
            queued.window.start_ms,
            queued.window.end_ms,
        );
        self.spool.put_back(queued);
        self.publish();
    }

    /// A refusal: retrying would be refused again, so the window goes.
    fn refused(&mut self, queued: &Queued, reason: &str) {
        let stats = &self.stats;
        stats.refused.fetch_add(1, Relaxed);
        stats.dropped_refused.fetch_add(1, Relaxed);
        stats.dropped_samples.fetch_add(queued.samples, Relaxed);
        tracing::error!(
            target = %stats.name,
            "window {}..{} ms refused, dropped ({} samples): {reason}",
            queued.window.start_ms,
            queued.window.end_ms,
            queued.samples,
        );
        self.spool.done(queued);
    }

    /// Waits until `until`, taking in the windows that arrive meanwhile;
    /// false if the cutter is gone (the daemon stops).
    async fn wait_taking_windows(&mut self, windows: &mut mpsc::Receiver<Queued>, until: Instant) -> bool {
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(until) => return true,
                next = windows.recv() => match next {
                    Some(next) => self.enqueue(next),
                    None => return false,
                },
            }
        }
    }

    fn enqueue(&mut self, queued: Queued) {
        let dropped = self.spool.push(queued);
        self.count_dropped(&dropped);
        self.publish();
    }

    fn count_dropped(&self, dropped: &Dropped) {
        if dropped.is_empty() {
            return;
        }
        let samples: u64 = dropped.iter().map(|queued| queued.samples).sum();
        self.stats.dropped_full.fetch_add(dropped.len() as u64, Relaxed);
        self.stats.dropped_samples.fetch_add(samples, Relaxed);
        tracing::warn!(
            target = %self.stats.name,
            "push spool full: dropped the oldest {} window(s), {samples} samples",
            dropped.len()
        );
    }

    /// The queue's state, for /metrics.
    fn publish(&self) {
        let stats = &self.stats;
        stats.queued_windows.store(self.spool.len() as u64, Relaxed);
        stats.queued_bytes.store(self.spool.bytes() as u64, Relaxed);
        let oldest = self.spool.oldest().map_or(0, |queued| queued.window.start_ms);
        stats.oldest_queued_ms.store(oldest, Relaxed);
    }

    fn give_up_at_exit(&self) {
        if !self.spool.is_empty() {
            tracing::warn!(
                target = %self.stats.name,
                "stopping with {} window(s) not pushed{}",
                self.spool.len(),
                if self.spool.on_disk() { "; they stay in the spool directory for the next start" } else { "" }
            );
        }
    }
}

async fn attempt(
    client: &Client,
    target: &Target,
    queued: &Queued,
    timeout: Duration,
) -> Result<(), Failure> {
    let (headers, body) = backend::request(target, &queued.message, timeout);
    let method = backend::method(target.backend);
    match tokio::time::timeout(timeout, client.post(method, headers, body)).await {
        Ok(answer) => backend::outcome(target.backend, &answer?),
        Err(_) => Err(Failure::retry(format!("no answer within {timeout:?}"))),
    }
}

/// A wait in [backoff/2, backoff], from the clock's low bits: no crate
/// needed for this little chance.
fn jittered(backoff: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.subsec_nanos());
    let half = backoff / 2;
    half + half.mul_f64(f64::from(nanos % 1000) / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_the_upper_half() {
        for _ in 0..100 {
            let wait = jittered(Duration::from_secs(8));
            assert!(
                (Duration::from_secs(4)..=Duration::from_secs(8)).contains(&wait),
                "{wait:?}"
            );
        }
    }
}
