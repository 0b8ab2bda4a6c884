//! `profilerd` without a subcommand: sample continuously and serve pprof
//! over HTTP until stopped.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use tokio::sync::watch;

use crate::error::Chain;
use crate::{
    cli::DaemonArgs,
    pipeline::{Pipeline, PipelineError},
    serve::{
        self, ListenAddress, ServeState,
        access::AccessPolicy,
        tls::{Tls, TlsError},
    },
    store::StoreConfig,
    supervise::{self, EndReason, StageEnd, Supervisor},
    telemetry::Telemetry,
};

/// Exit status when the BPF programs cannot be loaded or attached
/// (EX_NOPERM): missing privileges or an unsupported kernel fail the same way
/// on every attempt, so the unit does not restart on it.
pub const EXIT_BPF_LOAD: u8 = 77;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot listen on {address}")]
    Bind {
        address: ListenAddress,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Access(String),
    #[error("TLS")]
    Tls(#[source] TlsError),
    #[error("cannot load the BPF programs")]
    Load(#[source] PipelineError),
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error("the HTTP server failed")]
    Serve(#[source] std::io::Error),
    #[error("{0}")]
    StageEnded(StageEnd),
    #[error("push settings: {0}")]
    PushSettings(String),
    #[error("cannot start pushing")]
    Push(#[source] crate::push::PushError),
}

impl DaemonError {
    /// The process's exit status: the unit's RestartPreventExitStatus lists
    /// the ones a restart cannot fix.
    pub fn exit_status(&self) -> u8 {
        match self {
            Self::Load(_) => EXIT_BPF_LOAD,
            Self::Access(_) | Self::Tls(_) | Self::PushSettings(_) | Self::Push(_) => {
                crate::config::EXIT_CONFIG
            }
            Self::StageEnded(_) => supervise::EXIT_STAGE_FAILED,
            Self::Bind { .. } | Self::Pipeline(_) | Self::Serve(_) => 1,
        }
    }
}

pub async fn run(args: DaemonArgs) -> Result<(), DaemonError> {
    raise_fd_limit(args.http.limits().max_connections);
    let hangups = serve::tls::hangups();
    let tls = load_tls(&args)?;
    let policy = access_policy(&args, tls.as_deref())?;
    // Bind before loading BPF: a taken port fails fast and says so.
    let listener = serve::bind(&args.listen).map_err(|source| DaemonError::Bind {
        address: args.listen.clone(),
        source,
    })?;
    let mut reach = listener.describe();
    if tls.is_some() {
        reach = reach.replacen("http://", "https://", 1);
    }
    let retention = Duration::from_secs(args.retention_seconds);
    let push = args.push.settings(retention).map_err(DaemonError::PushSettings)?;
    let options = args.sampling.pipeline_options(StoreConfig {
        retention,
        max_bytes: (args.store_max_mb as usize) << 20,
        user_share_percent: args.store_user_share_percent,
    });
    // No drain for this long is a dead drain stage.
    let stall_limit = (options.sampler.drain_interval * STALL_INTERVALS).max(STALL_MIN);
    let mut supervisor = Supervisor::new();
    // Every stage registers its metrics as it is built; serve encodes them.
    let mut telemetry = Telemetry::new();
    let pipeline = start_pipeline(options, &supervisor, &mut telemetry)?;
    let pusher = crate::push::Pusher::start(&push, pipeline.clone(), &supervisor.reporter(), &mut telemetry)
        .map_err(DaemonError::Push)?;
    tracing::info!(listen = %args.listen, "profilerd running: {reach}");
    // Under systemd (Type=notify): ready only now, with the programs attached
    // and the listener bound. Without NOTIFY_SOCKET this does nothing.
    if let Err(err) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        tracing::warn!("telling systemd we are ready failed: {err}");
    }
    // The signal's instant: the start of the stop budget.
    let (signalled, on_signal) = watch::channel(None);
    let shutdown = async move {
        wait_for_shutdown_signal().await;
        // At once, not after the in-flight responses: systemd shows "deactivating".
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
        let _ = signalled.send(Some(Instant::now()));
    };
    let state = ServeState::new(
        pipeline.clone(),
        retention,
        args.http.limits(),
        policy,
        args.http.scrape_limits(),
        tls.clone(),
        telemetry,
    );
    supervisor
        .reporter()
        .watch_task("reload", tokio::spawn(serve::tls::reload_on_sighup(tls, hangups)));
    // A task of its own, so that a panic in it is seen like any stage's.
    let mut server = tokio::spawn(serve::serve(listener, state, shutdown));
    // Everything is started: what start-up alone ran need not stay resident.
    tokio::task::spawn_blocking(crate::own_pages::release_startup_pages_logged);
    let progress = pipeline.clone();
    let served = tokio::select! {
        joined = &mut server => match joined {
            Ok(served) if signal_instant(&on_signal).is_some() => Ok(served),
            Ok(served) => Err(stage_failed(StageEnd {
                stage: "http",
                reason: match served {
                    Ok(()) => EndReason::Returned,
                    Err(err) => EndReason::Failed(Chain(&err).to_string()),
                },
            })),
            Err(err) => Err(stage_failed(StageEnd {
                stage: "http",
                reason: EndReason::Panicked(format!("{err}")),
            })),
        },
        () = after_signal(on_signal.clone(), GRACE) => {
            // A client that stalls mid-request (or reads a large answer
            // slowly) would otherwise hold the exit until systemd kills us.
            tracing::warn!("connections still open {GRACE:?} after the stop signal; closing them");
            server.abort();
            Ok(Ok(()))
        }
        end = supervisor.failure(move || progress.status().drain.last_drain_at, "drain", stall_limit) => {
            Err(stage_failed(end))
        }
    };
    // Stages end from here on: that is expected.
    supervisor.stop();
    let served = match served {
        Ok(served) => served,
        Err(failed) => {
            // Not joined: a stalled stage would hold the exit. Exiting
            // closes every BPF descriptor, which detaches the programs.
            server.abort();
            return Err(failed);
        }
    };
    tracing::info!("stopping");
    let deadline = signal_instant(&on_signal).unwrap_or_else(Instant::now) + STOP_BUDGET;
    stop_within(deadline, pusher, pipeline).await;
    served.map_err(DaemonError::Serve)
}

/// Starts the pipeline; a sampler that cannot load is told to systemd with
/// its errno (the unit does not restart for it).
fn start_pipeline(
    options: crate::pipeline::PipelineOptions,
    supervisor: &Supervisor,
    telemetry: &mut Telemetry,
) -> Result<Arc<Pipeline>, DaemonError> {
    match Pipeline::start(options, &supervisor.reporter(), telemetry) {
        Ok(pipeline) => Ok(Arc::new(pipeline)),
        Err(err @ PipelineError::Collect(_)) => {
            let errno = os_error(&err).unwrap_or(nix::errno::Errno::EPERM as u32);
            supervise::notify_failure(&format!("cannot load the BPF programs: {}", Chain(&err)), errno);
            Err(DaemonError::Load(err))
        }
        Err(err) => Err(err.into()),
    }
}

/// Stops pushing (a last window, then what is queued) and the pipeline,
/// by `deadline` (the signal's instant plus the stop budget).
async fn stop_within(deadline: Instant, pusher: Option<crate::push::Pusher>, pipeline: Arc<Pipeline>) {
    // Pushing gets part of the budget: the pipeline must stop in the rest.
    let push_deadline = deadline.min(Instant::now() + PUSH_STOP_BUDGET);
    if let Some(pusher) = pusher
        && tokio::time::timeout_at(push_deadline.into(), pusher.stop())
            .await
            .is_err()
    {
        tracing::warn!("pushing did not stop within {PUSH_STOP_BUDGET:?}");
    }
    if tokio::time::timeout_at(deadline.into(), shutdown_pipeline(pipeline))
        .await
        .is_err()
    {
        // Exiting closes every BPF descriptor: the kernel detaches the programs.
        tracing::warn!("the pipeline did not stop within {STOP_BUDGET:?} of the signal; exiting without it");
    }
}

/// A stage that ended: logged, told to systemd, and the daemon's error.
fn stage_failed(end: StageEnd) -> DaemonError {
    tracing::error!(
        stage = end.stage,
        "{end}; exiting with status {} so that the service is restarted",
        supervise::EXIT_STAGE_FAILED
    );
    supervise::notify_failure(&format!("failed: {end}"), end.errno());
    DaemonError::StageEnded(end)
}

/// The errno of the first system call that failed in `err`'s causes.
fn os_error(err: &(dyn std::error::Error + 'static)) -> Option<u32> {
    let mut cause = Some(err);
    while let Some(err) = cause {
        if let Some(code) = err
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
        {
            return u32::try_from(code).ok();
        }
        cause = err.source();
    }
    None
}

/// The drain stage counts as ended after this many drain intervals without
/// a drain, and at least [`STALL_MIN`].
const STALL_INTERVALS: u32 = 10;
const STALL_MIN: Duration = Duration::from_secs(30);

/// How long in-flight responses may take after SIGTERM/SIGINT before their
/// connections are closed.
const GRACE: Duration = Duration::from_secs(3);

/// Of the stop budget, what the last push may take (a last drain, its
/// window cut and the queue sent for [`crate::push::sender::FLUSH_GRACE`]).
const PUSH_STOP_BUDGET: Duration = Duration::from_millis(2800);

/// From the signal to returning from [`run`]: within the 5 s the daemon
/// promises (systemd's TimeoutStopSec is 10 s).
const STOP_BUDGET: Duration = Duration::from_millis(4500);

fn signal_instant(on_signal: &watch::Receiver<Option<Instant>>) -> Option<Instant> {
    *on_signal.borrow()
}

/// Resolves `grace` after the stop signal; never if there is none.
async fn after_signal(mut on_signal: watch::Receiver<Option<Instant>>, grace: Duration) {
    match on_signal.wait_for(Option::is_some).await {
        Ok(at) => {
            let at = at.unwrap_or_else(Instant::now);
            tokio::time::sleep_until((at + grace).into()).await;
        }
        // The sender is gone without a signal: the server ended by itself.
        Err(_) => std::future::pending().await,
    }
}

/// Shuts the pipeline down once the server has released its handles (the
/// server returns only after its last connection closed, so that is at once,
/// unless connections were cut after the grace period: their tasks drop
/// their handles as the runtime cancels them).
async fn shutdown_pipeline(mut pipeline: Arc<Pipeline>) {
    loop {
        match Arc::try_unwrap(pipeline) {
            Ok(pipeline) => return pipeline.shutdown().await,
            Err(shared) => pipeline = shared,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Descriptors the daemon needs besides HTTP connections (BPF maps and
/// programs, a perf event per CPU, mapped files being symbolized...), for
/// the warning below only.
const FD_RESERVE: u64 = 1024;

/// Raises the soft RLIMIT_NOFILE to the hard limit (systemd's default soft
/// limit is 1024), so that the daemon's own bounds, not the descriptor
/// limit, are what an attacker runs into.
fn raise_fd_limit(max_connections: usize) {
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(err) => {
            tracing::warn!(
                "reading the descriptor limit failed: {}",
                std::io::Error::from(err)
            );
            return;
        }
    };
    let mut current = soft;
    // Raising the soft limit up to the hard one needs no privilege.
    if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => current = hard,
            Err(err) => tracing::warn!(
                "raising the descriptor limit from {soft} failed: {}",
                std::io::Error::from(err)
            ),
        }
    }
    tracing::info!(from = soft, "descriptor limit (RLIMIT_NOFILE): {current}");
    if current < max_connections as u64 + FD_RESERVE {
        tracing::warn!(
            "the descriptor limit {current} leaves little room beyond http_max_connections = {max_connections}"
        );
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn wait_for_shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(err) => {
            tracing::warn!("SIGTERM handler unavailable ({err}); stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The TLS the settings ask for, every file read (a bad one is a config error).
fn load_tls(args: &DaemonArgs) -> Result<Option<Arc<Tls>>, DaemonError> {
    let files = &args.tls;
    let tls = Tls::from_settings(
        &args.listen,
        files.tls_cert_file.as_deref(),
        files.tls_key_file.as_deref(),
        files.tls_client_ca_file.as_deref(),
    )
    .map_err(DaemonError::Tls)?;
    Ok(tls.map(Arc::new))
}

/// The access policy the settings ask for. A listener beyond loopback needs
/// a bearer token or a client CA (or `insecure`, which is logged): its
/// clients are not local users the kernel can name.
fn access_policy(args: &DaemonArgs, tls: Option<&Tls>) -> Result<AccessPolicy, DaemonError> {
    let mut policy = AccessPolicy::new(&args.access_group);
    if let Some(path) = &args.access_token_file {
        let text = std::fs::read_to_string(path).map_err(|err| {
            DaemonError::Access(format!("reading the access token {}: {err}", path.display()))
        })?;
        let token = text.trim();
        if token.len() < 16 {
            return Err(DaemonError::Access(format!(
                "the access token in {} is shorter than 16 characters",
                path.display()
            )));
        }
        policy = policy.with_token(token.as_bytes());
    }
    if let ListenAddress::Tcp(address) = &args.listen
        && !address.ip().is_loopback()
        && !policy.has_token()
        && !tls.is_some_and(Tls::requires_client_certificate)
    {
        if !args.insecure {
            return Err(DaemonError::Access(format!(
                "listening on {address}, beyond loopback, needs access_token_file or tls_client_ca_file \
                 (or insecure = true)"
            )));
        }
        tracing::warn!(
            listen = %address,
            "listening beyond loopback with no access token or client CA (insecure = true): remote \
             clients get 403 on every profile endpoint, /metrics is open to them"
        );
    }
    Ok(policy)
}
