//! The cutter: every interval, the window of drains since the last cut,
//! as one request per backend, handed to every target's sender. Windows
//! follow each other drain to drain, so each sample is in exactly one.

use std::{sync::Arc, time::Duration};

use tokio::sync::{mpsc, watch};

use super::{Backend, CommonLabels, TargetStats, encode, heap::Heap, spool::Queued};
use crate::{
    kind::ProfileType,
    pipeline::Pipeline,
    profile::{Filter, Profile, Window},
    store::{Query, Visible},
};

pub(super) struct Cutter {
    pub pipeline: Arc<Pipeline>,
    pub outlets: Vec<(Backend, mpsc::Sender<Queued>, Arc<TargetStats>)>,
    pub common: CommonLabels,
    pub interval: Duration,
}

impl Cutter {
    pub async fn run(self, mut stopped: watch::Receiver<bool>, _done: tokio::sync::oneshot::Sender<()>) {
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
        let (Some(profiles), Some(heap)) = (self.profiles(window).await, self.heap(window).await) else {
            // The store is gone: the daemon is stopping (or failing, which
            // the supervisor reports).
            return;
        };
        *last_ms = newest.time_ms;
        if profiles.is_empty() && heap.is_none() {
            return;
        }
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
                    let cpu_before = crate::thread_cpu_ns();
                    let request = encode(backend, &profiles, heap.as_ref(), &common);
                    (
                        backend,
                        request,
                        crate::thread_cpu_ns().saturating_sub(cpu_before),
                    )
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
                Ok(requests) => {
                    for (part, request) in requests.iter().enumerate() {
                        let queued = Queued {
                            window,
                            part: u32::try_from(part).unwrap_or(u32::MAX),
                            samples: request.samples,
                            message: request.message.clone(),
                        };
                        // A sender takes windows in even mid-send: full only
                        // if it is gone, or stuck, which the count shows.
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
                            tracing::warn!(
                                target = %stats.name,
                                "push: the sender did not take window {}..{} ms; dropped",
                                window.start_ms,
                                window.end_ms
                            );
                        }
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

impl Cutter {
    /// The window's profile of every type pushed, those with samples; None
    /// when the store is gone.
    async fn profiles(&self, window: Window) -> Option<Vec<Profile>> {
        let mut profiles = Vec::new();
        for profile_type in self.pushed_types() {
            let query = Query {
                window,
                filter: Filter::default(),
                visible: Visible::All,
                profile_type,
            };
            let mut profile = self.pipeline.store().query(query).await.ok()?;
            if !profile.samples.is_empty() {
                // The window asked for, not the one its samples span.
                profile.window = window;
                profiles.push(profile);
            }
        }
        Some(profiles)
    }

    /// The memory of the processes traced while the daemon runs, in
    /// `window` (see `heap.rs`): Some(None) when there is none to push,
    /// None when the store is gone.
    async fn heap(&self, window: Window) -> Option<Option<Heap>> {
        let heap_type = ProfileType::Alloc;
        if !self.named(heap_type) {
            return Some(None);
        }
        let traced = match self.pipeline.traced_continuously().await {
            Ok(traced) => traced,
            Err(err) => {
                tracing::warn!("push: the traced processes' heaps are left out of this window: {err}");
                return Some(None);
            }
        };
        let mut heap: Option<Heap> = None;
        for trace in traced {
            let filter = Filter {
                pids: vec![trace.pid],
                ..Filter::default()
            };
            let query = |window| Query {
                window,
                filter: filter.clone(),
                visible: Visible::All,
                profile_type: heap_type,
            };
            let store = self.pipeline.store();
            let since = Window {
                start_ms: trace.since_ms.max(window.start_ms),
                end_ms: window.end_ms,
            };
            let allocated = store.query(query(since)).await.ok()?;
            let live = Window {
                start_ms: trace.since_ms,
                end_ms: window.end_ms,
            };
            let live = store.query(query(live)).await.ok()?;
            match &mut heap {
                Some(heap) => {
                    heap.allocated.samples.extend(allocated.samples);
                    heap.live.samples.extend(live.samples);
                }
                None => heap = Some(Heap { allocated, live }),
            }
        }
        Some(
            heap.filter(|heap| !(heap.allocated.samples.is_empty() && heap.live.samples.is_empty()))
                .map(|mut heap| {
                    // The window asked for, not the one its samples span.
                    heap.allocated.window = window;
                    heap
                }),
        )
    }

    /// The profile types pushed as windows of the whole machine: those
    /// recorded that a target's backend has a name for (CPU always;
    /// off-CPU with `--off-cpu`). Heaps are pushed per traced process.
    fn pushed_types(&self) -> impl Iterator<Item = ProfileType> + '_ {
        let recorded = self.pipeline.kinds();
        ProfileType::ALL.into_iter().filter(move |&profile_type| {
            !profile_type.describe().push.as_heap
                && profile_type.available(recorded).is_ok()
                && self.named(profile_type)
        })
    }

    /// True when a target's backend has a name for `profile_type`.
    fn named(&self, profile_type: ProfileType) -> bool {
        self.outlets
            .iter()
            .any(|(backend, ..)| backend.profile_name(profile_type).is_some())
    }
}
