//! Wires the stages: sampler -> drain thread -> symbolizer thread -> store task.
//!
//! Blocking work (map reads, /proc reads, ELF parsing) runs on three plain
//! threads; the store is a tokio task; they talk over channels only.

use std::{
    sync::{Arc, mpsc},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tokio::sync::{oneshot, watch};

use crate::python::{
    self,
    detect::DetectionStats,
    prefetch::{PrefetchStats, PythonNews},
};
use crate::{
    collect::{
        self, CollectError, DrainStatus, MapSizes, OpenFileStats, OpenFiles, ProcessNotice, ProcessWatcher,
        RawBatch, Sampler, SamplerOptions, SnapshotReader, WatcherStats,
        allocations::{
            AllocCommand, AllocError, AllocTargets, AllocationLimits, AllocationStats, AllocationTracer,
            ContinuousTrace, TraceSummary,
        },
        metrics::CollectFigures,
        unwind_tables::UnwindStats,
    },
    store::{self, Store, StoreConfig, StoreHandle},
    supervise::StageReporter,
    symbolize::{self, SymbolizeStatus, Symbolizer, worker::WorkerConfig},
    telemetry::{Live, Telemetry},
};
use crate::{error::Chain, kind::KindSet, procfs::ProcRoot, stop::Stop};

mod threads;
mod unwinding;
use threads::{drain_loop, symbolize_loop, watch_processes};
use unwinding::{Unwinding, start_unwinding};

/// A batch that waited longer than this for the symbolizer is logged: the
/// profiles being served are that stale.
const LAG_WARNING: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub struct PipelineOptions {
    pub sampler: SamplerOptions,
    /// Bounds of allocation tracing.
    pub allocations: AllocationLimits,
    /// Processes whose allocations are traced while the daemon runs.
    pub alloc_targets: AllocTargets,
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
    /// Read file:line and inlined frames from separate debug files too.
    pub debug_file_lines: bool,
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

/// Why allocations could not be traced.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(transparent)]
    Refused(AllocError),
    #[error("the pipeline has stopped")]
    Stopped,
}

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Collect(#[from] CollectError),
    #[error("starting a pipeline thread")]
    Thread(#[source] std::io::Error),
    #[error("creating the pipeline's stop signal (an eventfd)")]
    StopSignal(#[source] std::io::Error),
    #[error("the pipeline has stopped")]
    Stopped,
}

enum DrainCommand {
    Now(oneshot::Sender<u64>),
    /// For the allocation tracer, which lives on the drain thread.
    Allocations(AllocCommand),
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
    /// Some process is to be traced while the daemon runs.
    alloc_targets: bool,
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
        let (mut sampler, drainer, events, unwind_maps) =
            Sampler::start(&options.sampler, &options.proc_root)?;
        let cpus = sampler.cpus();
        let map_sizes = sampler.map_sizes();
        let kernel_namer = sampler
            .take_kernel_namer()
            .inspect_err(|err| tracing::warn!("kernel frames named from /proc/kallsyms: {}", Chain(err)))
            .ok();
        let kinds = sampler.kinds();
        let tracer = sampler
            .take_allocation_maps(options.sampler.alloc_sample_bytes, options.proc_root.clone())?
            .map(|maps| {
                // The tracer asks on the drain thread: a short deadline per
                // file, whatever symbolization's is.
                let worker = WorkerConfig::this_binary(
                    symbolize::worker::WorkerRole::Allocations,
                    options.symbolizer.worker_memory_bytes,
                    options.symbolizer.worker_deadline.min(Duration::from_secs(5)),
                );
                let reader = Box::new(symbolize::worker::WorkerClient::new(worker));
                AllocationTracer::new(maps, options.proc_root.clone(), options.allocations, reader)
                    .tracing_continuously(&options.alloc_targets)
            });
        let allocation_stats = tracer.as_ref().map(|tracer| tracer.stats.clone());
        let store = Store::new(options.store, options.sampler.frequency)
            .with_alloc_interval(options.sampler.alloc_sample_bytes);
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
        let stop = Arc::new(Stop::new().map_err(PipelineError::StopSignal)?);

        let watcher = ProcessWatcher::new(
            events,
            SnapshotReader::new(files.clone(), options.proc_root.clone()),
        )
        .met(sampler.meet_own_process(&options.proc_root, &options.only_pids));
        let watcher_stats = watcher.stats.clone();
        let mut threads = Vec::new();
        let spawn = |name: &'static str, body: Box<dyn FnOnce() + Send>| {
            stages.spawn_thread(name, body).map_err(PipelineError::Thread)
        };
        // News of Python processes for the symbolizer (see start_unwinding).
        let (news_tx, news_rx) = mpsc::sync_channel::<PythonNews>(16384);
        let unwinding = match unwind_maps {
            Some(maps) => start_unwinding(maps, &options, &news_tx, &stop, &spawn, &mut threads)?,
            None => Unwinding::default(),
        };
        let (unwind_tx, unwind_stats) = (unwinding.tx.clone(), unwinding.stats.clone());
        {
            let (tx, stop) = (symbolize_tx.clone(), stop.clone());
            let unwind = unwind_tx.clone().zip(unwind_stats.clone());
            threads.push(spawn(
                "watch-procs",
                Box::new(move || watch_processes(watcher, &stop, &tx, unwind.as_ref())),
            )?);
        }
        {
            let store = store.clone();
            let only_pids = options.only_pids.clone();
            let proc_root = options.proc_root.clone();
            let status_tx = status_tx.clone();
            let worker = WorkerConfig {
                debug_file_lines: options.symbolizer.debug_file_lines,
                ..WorkerConfig::this_binary(
                    symbolize::worker::WorkerRole::Symbols,
                    options.symbolizer.worker_memory_bytes,
                    options.symbolizer.worker_deadline,
                )
            };
            let unwind = unwind_tx.clone().zip(unwind_stats.clone());
            threads.push(spawn(
                "symbolize",
                Box::new(move || {
                    let symbolizer = Symbolizer::new(worker, files, proc_root, kernel_namer);
                    let symbolizer = symbolizer.python_from(news_rx);
                    symbolize_loop(symbolizer, symbolize_rx, store, &status_tx, only_pids, unwind);
                }),
            )?);
        }
        let (interval, unwind) = (options.sampler.drain_interval, unwind_tx.zip(unwind_stats));
        let drain = (sampler, drainer, drain_rx, symbolize_tx, tracer);
        threads.push(spawn(
            "drain",
            Box::new(move || {
                let (sampler, drainer, commands, out, tracer) = drain;
                drain_loop(
                    (sampler, drainer, tracer),
                    interval,
                    commands,
                    out,
                    unwind,
                    &status_tx,
                );
                stop.set();
            }),
        )?);
        StageFigures {
            map_sizes,
            watcher: watcher_stats,
            open_files,
            unwind: unwinding.stats,
            python: unwinding.python,
            prefetch: unwinding.prefetch,
            store: store_stats,
            allocations: allocation_stats,
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
            alloc_targets: !options.alloc_targets.is_empty(),
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

    /// Traces the allocations of `pid` for `seconds` from when the probes
    /// are attached, when this returns (or until [`Pipeline::end_allocations`]).
    pub async fn trace_allocations(&self, pid: u32, seconds: Duration) -> Result<(), TraceError> {
        let (reply, answer) = oneshot::channel();
        self.drain_tx
            .send(DrainCommand::Allocations(AllocCommand::Start {
                pid,
                seconds,
                reply,
            }))
            .map_err(|_| TraceError::Stopped)?;
        answer
            .await
            .map_err(|_| TraceError::Stopped)?
            .map_err(TraceError::Refused)
    }

    /// The processes traced while the daemon runs, by pid, and since when
    /// (none asked of the drain thread when no target is configured).
    pub async fn traced_continuously(&self) -> Result<Vec<ContinuousTrace>, PipelineError> {
        if !self.alloc_targets {
            return Ok(Vec::new());
        }
        let (reply, answer) = oneshot::channel();
        self.drain_tx
            .send(DrainCommand::Allocations(AllocCommand::Continuous { reply }))
            .map_err(|_| PipelineError::Stopped)?;
        answer.await.map_err(|_| PipelineError::Stopped)
    }

    /// Ends one reader's tracing of `pid`: what it counted.
    pub async fn end_allocations(&self, pid: u32) -> Result<TraceSummary, PipelineError> {
        let (reply, answer) = oneshot::channel();
        self.drain_tx
            .send(DrainCommand::Allocations(AllocCommand::End { pid, reply }))
            .map_err(|_| PipelineError::Stopped)?;
        answer.await.map_err(|_| PipelineError::Stopped)
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
    allocations: Option<Arc<AllocationStats>>,
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
                allocations: self.allocations,
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
