//! The two threads that move samples: the drain (the sampler's maps into
//! batches, on a timer or when asked) and the symbolizer (batches into
//! stored samples).

use std::{
    sync::{
        Arc,
        atomic::Ordering,
        mpsc::{self, RecvTimeoutError},
    },
    time::{Duration, Instant},
};

use tokio::sync::watch;

use super::{DrainCommand, LAG_WARNING, PipelineStatus, StoredDrain, SymbolizeInput};
use crate::{
    collect::{
        Drainer, MapEntries, ProcessNotice, ProcessWatcher, Sampler,
        allocations::{AllocCommand, AllocError, AllocationTracer, TraceSummary},
        unwind_tables::{SampledStacks, UnwindInput, UnwindStats},
    },
    error::Chain,
    stop::Stop,
    store::StoreHandle,
    supervise,
    symbolize::Symbolizer,
};

pub(super) fn drain_loop(
    (mut sampler, mut drainer, mut tracer): (Sampler, Drainer, Option<AllocationTracer>),
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
                        DrainCommand::Allocations(command) => allocations(&mut tracer, &mut sampler, command),
                        DrainCommand::Stop => stop = true,
                    }
                }
            }
            Ok(DrainCommand::Allocations(command)) => {
                allocations(&mut tracer, &mut sampler, command);
                continue;
            }
            Ok(DrainCommand::Stop) | Err(RecvTimeoutError::Disconnected) => stop = true,
            Err(RecvTimeoutError::Timeout) => next += interval,
        }
        if let Some(tracer) = &mut tracer {
            if stop {
                tracer.end_all(sampler.ebpf_mut());
            } else {
                tracer.tick(sampler.ebpf_mut());
            }
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

/// Hands a command to the allocation tracer; without one (frame-pointer
/// unwinding), a start is refused and an end has nothing to say.
fn allocations(tracer: &mut Option<AllocationTracer>, sampler: &mut Sampler, command: AllocCommand) {
    match (tracer, command) {
        (Some(tracer), command) => tracer.handle(sampler.ebpf_mut(), command),
        (None, AllocCommand::Start { reply, .. }) => {
            let _ = reply.send(Err(AllocError::Unavailable));
        }
        (None, AllocCommand::End { reply, .. }) => {
            let _ = reply.send(TraceSummary::default());
        }
        (None, AllocCommand::Continuous { reply }) => {
            let _ = reply.send(Vec::new());
        }
    }
}

/// Sends without waiting; a full queue drops the input and counts it.
fn offer(tx: &mpsc::SyncSender<UnwindInput>, input: UnwindInput, stats: &UnwindStats) {
    if let Err(mpsc::TrySendError::Full(_)) = tx.try_send(input) {
        stats.inputs_dropped.fetch_add(1, Ordering::Relaxed);
    }
}

pub(super) fn symbolize_loop(
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
                    drain.off_cpu_exact += batch.off_cpu_exact;
                    drain.cpu_credits += batch.cpu_credits;
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

/// The process watcher's thread: each notice goes to the symbolizer, and
/// to the unwind tables' manager when there is one. Ends with the watcher.
pub(super) fn watch_processes(
    watcher: ProcessWatcher,
    stop: &Stop,
    out: &mpsc::SyncSender<SymbolizeInput>,
    unwind: Option<&(mpsc::SyncSender<UnwindInput>, Arc<UnwindStats>)>,
) {
    watcher.run(stop, |notice| {
        if let Some((unwind_tx, stats)) = unwind {
            let input = match &notice {
                ProcessNotice::Started(snapshot) => UnwindInput::Started(snapshot.clone()),
                ProcessNotice::Exited { pid, .. } => UnwindInput::Exited { pid: *pid },
            };
            offer(unwind_tx, input, stats);
        }
        out.send(SymbolizeInput::Notice(notice)).is_ok()
    });
}
