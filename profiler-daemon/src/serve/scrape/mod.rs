//! Scrapes that share work, within bounds.
//!
//! - A scrape is answered from a drain asked for at most `share` before it
//!   arrived ([`gate`]), so scrapes arriving together see the same drain.
//! - Scrapes with the same window, filters, profile type, viewer scope and format
//!   ([`key::ShareKey`]) get one answer: the first computes it, the others
//!   wait for it, later ones find it kept ([`answers`]).
//! - A computation (a store query, then encoding on the blocking pool) takes
//!   one of `concurrency` turns, waiting in a queue of `queue` at most, and
//!   reserves its estimated memory from a budget first ([`admission`]);
//!   past those it is refused: 503, `Retry-After`, one line of text.

pub mod admission;
mod answers;
mod gate;
pub mod key;
mod render;

use std::{
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use axum::{
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};

use self::{
    admission::{Admission, AdmissionLimits, Refusal},
    answers::{Answers, Failure, Found},
    gate::{Drain, DrainGate},
    key::ShareKey,
};
pub use self::{answers::Answer, key::Format};
use super::HttpError;
use crate::{
    pipeline::Pipeline,
    store::{Query, StoreHandle},
};

/// How long a request waits for the samples taken up to its arrival. Past
/// it (the symbolizer busy with, say, a huge binary's debug info) it answers
/// with what the store already holds rather than stall.
const DRAIN_WAIT: Duration = Duration::from_secs(2);
/// Longest wait in the queue, or for memory, before a 503.
const MAX_WAIT: Duration = Duration::from_secs(10);
/// A busy daemon's advice: about the time a computation takes, and no
/// longer than a drain serves requests (`scrape_share_ms` is at most 1 s).
const RETRY_AFTER_SECONDS: u64 = 1;
/// Share of the memory budget that keeps finished answers for later requests.
const CACHE_SHARE: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScrapeLimits {
    /// Computations at once.
    pub concurrency: usize,
    /// Computations waiting for a turn, at most.
    pub queue: usize,
    /// Memory for computations and kept answers, bytes.
    pub memory_bytes: usize,
    /// How old a drain may be (asked for before a request arrived) and
    /// still serve it.
    pub share: Duration,
}

impl Default for ScrapeLimits {
    fn default() -> Self {
        Self {
            concurrency: 2,
            queue: 16,
            memory_bytes: 32 << 20,
            share: Duration::from_millis(250),
        }
    }
}

/// Counters for `/metrics`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ScrapeStats {
    /// Answers computed, joined while in flight, found kept.
    pub computed: u64,
    pub joined: u64,
    pub cached: u64,
    /// By [`Refusal::REASONS`].
    pub refused: [u64; Refusal::REASONS.len()],
    pub drains_own: u64,
    pub drains_shared: u64,
    pub running: usize,
    pub waiting: usize,
    pub reserved_bytes: usize,
    pub cache_bytes: usize,
    pub limits: Option<ScrapeLimits>,
}

#[derive(Default)]
struct Counts {
    computed: AtomicU64,
    joined: AtomicU64,
    cached: AtomicU64,
    refused: [AtomicU64; Refusal::REASONS.len()],
    drains_own: AtomicU64,
    drains_shared: AtomicU64,
}

pub struct Scrapes {
    limits: ScrapeLimits,
    gate: DrainGate,
    answers: Answers,
    admission: Admission,
    counts: Counts,
}

impl Scrapes {
    pub fn new(limits: ScrapeLimits) -> Self {
        let cache = limits.memory_bytes / CACHE_SHARE;
        Self {
            limits,
            gate: DrainGate::new(limits.share),
            answers: Answers::new(cache),
            admission: Admission::new(AdmissionLimits {
                concurrency: limits.concurrency,
                queue: limits.queue,
                memory_bytes: limits.memory_bytes - cache,
                max_wait: MAX_WAIT,
            }),
            counts: Counts::default(),
        }
    }

    /// The time of a drain that serves a request arriving now (see [`gate`]).
    pub async fn drained(&self, pipeline: &Pipeline) -> Result<u64, HttpError> {
        let periodic = pipeline
            .last_stored()
            .map(|stored| (stored.began, stored.time_ms));
        let (time_ms, drain) = self
            .gate
            .drained(Instant::now(), periodic, || drain(pipeline))
            .await?;
        let count = match drain {
            Drain::Own => &self.counts.drains_own,
            Drain::Shared => &self.counts.drains_shared,
        };
        count.fetch_add(1, Ordering::Relaxed);
        Ok(time_ms)
    }

    /// A drain of the request's own, after any shared one: for the end of
    /// a window that must not be empty.
    pub async fn drained_after(&self, pipeline: &Pipeline, after_ms: u64) -> Result<u64, HttpError> {
        let time_ms = self.drained(pipeline).await?;
        if time_ms > after_ms {
            return Ok(time_ms);
        }
        self.counts.drains_own.fetch_add(1, Ordering::Relaxed);
        drain(pipeline).await
    }

    /// The answer for `key`: computed once for every request that asks for
    /// it while it is computed or kept.
    pub async fn answer(&self, store: &StoreHandle, key: ShareKey) -> Result<Answer, HttpError> {
        let (flight, found) = self.answers.flight(&key);
        let computed = AtomicBool::new(false);
        let result = flight
            .get_or_init(|| {
                computed.store(true, Ordering::Relaxed);
                self.compute(store, &key)
            })
            .await
            .clone();
        let computed = computed.load(Ordering::Relaxed);
        if computed {
            self.answers.settle(&key, &flight);
        }
        let answer = match result {
            Ok(answer) => answer,
            Err((error, refusal)) => {
                if let Some(refusal) = refusal {
                    self.counts.refused[refusal.index()].fetch_add(1, Ordering::Relaxed);
                }
                return Err(error);
            }
        };
        let count = match (computed, found) {
            (true, _) => &self.counts.computed,
            (false, Found::Done) => &self.counts.cached,
            (false, Found::New | Found::InFlight) => &self.counts.joined,
        };
        count.fetch_add(1, Ordering::Relaxed);
        Ok(answer)
    }

    async fn compute(&self, store: &StoreHandle, key: &ShareKey) -> Result<Answer, Failure> {
        let asked = Instant::now();
        let _turn = self
            .admission
            .turn()
            .await
            .map_err(|refusal| self.refuse(refusal))?;
        let waited = asked.elapsed();
        // The query builds the profile (and its aggregation) in the store
        // task: reserved first, from an upper bound that costs no aggregating.
        let entries = store
            .entries_in(key.window, key.profile_type)
            .await
            .map_err(|closed| (HttpError::from(closed), None))?;
        let _query_memory = self
            .admission
            .reserve(render::query_bytes(entries))
            .await
            .map_err(|refusal| self.refuse(refusal))?;
        let query = Query {
            window: key.window,
            filter: key.filter.clone(),
            visible: key.scope.visible,
            profile_type: key.profile_type,
        };
        let profile = store
            .query(query)
            .await
            .map_err(|closed| (HttpError::from(closed), None))?;
        let queried = asked.elapsed() - waited;
        let kernel_addresses = key.scope.kernel_addresses;
        let needs = render::estimate_bytes(&profile, kernel_addresses);
        let _encode_memory = match self.admission.reserve_more(needs).await {
            Ok(reserved) => reserved,
            Err(refusal) => {
                // What the query built goes back to the kernel, off the async workers.
                tokio::task::spawn_blocking(move || {
                    drop(profile);
                    release_free_memory();
                });
                return Err(self.refuse(refusal));
            }
        };
        let format = key.format;
        let filter = key.filter.clone();
        let started = Instant::now();
        let samples = profile.samples.len();
        // Encoding and compressing take milliseconds to tens of
        // milliseconds: off the async workers, so other requests and the
        // store keep moving.
        let answer = tokio::task::spawn_blocking(move || {
            let mut profile = profile;
            if !kernel_addresses {
                profile.hide_kernel_addresses();
            }
            let answer = render::render(format, &profile, &filter);
            drop(profile);
            release_free_memory();
            answer
        })
        .await
        .map_err(|err| (internal(&err), None))?
        .map_err(|err| (internal(&err), None))?;
        tracing::debug!(
            ?format,
            samples,
            estimate = needs,
            bytes = answer.body.len(),
            wait_ms = waited.as_millis(),
            query_ms = queried.as_millis(),
            render_ms = started.elapsed().as_millis(),
            "computed a shared answer"
        );
        Ok(answer)
    }

    fn refuse(&self, refusal: Refusal) -> Failure {
        let limits = self.admission.limits();
        let message = match refusal {
            Refusal::QueueFull => format!(
                "profilerd is busy: {} profiles are being computed and {} more wait (scrape_concurrency, scrape_queue); retry shortly",
                limits.concurrency, limits.queue
            ),
            Refusal::Timeout => format!(
                "profilerd is busy: this profile waited {} s for its turn or for memory; retry shortly",
                MAX_WAIT.as_secs()
            ),
            Refusal::Contended => {
                "profilerd is busy: other profiles hold the memory this one needs to encode; retry shortly"
                    .to_owned()
            }
            Refusal::TooLarge { needs } => format!(
                "this profile needs about {} MiB to encode, more than scrape_memory_mb allows ({} MiB for encoding); ask for fewer seconds or filter by pid, tid or comm",
                needs.div_ceil(1 << 20),
                limits.memory_bytes >> 20
            ),
        };
        let error = HttpError::new(StatusCode::SERVICE_UNAVAILABLE, message).retry_after(RETRY_AFTER_SECONDS);
        (error, Some(refusal))
    }

    pub fn stats(&self) -> ScrapeStats {
        let load = |count: &AtomicU64| count.load(Ordering::Relaxed);
        ScrapeStats {
            computed: load(&self.counts.computed),
            joined: load(&self.counts.joined),
            cached: load(&self.counts.cached),
            refused: self.counts.refused.each_ref().map(load),
            drains_own: load(&self.counts.drains_own),
            drains_shared: load(&self.counts.drains_shared),
            running: self.admission.running(),
            waiting: self.admission.waiting(),
            reserved_bytes: self.admission.reserved_bytes(),
            cache_bytes: self.answers.bytes(),
            limits: Some(self.limits),
        }
    }
}

/// Drains the sampler and returns the drain's time, or now if that takes
/// longer than [`DRAIN_WAIT`].
async fn drain(pipeline: &Pipeline) -> Result<u64, HttpError> {
    match tokio::time::timeout(DRAIN_WAIT, pipeline.drain_now()).await {
        Ok(drained) => {
            drained.map_err(|_| HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "profilerd is shutting down"))
        }
        Err(_) => {
            tracing::warn!("drain took over {DRAIN_WAIT:?}; answering with the samples already stored");
            Ok(crate::unix_now_ms())
        }
    }
}

/// Hands the pages freed by an encoding back to the kernel. glibc keeps
/// freed memory in each thread's arena for reuse; after encodings on
/// several blocking threads the daemon's RSS would stay near the sum of
/// their peaks rather than at what is live. Once per computation (a few a
/// second at most) its cost is small beside the encoding's.
fn release_free_memory() {
    // SAFETY: malloc_trim only walks the allocator's own free lists, under
    // its own locks; it takes no pointer and invalidates no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn internal(err: &dyn std::fmt::Display) -> HttpError {
    HttpError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("encoding the profile: {err}"),
    )
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let mut response = self.body.into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(self.content_type));
        if self.attachment {
            headers.insert(
                header::CONTENT_DISPOSITION,
                HeaderValue::from_static("attachment; filename=\"profile\""),
            );
            headers.insert(
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            );
        }
        response
    }
}
