use std::process::ExitCode;

use clap::Parser;
use profilerd::cli::{Cli, Command};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = if cli.command.is_some() { "warn" } else { "info" };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level)))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("profilerd: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result: anyhow::Result<()> = runtime.block_on(async {
        match cli.command {
            Some(Command::Record(args)) => Ok(profilerd::record::run(args).await?),
            None => Ok(profilerd::daemon::run(cli.daemon).await?),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("profilerd: {err:#}");
            ExitCode::FAILURE
        }
    }
}
