//! Pushing to a fleet's profile store (Grafana Pyroscope, Parca).
//!
//! A cutter wakes every interval and takes the window of drains since the
//! previous cut (the store's drain-to-drain windows: each sample in exactly
//! one window), asks the store for its CPU profile, splits it into series
//! ([`series`]), encodes one request per backend ([`request`]) and hands it
//! to each target's [`sender`], which queues it in a bounded [`spool`] and
//! sends it over [`client`] in the backend's protocol ([`backend`]).
//!
//! cutter -> (per target) sender { spool } -> client -> backend

mod backend;
mod client;
pub mod flags;
pub mod proto;
mod request;
pub mod sender;
pub mod series;
pub mod settings;
mod spool;
mod stats;

use std::{path::PathBuf, sync::Arc, time::Duration};

use tokio::sync::{mpsc, watch};

pub use request::{CommonLabels, encode};
pub use settings::{Backend, PushSettings, Target};
pub use stats::{TargetSnapshot, TargetStats};

use crate::{
    kind::ProfileType,
    pipeline::Pipeline,
    store::{Filter, Query, Visible, Window},
    supervise::StageReporter,
};
use spool::{Queued, Spool};

/// Windows handed to a sender and not yet taken in: a few, since a sender
/// takes each one at once (even mid-send).
const HANDOFF_WINDOWS: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("push target {target}")]
    Client {
        target: String,
        #[source]
        source: client::ClientError,
    },
    #[error("push spool directory {path}")]
    Spool {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading {path} for push target {target}")]
    Credentials {
        target: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The running push: its cutter and senders, and their counters.
pub struct Pusher {
    stats: Vec<Arc<TargetStats>>,
    stop: watch::Sender<bool>,
    cutter: tokio::sync::oneshot::Receiver<()>,
    /// Each resolves when its sender ended.
    senders: Vec<tokio::sync::oneshot::Receiver<()>>,
}

impl Pusher {
    /// Starts pushing per `settings`; nothing runs without targets. Every
    /// task's end goes to `stages` (stage `push`).
    pub fn start(
        settings: &PushSettings,
        pipeline: Arc<Pipeline>,
        stages: &StageReporter,
    ) -> Result<Option<Self>, PushError> {
        if settings.targets.is_empty() {
            return Ok(None);
        }
        let mut outlets = Vec::new();
        let mut stats = Vec::new();
        let mut senders = Vec::new();
        for (index, target) in settings.targets.iter().enumerate() {
            check_credentials(target)?;
            let client = client::Client::new(target, backend::version(target.backend)).map_err(|source| {
                PushError::Client {
                    target: target.name(),
                    source,
                }
            })?;
            let dir = settings
                .spool_dir
                .as_ref()
                .map(|dir| dir.join(spool_dir_name(index, target)));
            let (spool, dropped) =
                Spool::open(settings.spool_bytes, dir.clone()).map_err(|source| PushError::Spool {
                    path: dir.unwrap_or_default(),
                    source,
                })?;
            let target_stats = Arc::new(TargetStats::new(target.name()));
            if !dropped.is_empty() {
                tracing::warn!(target = %target.name(), "the spool holds more than its bound: dropped the oldest {} window(s)", dropped.len());
                target_stats
                    .dropped_full
                    .fetch_add(dropped.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
            if !spool.is_empty() {
                tracing::info!(target = %target.name(), "{} window(s) left from the last run queued first", spool.len());
            }
            let (tx, rx) = mpsc::channel(HANDOFF_WINDOWS);
            let sender = sender::Sender {
                target: target.clone(),
                client,
                spool,
                stats: target_stats.clone(),
                timeout: settings.timeout,
            };
            let (done, finished) = tokio::sync::oneshot::channel::<()>();
            stages.watch_task(
                "push",
                tokio::spawn(async move {
                    let _done = done;
                    sender.run(rx).await;
                }),
            );
            senders.push(finished);
            outlets.push((target.backend, tx, target_stats.clone()));
            stats.push(target_stats);
            tracing::info!("pushing to {} every {:?}", target.name(), settings.interval);
        }
        let (stop, stopped) = watch::channel(false);
        let cutter_task = Cutter {
            pipeline,
            outlets,
            common: CommonLabels {
                hostname: settings.hostname.clone(),
                extra: settings.labels.clone(),
            },
            interval: settings.interval,
        };
        // The supervisor holds the task; its end (a return or a panic, both
        // dropping `done`) is what stop waits for.
        let (done, cutter) = tokio::sync::oneshot::channel();
        stages.watch_task("push", tokio::spawn(cutter_task.run(stopped, done)));
        Ok(Some(Self {
            stats,
            stop,
            cutter,
            senders,
        }))
    }

    pub fn stats(&self) -> &[Arc<TargetStats>] {
        &self.stats
    }

    /// Cuts a last window (after a last drain) and gives the senders
    /// [`sender::FLUSH_GRACE`] to send what is queued; what is left stays in
    /// the spool directory, if there is one.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.cutter.await;
        for sender in self.senders {
            let _ = sender.await;
        }
    }
}

/// A credentials file that cannot be read now is a configuration error,
/// said at start rather than at the first push.
fn check_credentials(target: &Target) -> Result<(), PushError> {
    let file = match &target.auth {
        settings::Auth::None => return Ok(()),
        settings::Auth::Basic { password_file, .. } => password_file,
        settings::Auth::Bearer { token_file } => token_file,
    };
    std::fs::read(file)
        .map(drop)
        .map_err(|source| PushError::Credentials {
            target: target.name(),
            path: file.clone(),
            source,
        })
}

/// Each target's own directory under the spool directory: its order in the
/// settings and its host, so that a renamed target does not inherit
/// another's windows by accident and the names stay readable.
fn spool_dir_name(index: usize, target: &Target) -> String {
    let host: String = target
        .endpoint
        .host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!(
        "{index}-{}-{host}-{}",
        target.backend.name(),
        target.endpoint.port
    )
}

struct Cutter {
    pipeline: Arc<Pipeline>,
    outlets: Vec<(Backend, mpsc::Sender<Queued>, Arc<TargetStats>)>,
    common: CommonLabels,
    interval: Duration,
}

impl Cutter {
    async fn run(self, mut stopped: watch::Receiver<bool>, _done: tokio::sync::oneshot::Sender<()>) {
        // The first window starts where sampling did.
        let mut last_ms = self.pipeline.started_ms().saturating_sub(1);
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + self.interval, self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                // Sent once, at stop (or the sender is gone: stopping too).
                _ = stopped.changed() => {
                    // What was sampled since the last drain goes too.
                    if let Err(err) = self.pipeline.drain_now().await {
                        tracing::warn!("push: no last drain at stop: {err}");
                    }
                    self.cut(&mut last_ms).await;
                    return;
                }
            }
            self.cut(&mut last_ms).await;
        }
    }

    /// Cuts the window of drains after `last_ms` up to the newest stored,
    /// and hands it to every target.
    async fn cut(&self, last_ms: &mut u64) {
        let Some(newest) = self.pipeline.last_stored() else {
            return;
        };
        if newest.time_ms <= *last_ms {
            return;
        }
        let window = Window::between_drains(*last_ms, newest.time_ms);
        let query = Query {
            window,
            filter: Filter::default(),
            visible: Visible::All,
            profile_type: ProfileType::Cpu,
        };
        let Ok(mut profile) = self.pipeline.store().query(query).await else {
            // The store is gone: the daemon is stopping (or failing, which
            // the supervisor reports).
            return;
        };
        *last_ms = newest.time_ms;
        if profile.samples.is_empty() {
            return;
        }
        profile.window = window;
        let mut backends: Vec<Backend> = Vec::new();
        for (backend, ..) in &self.outlets {
            if !backends.contains(backend) {
                backends.push(*backend);
            }
        }
        let common = self.common.clone();
        // Encoding is CPU work (pprof building, gzip): off the async threads.
        let encoded = tokio::task::spawn_blocking(move || {
            backends
                .into_iter()
                .map(|backend| {
                    let cpu_before = thread_cpu_ns();
                    let request = encode(backend, &profile, &common);
                    (backend, request, thread_cpu_ns().saturating_sub(cpu_before))
                })
                .collect::<Vec<_>>()
        })
        .await;
        let encoded = match encoded {
            Ok(encoded) => encoded,
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(_) => return,
        };
        for (backend, tx, stats) in &self.outlets {
            let Some((_, result, cpu_ns)) = encoded.iter().find(|(encoded_for, ..)| encoded_for == backend)
            else {
                continue;
            };
            stats
                .encode_cpu_ns
                .fetch_add(*cpu_ns, std::sync::atomic::Ordering::Relaxed);
            match result {
                Ok(request) => {
                    let queued = Queued {
                        window,
                        samples: request.samples,
                        message: request.message.clone(),
                    };
                    // A sender takes windows in even mid-send: full only if
                    // it is gone, or stuck, which the count shows.
                    if let Err(err) = tx.try_send(queued) {
                        let queued = match err {
                            mpsc::error::TrySendError::Full(queued)
                            | mpsc::error::TrySendError::Closed(queued) => queued,
                        };
                        stats
                            .dropped_full
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        stats
                            .dropped_samples
                            .fetch_add(queued.samples, std::sync::atomic::Ordering::Relaxed);
                        tracing::warn!(target = %stats.name, "push: the sender did not take window {}..{} ms; dropped", window.start_ms, window.end_ms);
                    }
                }
                Err(err) => {
                    tracing::error!(
                        "push: encoding window {}..{} ms: {err}",
                        window.start_ms,
                        window.end_ms
                    );
                }
            }
        }
    }
}

/// CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID), in ns: what
/// encoding a window costs, whatever else the machine is doing.
fn thread_cpu_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `now` is.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    if rc != 0 {
        return 0;
    }
    u64::try_from(now.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(now.tv_nsec).unwrap_or(0)
}
