//! Pushing to a fleet's profile store (Grafana Pyroscope, Parca).
//!
//! A cutter wakes every interval and takes the window of drains since the
//! previous cut (the store's drain-to-drain windows: each sample in exactly
//! one window), asks the store for its profiles (CPU, and off-CPU when it
//! is recorded: each type a backend has a name for; and the [`heap`] of the
//! processes traced while the daemon runs), splits them into series
//! ([`series`]), encodes one request per backend ([`request`]) and hands it
//! to each target's [`sender`], which queues it in a bounded [`spool`] and
//! sends it over [`client`] in the backend's protocol ([`backend`]).
//!
//! [`cutter`] -> (per target) [`sender`] { [`spool`] } -> [`client`] -> backend

mod backend;
mod client;
mod cutter;
pub mod flags;
mod heap;
mod metrics;
pub mod proto;
mod request;
pub mod sender;
pub mod series;
pub mod settings;
mod spool;
mod stats;

use std::{path::PathBuf, sync::Arc};

use tokio::sync::{mpsc, watch};

pub use request::{CommonLabels, encode};
pub use settings::{Backend, PushSettings, Target};
pub use stats::{TargetSnapshot, TargetStats};

use crate::{pipeline::Pipeline, supervise::StageReporter, telemetry::Telemetry};
use cutter::Cutter;
use spool::Spool;

/// Requests handed to a sender and not yet taken in: two windows' worth
/// (a window is up to [`series::MAX_SERIES`] requests per profile type for
/// Pyroscope, handed over in a row), since a sender takes them in at once,
/// even mid-send.
const HANDOFF_REQUESTS: usize = 2 * series::MAX_SERIES * crate::kind::ProfileType::ALL.len();

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

/// The running push: its cutter and senders.
pub struct Pusher {
    stop: watch::Sender<bool>,
    cutter: tokio::sync::oneshot::Receiver<()>,
    /// Each resolves when its sender ended.
    senders: Vec<tokio::sync::oneshot::Receiver<()>>,
}

impl Pusher {
    /// Starts pushing per `settings`; nothing runs without targets. Every
    /// task's end goes to `stages` (stage `push`); the targets' counters
    /// are registered into `telemetry`.
    pub fn start(
        settings: &PushSettings,
        pipeline: Arc<Pipeline>,
        stages: &StageReporter,
        telemetry: &mut Telemetry,
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
            let (tx, rx) = mpsc::channel(HANDOFF_REQUESTS);
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
        metrics::register(telemetry, stats);
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
            stop,
            cutter,
            senders,
        }))
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
