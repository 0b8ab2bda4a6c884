//! `profilerd` without a subcommand: sample continuously until stopped.

use std::time::Duration;

use crate::{
    cli::DaemonArgs,
    pipeline::{Pipeline, PipelineError},
    store::StoreConfig,
};

pub async fn run(args: DaemonArgs) -> Result<(), PipelineError> {
    let store = StoreConfig {
        retention: Duration::from_secs(args.retention_seconds),
        max_bytes: (args.store_max_mb as usize) << 20,
    };
    let pipeline = Pipeline::start(args.sampling.pipeline_options(store))?;
    tracing::info!(listen = %args.listen, "profilerd running");
    wait_for_shutdown_signal().await;
    tracing::info!("stopping");
    pipeline.shutdown().await;
    Ok(())
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
