//! One owner for every stage: a stage that ends while the daemon is not
//! stopping (it returned, it panicked, or it stopped making progress) is a
//! failure of the whole daemon, which then exits non-zero so that systemd's
//! `Restart=on-failure` brings it back. Without this, a dead symbolize thread
//! left a process that answered /metrics but never sampled again.

use std::{
    any::Any,
    fmt,
    panic::{AssertUnwindSafe, catch_unwind},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tokio::sync::mpsc;

/// Exit status of a daemon whose stage ended unexpectedly (EX_SOFTWARE):
/// the unit restarts it.
pub const EXIT_STAGE_FAILED: u8 = 70;

/// Why a stage ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// It returned although nobody asked it to stop.
    Returned,
    /// It panicked, with this message.
    Panicked(String),
    /// It returned this error.
    Failed(String),
    /// It made no progress for this long.
    Stalled(Duration),
}

/// A stage that ended unexpectedly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageEnd {
    pub stage: &'static str,
    pub reason: EndReason,
}

impl StageEnd {
    /// The errno-style code systemd records (`ERRNO=`): ETIMEDOUT for a
    /// stage that stalled, ENOTRECOVERABLE for one that is gone.
    pub fn errno(&self) -> u32 {
        match self.reason {
            EndReason::Stalled(_) => libc::ETIMEDOUT as u32,
            EndReason::Returned | EndReason::Panicked(_) | EndReason::Failed(_) => {
                libc::ENOTRECOVERABLE as u32
            }
        }
    }
}

impl fmt::Display for StageEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stage = self.stage;
        match &self.reason {
            EndReason::Returned => write!(f, "the {stage} stage ended unexpectedly"),
            EndReason::Panicked(message) => write!(f, "the {stage} stage panicked: {message}"),
            EndReason::Failed(error) => write!(f, "the {stage} stage failed: {error}"),
            EndReason::Stalled(for_) => {
                write!(f, "the {stage} stage made no progress for {}s", for_.as_secs())
            }
        }
    }
}

/// Receives the stages' ends; the daemon waits on [`Supervisor::failure`].
pub struct Supervisor {
    reporter: StageReporter,
    ends: mpsc::UnboundedReceiver<StageEnd>,
}

/// Given to whoever starts a stage: runs it so that its end is reported.
#[derive(Clone)]
pub struct StageReporter {
    tx: mpsc::UnboundedSender<StageEnd>,
    /// The cancellation token: set once the daemon is stopping, after which
    /// stages are expected to end.
    stopping: Arc<AtomicBool>,
}

impl Default for Supervisor {
    fn default() -> Self {
        Self::new()
    }
}

impl Supervisor {
    pub fn new() -> Self {
        let (tx, ends) = mpsc::unbounded_channel();
        Self {
            reporter: StageReporter {
                tx,
                stopping: Arc::new(AtomicBool::new(false)),
            },
            ends,
        }
    }

    pub fn reporter(&self) -> StageReporter {
        self.reporter.clone()
    }

    /// From now on stages are expected to end: their ends are not failures.
    pub fn stop(&self) {
        self.reporter.stopping.store(true, Ordering::SeqCst);
    }

    /// Resolves with the first stage that ends unexpectedly, or that goes
    /// `stall_limit` without progress by `last_progress` (checked every
    /// quarter of the limit, at least every second; None means not yet,
    /// counted from now).
    pub async fn failure(
        &mut self,
        last_progress: impl Fn() -> Option<Instant>,
        progress_stage: &'static str,
        stall_limit: Duration,
    ) -> StageEnd {
        let started = Instant::now();
        // A quarter of the limit: a stall is seen within 1.25 limits, and
        // an idle daemon is not woken every second to look.
        let mut tick = tokio::time::interval((stall_limit / 4).max(Duration::from_secs(1)));
        loop {
            tokio::select! {
                end = self.ends.recv() => {
                    // The supervisor holds a sender itself: never None.
                    if let Some(end) = end {
                        return self.cause(end).await;
                    }
                }
                _ = tick.tick() => {
                    let since = last_progress().unwrap_or(started).max(started);
                    let idle = since.elapsed();
                    if idle >= stall_limit && !self.reporter.stopping() {
                        return StageEnd { stage: progress_stage, reason: EndReason::Stalled(idle) };
                    }
                }
            }
        }
    }
}

impl Supervisor {
    /// The cause among the ends that come within [`SETTLE`] of `first`: a
    /// panicking stage drops its channels while it unwinds, so its
    /// neighbours may report returning before it reports the panic.
    async fn cause(&mut self, first: StageEnd) -> StageEnd {
        let mut cause = first;
        let deadline = tokio::time::Instant::now() + SETTLE;
        while cause.reason == EndReason::Returned {
            match tokio::time::timeout_at(deadline, self.ends.recv()).await {
                Ok(Some(end)) if end.reason != EndReason::Returned => cause = end,
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        cause
    }
}

/// How long after a stage returned the supervisor waits for the panic that
/// may have caused it.
const SETTLE: Duration = Duration::from_millis(300);

impl StageReporter {
    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Reports `stage`'s end unless the daemon is stopping.
    pub fn ended(&self, stage: &'static str, reason: EndReason) {
        if self.stopping() {
            return;
        }
        tracing::error!(
            stage,
            "{}",
            StageEnd {
                stage,
                reason: reason.clone()
            }
        );
        let _ = self.tx.send(StageEnd { stage, reason });
    }

    /// Starts `body` on a thread named `stage`; its return or panic is reported.
    pub fn spawn_thread(
        &self,
        stage: &'static str,
        body: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<JoinHandle<()>> {
        let reporter = self.clone();
        std::thread::Builder::new().name(stage.to_owned()).spawn(move || {
            // Unwind safety: after a panic the stage's state is dropped
            // unused and the daemon exits.
            let reason = match catch_unwind(AssertUnwindSafe(body)) {
                Ok(()) => EndReason::Returned,
                Err(payload) => EndReason::Panicked(panic_message(payload.as_ref())),
            };
            reporter.ended(stage, reason);
        })
    }

    /// Reports the end of a tokio task.
    pub fn watch_task<T: Send + 'static>(&self, stage: &'static str, task: tokio::task::JoinHandle<T>) {
        let reporter = self.clone();
        tokio::spawn(async move {
            let reason = match task.await {
                Ok(_) => EndReason::Returned,
                Err(err) if err.is_panic() => EndReason::Panicked(panic_message(err.into_panic().as_ref())),
                // Cancelled: only the runtime shutting down does that.
                Err(_) => return,
            };
            reporter.ended(stage, reason);
        });
    }
}

/// The text a panic was raised with (`panic!("...")` gives a &str or a String).
fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a panic without a message)".to_owned())
}

/// Tells systemd why the daemon is about to exit (`STATUS=`, `ERRNO=`);
/// without NOTIFY_SOCKET this does nothing.
pub fn notify_failure(status: &str, errno: u32) {
    let states = [
        sd_notify::NotifyState::Status(status),
        sd_notify::NotifyState::Errno(errno),
    ];
    if let Err(err) = sd_notify::notify(&states) {
        tracing::warn!("telling systemd why we exit failed: {err}");
    }
}

/// A fault a test asked for: the stage that panics, and from when.
static FAULT: std::sync::OnceLock<(String, Instant)> = std::sync::OnceLock::new();

/// Makes `stage` panic at its first fault point `after` from now: for the
/// test binary that checks the supervision (profiler-daemon/examples/profilerd_faulty.rs
/// calls it from its environment). The shipped `profilerd` never calls it,
/// and reads no variable that could.
pub fn inject_fault(stage: &str, after: Duration) {
    let _ = FAULT.set((stage.to_owned(), Instant::now() + after));
}

/// Where a stage may be made to fail (see [`inject_fault`]): one load of an
/// unset cell in every build that is not a test's.
pub fn fault_point(stage: &str) {
    if let Some((target, at)) = FAULT.get()
        && target == stage
        && Instant::now() >= *at
    {
        panic!("injected fault in the {stage} stage");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_thread_is_reported_with_its_message() {
        let mut supervisor = Supervisor::new();
        let thread = supervisor
            .reporter()
            .spawn_thread("test-stage", || panic!("boom {}", 42))
            .expect("a thread");
        let _ = thread.join();
        let end = supervisor
            .failure(|| Some(Instant::now()), "drain", Duration::from_secs(60))
            .await;
        assert_eq!(end.stage, "test-stage");
        assert_eq!(end.reason, EndReason::Panicked("boom 42".to_owned()));
    }

    #[tokio::test]
    async fn a_panic_reported_just_after_a_return_is_the_cause() {
        let mut supervisor = Supervisor::new();
        let reporter = supervisor.reporter();
        reporter.ended("watch-procs", EndReason::Returned);
        reporter.ended("symbolize", EndReason::Panicked("boom".to_owned()));
        let end = supervisor
            .failure(|| Some(Instant::now()), "drain", Duration::from_secs(60))
            .await;
        assert_eq!(end.stage, "symbolize");
    }

    #[tokio::test]
    async fn ends_after_stop_are_not_failures() {
        let mut supervisor = Supervisor::new();
        supervisor.stop();
        let thread = supervisor.reporter().spawn_thread("t", || ()).expect("a thread");
        let _ = thread.join();
        let waited = tokio::time::timeout(
            Duration::from_millis(300),
            supervisor.failure(|| Some(Instant::now()), "drain", Duration::from_secs(60)),
        )
        .await;
        assert!(waited.is_err(), "an end after stop() was reported: {waited:?}");
    }

    #[tokio::test]
    async fn no_progress_for_the_limit_is_a_stall() {
        let mut supervisor = Supervisor::new();
        let end = supervisor
            .failure(|| None, "drain", Duration::from_millis(1500))
            .await;
        assert_eq!(end.stage, "drain");
        assert!(matches!(end.reason, EndReason::Stalled(idle) if idle >= Duration::from_millis(1500)));
    }
}
