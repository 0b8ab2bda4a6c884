//! Starting the unwind tables' manager (and the Python code prefetcher)
//! when the sampler walks with tables.

use std::{
    sync::{Arc, mpsc},
    thread::JoinHandle,
};

use super::{PipelineError, PipelineOptions};
use crate::{
    collect::{
        UnwindMaps,
        unwind_tables::{TableManager, UnwindInput, UnwindStats},
    },
    python::{
        detect::{Detected, DetectionStats},
        prefetch::{PrefetchStats, Prefetcher, PythonNews},
    },
    stop::Stop,
    symbolize::worker::{WorkerClient, WorkerConfig, WorkerRole},
};

/// The table manager (and the Python code prefetcher), when the sampler
/// walks with tables: their threads, the manager's input, their counters.
///
/// Python processes found are told to the symbolizer on `news_tx`, a
/// channel of its own, not its inputs: the symbolizer holds the table
/// manager's input, and each holding the other's would keep both alive at
/// shutdown. Bounded: a lagging symbolizer loses code objects read ahead
/// (it reads them itself later); a found process is always told.
#[derive(Default)]
pub(super) struct Unwinding {
    pub tx: Option<mpsc::SyncSender<UnwindInput>>,
    pub stats: Option<Arc<UnwindStats>>,
    pub python: Option<Arc<DetectionStats>>,
    pub prefetch: Option<Arc<PrefetchStats>>,
}

pub(super) type Spawn<'a> =
    dyn Fn(&'static str, Box<dyn FnOnce() + Send>) -> Result<JoinHandle<()>, PipelineError> + 'a;

pub(super) fn start_unwinding(
    mut maps: UnwindMaps,
    options: &PipelineOptions,
    news_tx: &mpsc::SyncSender<PythonNews>,
    stop: &Arc<Stop>,
    spawn: &Spawn,
    threads: &mut Vec<JoinHandle<()>>,
) -> Result<Unwinding, PipelineError> {
    let mut unwinding = Unwinding::default();
    let (found_tx, found_rx) = mpsc::channel::<Detected>();
    if let Some(ring) = maps.python_codes.take() {
        let prefetcher = Prefetcher::new(ring, found_rx, news_tx.clone());
        unwinding.prefetch = Some(prefetcher.stats());
        let stop = stop.clone();
        threads.push(spawn("python-codes", Box::new(move || prefetcher.run(&stop)))?);
    }
    let news_tx = news_tx.clone();
    let worker = WorkerConfig::this_binary(
        WorkerRole::UnwindTables,
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
        let _ = news_tx.send(PythonNews::Found(Box::new(detected)));
    });
    unwinding.python = Some(manager.python_stats());
    unwinding.stats = Some(manager.stats());
    // Bounded, and never waited on: a full queue drops (and counts) the
    // input; those processes walk with frame pointers.
    let (tx, rx) = mpsc::sync_channel::<UnwindInput>(4096);
    threads.push(spawn("unwind-tables", Box::new(move || manager.run(rx)))?);
    unwinding.tx = Some(tx);
    Ok(unwinding)
}
