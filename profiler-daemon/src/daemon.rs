//! `profilerd` without a subcommand: sample continuously and serve pprof
//! over HTTP until stopped.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use tokio::net::TcpListener;

use crate::{
    cli::DaemonArgs,
    pipeline::{Pipeline, PipelineError},
    serve::{self, ServeState},
    store::StoreConfig,
};

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot listen on {address}")]
    Bind {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error("the HTTP server failed")]
    Serve(#[source] std::io::Error),
}

pub async fn run(args: DaemonArgs) -> Result<(), DaemonError> {
    // Bind before loading BPF: a taken port fails fast and says so.
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|source| DaemonError::Bind {
            address: args.listen,
            source,
        })?;
    let address = listener.local_addr().unwrap_or(args.listen);
    let retention = Duration::from_secs(args.retention_seconds);
    let store = StoreConfig {
        retention,
        max_bytes: (args.store_max_mb as usize) << 20,
    };
    let pipeline = Arc::new(Pipeline::start(args.sampling.pipeline_options(store))?);
    tracing::info!(listen = %address, "profilerd running: http://{address}/pprof?seconds=10");
    // Under systemd (Type=notify): ready only now, with the programs attached
    // and the listener bound. Without NOTIFY_SOCKET this does nothing.
    if let Err(err) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        tracing::warn!("telling systemd we are ready failed: {err}");
    }
    let served = serve::serve(
        listener,
        ServeState::new(pipeline.clone(), retention),
        wait_for_shutdown_signal(),
    )
    .await;
    tracing::info!("stopping");
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    shutdown(pipeline).await;
    served.map_err(DaemonError::Serve)
}

/// Shuts the pipeline down once the server has released its handles (the
/// server returns only after its last connection closed, so that is at once).
async fn shutdown(mut pipeline: Arc<Pipeline>) {
    for _ in 0..100 {
        match Arc::try_unwrap(pipeline) {
            Ok(pipeline) => return pipeline.shutdown().await,
            Err(shared) => pipeline = shared,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Dropping the last handle still stops the threads and detaches the
    // programs; it only does not wait for them.
    tracing::warn!("the pipeline is still in use; exiting without waiting for it");
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
