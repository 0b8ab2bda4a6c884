//! Wires the stages: sampler -> drain thread -> symbolizer thread -> store task.
//!
//! Blocking work (map reads, /proc reads, ELF parsing) runs on three plain
//! threads; the store is a tokio task; they talk over channels only.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc::{self, RecvTimeoutError},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tokio::sync::{oneshot, watch};

use crate::python::{
    self,
    detect::{Detected, DetectionStats},
    prefetch::{PrefetchStats, Prefetcher, PythonNews},
};
use crate::{
    collect::{
        self, CollectError, DrainStatus, Drainer, MapEntries, MapSizes, OpenFileStats, OpenFiles,
        ProcessNotice, ProcessWatcher, RawBatch, Sampler, SamplerOptions, SnapshotReader, WatcherStats,
        metrics::CollectFigures,
        unwind_tables::{SampledStacks, TableManager, UnwindInput, UnwindStats},
    },
    store::{self, Store, StoreConfig, StoreHandle},
    supervise::{self, StageReporter},
    symbolize::{
        self, SymbolizeStatus, Symbolizer,
        worker::{WorkerClient, WorkerConfig},
    },
    telemetry::{Live, Telemetry},
};
use crate::{error::Chain, kind::KindSet, procfs::ProcRoot};

/// A batch that waited longer than this for the symbolizer is logged: the
/// profiles being served are that stale.
const LAG_WARNING: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub struct PipelineOptions {
    pub sampler: SamplerOptions,
    pub drain_interval: Duration,
    pub store: StoreConfig,
    /// When not empty, only these processes are symbolized and stored (the
    /// sampler still samples every CPU; the rest is dropped before the
    /// costly part). The daemon keeps everything; `record --pid` uses this.
    pub only_pids: Vec<u32>,
    pub symbolizer: SymbolizerOptions,
    /// Where the sampled processes' /proc is (see [`crate::procfs`]).
    pub proc_root: ProcRoot,
}

/// Bounds of the symbolize stage.
#[derive(Clone, Debug)]
pub struct SymbolizerOptions {
    /// Descriptors held for mapped files, at most.
    pub max_open_files: usize,
    /// The worker process's data limit (RLIMIT_DATA), bytes.
    pub worker_memory_bytes: u64,
    /// How long the worker may take for one file.
    pub worker_deadline: Duration,
}

/// What the pipeline has been doing, updated after every drain: each
/// stage's part is its own type (its metrics read it).
#[derive(Clone, Debug, Default)]
pub struct PipelineStatus {
    pub drain: DrainStatus,
    pub symbolize: SymbolizeStatus,
    /// The newest drain handed to the store: a query sent from now on sees it.
    pub last_stored: Option<StoredDrain>,
}

/// A drain whose samples the store has (or will have before any query sent
/// after this was read: the store answers in order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredDrain {
    /// When the drain began: it holds everything sampled before.
    pub began: Instant,
    /// Its time in the store (Unix ms).
    pub time_ms: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Collect(#[from] CollectError),
    #[error("starting a pipeline thread")]
    Thread(#[source] std::io::Error),
    #[error("the pipeline has stopped")]
    Stopped,
}

enum DrainCommand {
    Now(oneshot::Sender<u64>),
    Stop,
}

enum SymbolizeInput {
    Notice(ProcessNotice),
    Batch {
        // Boxed: a batch is large and notices are frequent.
        batch: Box<RawBatch>,
        time_ms: u64,
        drained_at: Instant,
        drain_time: Duration,
        acks: Vec<oneshot::Sender<u64>>,
    },
}

pub struct Pipeline {
    drain_tx: mpsc::Sender<DrainCommand>,
    store: StoreHandle,
    status: watch::Receiver<PipelineStatus>,
    threads: Vec<JoinHandle<()>>,
    cpus: usize,
    frequency: u64,
    kinds: KindSet,
    started_ms: u64,
    proc_root: ProcRoot,
}

impl Pipeline {
    /// Loads and attaches the sampler and starts every stage. Must run inside
    /// a tokio runtime (the store is a task). Every stage's end goes to
    /// `stages`; every stage's metrics are registered into `telemetry`.
    pub fn start(
        options: PipelineOptions,
        stages: &StageReporter,
        telemetry: &mut Telemetry,
    ) -> Result<Self, PipelineError> {
        let started_ms = crate::unix_now_ms();
        let (sampler, drainer, events, unwind_maps) = Sampler::start(&options.sampler)?;
        let cpus = sampler.cpus();
        let kinds = sampler.kinds();
        let store = Store::new(options.store, options.sampler.frequency);
        let store_stats = store.shared_stats();
        let (store, store_task) = store::spawn(store);
        stages.watch_task("store", store_task);
        let (status_tx, status) = watch::channel(PipelineStatus::default());
        let status_tx = Arc::new(status_tx);
        let files = OpenFiles::new(options.symbolizer.max_open_files);
        let open_files = files.stats.clone();
        // Bounded: if symbolization falls behind, the drain waits rather than
        // memory growing; the BPF maps then absorb (and count) the overflow.
        let (symbolize_tx, symbolize_rx) = mpsc::sync_channel::<SymbolizeInput>(64);
        let (drain_tx, drain_rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));

        let watcher = ProcessWatcher::new(
            events,
            SnapshotReader::new(files.clone(), options.proc_root.clone()),
        );
        let watcher_stats = watcher.stats.clone();
        let mut threads = Vec::new();
        let spawn = |name: &'static str, body: Box<dyn FnOnce() + Send>| {
            stages.spawn_thread(name, body).map_err(PipelineError::Thread)
        };
        let mut unwind_stats = None;
        let mut python_stats = None;
        // News of Python processes for the symbolizer (a channel of its own,
        // not its inputs: the symbolizer holds the table manager's input, and
        // each holding the other's would keep both alive at shutdown).
        // Bounded: a lagging symbolizer loses code objects read ahead (it
        // reads them itself later); a found process is always told.
        let (news_tx, news_rx) = mpsc::sync_channel::<PythonNews>(16384);
        let mut prefetch_stats = None;
        let unwind_tx = match unwind_maps {
            Some(mut maps) => {
                let (found_tx, found_rx) = mpsc::channel::<Detected>();
                let prefetch = maps.python_codes.take().map(|ring| {
                    let prefetcher = Prefetcher::new(ring, found_rx, news_tx.clone());
                    prefetch_stats = Some(prefetcher.stats());
                    prefetcher
                });
                if let Some(prefetcher) = prefetch {
                    let stop = stop.clone();
                    threads.push(spawn("python-codes", Box::new(move || prefetcher.run(&stop)))?);
                }
                let news_tx = news_tx.clone();
                let worker = WorkerConfig::this_binary(
                    options.symbolizer.worker_memory_bytes,
                    options.symbolizer.worker_deadline,
                );
                let manager = TableManager::new(
                    maps,
                    WorkerClient::new(worker),
                    options.sampler.unwind_table_user_share_percent,
                )
                .on_python(move |detected: Detected| {
                    let _ = found_tx.send(detected.clone());
                    let _ = news_tx.send(PythonNews::Found(detected));
                });
                python_stats = Some(manager.python_stats());
                unwind_stats = Some(manager.stats());
                // Bounded, and never waited on: a full queue drops (and
                // counts) the input; those processes walk with frame pointers.
                let (tx, rx) = mpsc::sync_channel::<UnwindInput>(4096);
                threads.push(spawn("unwind-tables", Box::new(move || manager.run(rx)))?);
                Some(tx)
            }
            None => None,
        };
        {
            let tx = symbolize_tx.clone();
            let stop = stop.clone();
            let unwind_tx = unwind_tx.clone();
            let unwind_stats = unwind_stats.clone();
            threads.push(spawn(
                "watch-procs",
                Box::new(move || {
                    watcher.run(&stop, |notice| {
                        if let (Some(unwind_tx), Some(stats)) = (&unwind_tx, &unwind_stats) {
                            let input = match &notice {
                                ProcessNotice::Started(snapshot) => UnwindInput::Started(snapshot.clone()),
                                ProcessNotice::Exited { pid, .. } => UnwindInput::Exited { pid: *pid },
                            };
                            offer(unwind_tx, input, stats);
                        }
                        tx.send(SymbolizeInput::Notice(notice)).is_ok()
                    })
                }),
            )?);
        }
        {
            let store = store.clone();
            let only_pids = options.only_pids.clone();
            let proc_root = options.proc_root.clone();
            let status_tx = status_tx.clone();
            let worker = WorkerConfig::this_binary(
                options.symbolizer.worker_memory_bytes,
                options.symbolizer.worker_deadline,
            );
            let unwind = unwind_tx.clone().zip(unwind_stats.clone());
            threads.push(spawn(
                "symbolize",
                Box::new(move || {
                    let symbolizer = Symbolizer::new(worker, files, proc_root);
                    let symbolizer = symbolizer.python_from(news_rx);
                    symbolize_loop(symbolizer, symbolize_rx, store, &status_tx, only_pids, unwind);
                }),
            )?);
        }
        let interval = options.drain_interval;
        let unwind = unwind_tx.zip(unwind_stats.clone());
        threads.push(spawn(
            "drain",
            Box::new(move || {
                drain_loop(
                    sampler,
                    drainer,
                    interval,
                    drain_rx,
                    symbolize_tx,
                    unwind,
                    &status_tx,
                );
                stop.store(true, Ordering::Relaxed);
            }),
        )?);
        StageFigures {
            map_sizes: options.sampler.map_sizes,
            watcher: watcher_stats,
            open_files,
            unwind: unwind_stats,
            python: python_stats,
            prefetch: prefetch_stats,
            store: store_stats,
        }
        .register(telemetry, &status);
        Ok(Self {
            drain_tx,
            store,
            status,
            threads,
            cpus,
            frequency: options.sampler.frequency,
            kinds,
            started_ms,
            proc_root: options.proc_root,
        })
    }

    /// When sampling began (Unix ms, taken just before the sampler was
    /// attached): the first drain holds what was sampled since.
    pub fn started_ms(&self) -> u64 {
        self.started_ms
    }

    /// Drains the sampler now; returns, once the drained samples are
    /// queryable, the drain's time (Unix ms) — see [`crate::profile::Window::between_drains`].
    pub async fn drain_now(&self) -> Result<u64, PipelineError> {
        let (ack, done) = oneshot::channel();
        self.drain_tx
            .send(DrainCommand::Now(ack))
            .map_err(|_| PipelineError::Stopped)?;
        done.await.map_err(|_| PipelineError::Stopped)
    }

    pub fn store(&self) -> &StoreHandle {
        &self.store
    }

    pub fn status(&self) -> PipelineStatus {
        self.status.borrow().clone()
    }

    /// The newest drain the store has, periodic or asked for.
    pub fn last_stored(&self) -> Option<StoredDrain> {
        self.status.borrow().last_stored
    }

    pub fn cpus(&self) -> usize {
        self.cpus
    }

    pub fn frequency(&self) -> u64 {
        self.frequency
    }

    /// Where the sampled processes' /proc is.
    pub fn proc_root(&self) -> &ProcRoot {
        &self.proc_root
    }

    /// The kinds of samples recorded (off-CPU waits with `--off-cpu`,
    /// where the kernel allows it): a profile type exists only when all of
    /// its kinds are recorded ([`ProfileType::available`]).
    ///
    /// [`ProfileType::available`]: crate::kind::ProfileType::available
    pub fn kinds(&self) -> KindSet {
        self.kinds
    }

    /// Final drain, detaches the BPF programs and joins every thread.
    pub async fn shutdown(self) {
        let _ = self.drain_tx.send(DrainCommand::Stop);
        let threads = self.threads;
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
    }
}

/// What the stages count that is not in the pipeline's status.
struct StageFigures {
    map_sizes: MapSizes,
    watcher: Arc<WatcherStats>,
    open_files: Arc<OpenFileStats>,
    unwind: Option<Arc<UnwindStats>>,
    python: Option<Arc<DetectionStats>>,
    prefetch: Option<Arc<PrefetchStats>>,
    store: Arc<store::metrics::SharedStats>,
}

impl StageFigures {
    /// Registers every stage's metrics, in the order /metrics shows them;
    /// the drain and symbolize stages read their parts of `status`.
    fn register(self, telemetry: &mut Telemetry, status: &watch::Receiver<PipelineStatus>) {
        let drained = status.clone();
        collect::metrics::register(
            telemetry,
            CollectFigures {
                drain: Live::new(move || drained.borrow().drain.clone()),
                map_sizes: self.map_sizes,
                watcher: self.watcher,
                open_files: self.open_files,
                unwind: self.unwind,
            },
        );
        let symbolized = status.clone();
        symbolize::metrics::register(
            telemetry,
            Live::new(move || symbolized.borrow().symbolize.clone()),
        );
        python::metrics::register(telemetry, self.python, self.prefetch);
        store::metrics::register(telemetry, self.store);
    }
}

fn drain_loop(
    mut sampler: Sampler,
    mut drainer: Drainer,
    interval: Duration,
    commands: mpsc::Receiver<DrainCommand>,
    out: mpsc::SyncSender<SymbolizeInput>,
    unwind: Option<(mpsc::SyncSender<UnwindInput>, Arc<UnwindStats>)>,
    status: &watch::Sender<PipelineStatus>,
) {
    let mut next = Instant::now() + interval;
    loop {
        supervise::fault_point("drain");
        let mut acks = Vec::new();
        let mut stop = false;
        match commands.recv_timeout(next.saturating_duration_since(Instant::now())) {
            Ok(DrainCommand::Now(ack)) => {
                acks.push(ack);
                // Requests that queued meanwhile share this drain.
                while let Ok(command) = commands.try_recv() {
                    match command {
                        DrainCommand::Now(ack) => acks.push(ack),
                        DrainCommand::Stop => stop = true,
                    }
                }
            }
            Ok(DrainCommand::Stop) | Err(RecvTimeoutError::Disconnected) => stop = true,
            Err(RecvTimeoutError::Timeout) => next += interval,
        }
        if Instant::now() > next {
            // Fell behind (e.g. suspended): skip missed ticks rather than burst.
            next = Instant::now() + interval;
        }
        let started = Instant::now();
        match drainer.drain() {
            Ok(batch) => {
                // Published here, not after symbolization: losses show in
                // /metrics even while the symbolizer lags.
                let drained_at = Instant::now();
                status.send_modify(|status| {
                    status.drain.bpf = batch.counters;
                    status.drain.last_drain_at = Some(drained_at);
                });
                if let Some((unwind_tx, stats)) = &unwind {
                    let sampled = SampledStacks {
                        samples: batch
                            .samples
                            .iter()
                            .map(|sample| (sample.key.tgid, sample.count, sample.key.user_stack_id))
                            .collect(),
                        stacks: batch.user_stacks.clone(),
                    };
                    offer(unwind_tx, UnwindInput::Sampled(sampled), stats);
                }
                let input = SymbolizeInput::Batch {
                    batch: Box::new(batch),
                    time_ms: crate::unix_now_ms(),
                    drained_at,
                    drain_time: started.elapsed(),
                    acks,
                };
                if out.send(input).is_err() {
                    return;
                }
            }
            Err(err) => tracing::error!("drain failed: {}", Chain(&err)),
        }
        sampler.flush_logs();
        if stop {
            // Dropping the sampler detaches every program.
            drop(sampler);
            return;
        }
    }
}

/// Sends without waiting; a full queue drops the input and counts it.
fn offer(tx: &mpsc::SyncSender<UnwindInput>, input: UnwindInput, stats: &UnwindStats) {
    if let Err(mpsc::TrySendError::Full(_)) = tx.try_send(input) {
        stats.inputs_dropped.fetch_add(1, Ordering::Relaxed);
    }
}

fn symbolize_loop(
    mut symbolizer: Symbolizer,
    inputs: mpsc::Receiver<SymbolizeInput>,
    store: StoreHandle,
    status: &watch::Sender<PipelineStatus>,
    only_pids: Vec<u32>,
    unwind: Option<(mpsc::SyncSender<UnwindInput>, Arc<UnwindStats>)>,
) {
    let mut warned_at: Option<Instant> = None;
    for input in inputs {
        supervise::fault_point("symbolize");
        match input {
            SymbolizeInput::Notice(notice) => symbolizer.notice(notice),
            SymbolizeInput::Batch {
                batch,
                time_ms,
                drained_at,
                drain_time,
                acks,
            } => {
                let started = Instant::now();
                let lag = started.duration_since(drained_at);
                if lag > LAG_WARNING && warned_at.is_none_or(|at| at.elapsed() > Duration::from_secs(60)) {
                    warned_at = Some(started);
                    tracing::warn!("symbolization lags the sampler by {lag:?}: profiles are that stale");
                }
                let mut batch = batch;
                // Occupancy of the maps as drained, before any filtering.
                let map_entries = MapEntries {
                    counts: batch.samples.len().saturating_sub(batch.spilled),
                    user_stacks: batch.user_stacks.len(),
                    kernel_stacks: batch.kernel_stacks.len(),
                };
                if !only_pids.is_empty() {
                    batch
                        .samples
                        .retain(|sample| only_pids.contains(&sample.key.tgid));
                }
                let samples = symbolizer.symbolize(&batch);
                // A library mapped after the first snapshot (dlopen) needs
                // its table too.
                for snapshot in symbolizer.take_fresh_snapshots() {
                    if let Some((tx, stats)) = &unwind {
                        offer(tx, UnwindInput::Started(snapshot), stats);
                    }
                }
                let symbolize_time = started.elapsed();
                status.send_modify(|status| {
                    let (drain, symbolize) = (&mut status.drain, &mut status.symbolize);
                    symbolize.stats = symbolizer.stats();
                    symbolize.last_symbolized_at = Some(Instant::now());
                    symbolize.last_symbolize = symbolize_time;
                    symbolize.symbolize_seconds_total += symbolize_time.as_secs_f64();
                    // Counted once symbolized, with what the batch held.
                    drain.drains += 1;
                    drain.last_drain = drain_time;
                    drain.map_read_errors += batch.read_errors;
                    drain.wait_stacks_lost += batch.wait_stacks_lost;
                    drain.map_entries = map_entries;
                    drain.drain_seconds_total += drain_time.as_secs_f64();
                });
                if store.blocking_ingest(time_ms, samples, acks).is_err() {
                    return;
                }
                let began = drained_at.checked_sub(drain_time).unwrap_or(drained_at);
                status.send_modify(|status| status.last_stored = Some(StoredDrain { began, time_ms }));
            }
        }
    }
}
