//! `profilerd record`: sample for a while, write one profile, exit.

use std::{io::Write, path::Path, time::Duration};

use profiler_common::Counter;

use crate::{
    cli::{Format, RecordArgs},
    kind::{ProfileType, Source, ViewValue},
    pipeline::{Pipeline, PipelineError, PipelineOptions, PipelineStatus},
    profile::Filter,
    profile::Window,
    profile::{Profile, flamegraph, folded, pprof},
    store::{Query, StoreConfig, Visible},
    supervise::Supervisor,
    telemetry::Telemetry,
};

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{0}")]
    Trace(String),
    #[error("no process with pid {0}")]
    NoSuchProcess(u32),
    #[error("--type {0}: its samples cannot be recorded on this kernel (see the warning above)")]
    Unavailable(ProfileType),
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error("the sample store stopped unexpectedly")]
    Store(#[from] crate::store::StoreClosed),
    #[error("writing {path}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// An allocation recording traces each `--pid` for the recording (and
/// needs one at least: allocations are traced per process).
async fn trace_allocations(
    pipeline: &Pipeline,
    profile_type: ProfileType,
    args: &RecordArgs,
) -> Result<(), RecordError> {
    if !profile_type
        .kinds()
        .any(|kind| kind.source() == Source::AllocatorProbes)
    {
        return Ok(());
    }
    if args.pids.is_empty() {
        return Err(RecordError::Trace(
            "--type alloc traces the allocations of a process: give --pid".into(),
        ));
    }
    for &pid in &args.pids {
        pipeline
            .trace_allocations(pid, Duration::from_secs(args.seconds))
            .await
            .map_err(|err| RecordError::Trace(err.to_string()))?;
    }
    Ok(())
}

pub async fn run(args: RecordArgs) -> Result<(), RecordError> {
    if let Some(&pid) = args
        .pids
        .iter()
        .find(|&&pid| !args.sampling.proc_root().exists(pid))
    {
        return Err(RecordError::NoSuchProcess(pid));
    }
    let store = StoreConfig {
        // Keep the whole recording, whatever its length.
        retention: Duration::from_secs(args.seconds + 60),
        ..StoreConfig::default()
    };
    let started_ms = crate::unix_now_ms();
    let mut options = PipelineOptions {
        only_pids: args.pids.clone(),
        ..args.sampling.pipeline_options(store)
    };
    let profile_type = args.profile_type;
    // Each source is on only when asked for: an off-CPU or wall recording
    // asks for waits.
    for kind in profile_type.kinds() {
        options.sampler.enable(kind.source());
    }
    // A stage that ends early is logged as it ends, and the drain below then
    // fails with "the pipeline has stopped".
    let supervisor = Supervisor::new();
    // record serves no /metrics: the stages register into a registry nobody reads.
    let mut telemetry = Telemetry::new();
    let pipeline = Pipeline::start(options, &supervisor.reporter(), &mut telemetry)?;
    if profile_type.available(pipeline.kinds()).is_err() {
        supervisor.stop();
        pipeline.shutdown().await;
        return Err(RecordError::Unavailable(profile_type));
    }
    let traced = trace_allocations(&pipeline, profile_type, &args).await;
    if let Err(err) = traced {
        supervisor.stop();
        pipeline.shutdown().await;
        return Err(err);
    }
    let interrupted = tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(args.seconds)) => false,
        _ = tokio::signal::ctrl_c() => true,
    };
    if profile_type
        .kinds()
        .any(|kind| kind.source() == Source::AllocatorProbes)
    {
        for &pid in &args.pids {
            let summary = pipeline.end_allocations(pid).await?;
            if let Some(reason) = summary.cut_short {
                eprintln!("profilerd: the tracing of {pid} was cut short: {reason}");
            }
        }
    }
    let until_ms = pipeline.drain_now().await?;
    let filter = Filter {
        pids: args.pids.clone(),
        units: args.units.clone(),
        ..Filter::default()
    };
    let profile = pipeline
        .store()
        .query(Query {
            // The recording's own span: it is the profile's time and duration.
            window: Window {
                start_ms: started_ms,
                end_ms: until_ms.saturating_add(1),
            },
            filter: filter.clone(),
            // `record` runs as root, for root.
            visible: Visible::All,
            profile_type,
        })
        .await?;
    let status = pipeline.status();
    let (cpus, frequency) = (pipeline.cpus(), pipeline.frequency());
    supervisor.stop();
    pipeline.shutdown().await;

    write_output(&args.output, args.format, &filter, &profile)?;
    let destination = if args.output == Path::new("-") {
        "standard output".to_owned()
    } else {
        args.output.display().to_string()
    };
    let description = profile_type.describe();
    let what = match description.views_count {
        ViewValue::Count => format!("{} samples", profile.total_samples()),
        ViewValue::Amount => format!(
            "{} {} ({} of {} time)",
            profile.total_samples(),
            description.sample_types[0].0,
            description.unit.human(profile.total_value()),
            description.title
        ),
    };
    eprintln!(
        "profilerd record: {what}{} written to {destination} ({}, {frequency} Hz on {cpus} CPUs)",
        if interrupted { " (interrupted)" } else { "" },
        clap::ValueEnum::to_possible_value(&args.format)
            .map_or_else(String::new, |value| value.get_name().to_owned()),
    );
    eprintln!("profilerd record: {}", counters_summary(&status));
    Ok(())
}

fn write_output(path: &Path, format: Format, filter: &Filter, profile: &Profile) -> Result<(), RecordError> {
    let write = |out: &mut dyn Write| -> std::io::Result<()> {
        let mut out = std::io::BufWriter::new(out);
        match format {
            Format::Folded => folded::write(profile, &mut out)?,
            Format::Pprof => out.write_all(&pprof::encode_gzip(profile)?)?,
            Format::Svg => {
                let title = flamegraph::title(profile.profile_type, filter, &profile.window);
                flamegraph::write(profile, &title, false, &mut out)?;
            }
        }
        out.flush()
    };
    let result = if path == Path::new("-") {
        write(&mut std::io::stdout().lock())
    } else {
        std::fs::File::create(path).and_then(|mut file| write(&mut file))
    };
    result.map_err(|source| RecordError::Write {
        path: path.display().to_string(),
        source,
    })
}

/// `bpf counters: samples=N idle=N ... errors=N` (key=value pairs, stable names).
pub fn counters_summary(status: &PipelineStatus) -> String {
    let mut line = String::from("bpf counters:");
    for counter in Counter::ALL {
        line.push_str(&format!(" {}={}", counter.name(), status.drain.bpf.get(counter)));
    }
    line.push_str(&format!(
        " errors={} map_read_errors={} unresolved_frames={}",
        status.drain.bpf.errors(),
        status.drain.map_read_errors,
        status.symbolize.stats.resolver.unresolved
    ));
    line
}
