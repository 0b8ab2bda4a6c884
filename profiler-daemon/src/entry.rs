//! What `profilerd` does when it runs: the worker, `check-config`,
//! `record`, or the daemon, by its command line. `main.rs` (and the test
//! binary with a fault hook, profiler-daemon/examples/profilerd_faulty.rs) call [`run`].

use std::{io::IsTerminal, path::Path, process::ExitCode, time::Duration};

use clap::{CommandFactory, FromArgMatches};
use tracing_subscriber::EnvFilter;

use crate::{
    cli::{Cli, Command},
    config::{self, Config},
    error::Chain,
};

/// Runs `profilerd` with this process's arguments; its exit status.
pub fn run() -> ExitCode {
    // The worker is started by the daemon with a socket on standard input:
    // no flags, no config, no runtime.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|arg| arg == crate::symbolize::worker::SUBCOMMAND)
    {
        return crate::symbolize::worker::run_worker();
    }
    let matches = Cli::command().get_matches();
    let mut cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(err) => err.exit(),
    };
    let default_level = if cli.command.is_some() { "warn" } else { "info" };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // journald keeps the text; escape codes would only clutter it.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level)))
        .init();
    if let Some(Command::CheckConfig { file }) = &cli.command {
        return match Config::load(file) {
            Ok(config) => {
                config.apply(&mut cli.daemon, &matches);
                print!("{}", config::describe(&cli.daemon));
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("profilerd: {}", Chain(&err));
                ExitCode::from(config::EXIT_CONFIG)
            }
        };
    }
    if cli.command.is_none() {
        match config::apply_file(&mut cli.daemon, &matches, Path::new(config::DEFAULT_PATH)) {
            Ok(Some(path)) => tracing::info!(path = %path.display(), "configuration loaded"),
            Ok(None) => {}
            Err(err) => {
                eprintln!("profilerd: {}", Chain(&err));
                return ExitCode::from(config::EXIT_CONFIG);
            }
        }
    }
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
    let result: Result<(), ExitCode> = runtime.block_on(async {
        match cli.command {
            Some(Command::Record(args)) => crate::record::run(*args).await.map_err(|err| {
                eprintln!("profilerd: {}", Chain(&err));
                ExitCode::FAILURE
            }),
            Some(Command::CheckConfig { .. } | Command::SymbolizeWorker) => Ok(()),
            None => crate::daemon::run(cli.daemon).await.map_err(|err| {
                eprintln!("profilerd: {}", Chain(&err));
                ExitCode::from(err.exit_status())
            }),
        }
    });
    // Dropping the runtime would wait for every blocking task, such as a
    // thread join the daemon gave up on to exit within its stop budget.
    runtime.shutdown_timeout(Duration::from_millis(200));
    result.err().unwrap_or(ExitCode::SUCCESS)
}
