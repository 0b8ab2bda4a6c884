use std::{io::IsTerminal, path::Path, process::ExitCode, time::Duration};

use clap::{CommandFactory, FromArgMatches};
use profilerd::{
    cli::{Cli, Command},
    config::{self, Config},
    error::Chain,
};
use tracing_subscriber::EnvFilter;

/// glibc malloc arenas the process may use. By default glibc gives each
/// new thread an arena of its own, up to 8 per CPU: the scrape computations
/// and connection tasks that run on tokio's blocking threads (a new thread
/// whenever the others are busy) then leave freed memory scattered over a
/// dozen arenas, where it stays mapped beside the store's long-lived
/// buckets. Measured under 150 scraping clients, that held 50-100 MB more
/// than an unscraped daemon; with 2 arenas (one per async worker) the
/// difference stays within the scrape memory budget. An operator's
/// `MALLOC_ARENA_MAX` is left as given.
#[cfg(target_env = "gnu")]
const MALLOC_ARENAS: libc::c_int = 2;

#[cfg(target_env = "gnu")]
fn limit_malloc_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    // SAFETY: called first thing in main, before this process starts any
    // thread, so no other thread can be allocating while glibc changes the
    // setting; mallopt takes no pointer. A failure (0) leaves glibc's default.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    }
}

#[cfg(not(target_env = "gnu"))]
fn limit_malloc_arenas() {}

fn main() -> ExitCode {
    limit_malloc_arenas();
    // The worker is started by the daemon with a socket on standard input:
    // no flags, no config, no runtime.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|arg| arg == profilerd::symbolize::worker::SUBCOMMAND)
    {
        return profilerd::symbolize::worker::run_worker();
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
    let result: anyhow::Result<()> = runtime.block_on(async {
        match cli.command {
            Some(Command::Record(args)) => Ok(profilerd::record::run(args).await?),
            Some(Command::CheckConfig { .. } | Command::SymbolizeWorker) => Ok(()),
            None => Ok(profilerd::daemon::run(cli.daemon).await?),
        }
    });
    // Dropping the runtime would wait for every blocking task, such as a
    // thread join the daemon gave up on to exit within its stop budget.
    runtime.shutdown_timeout(Duration::from_millis(200));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("profilerd: {}", Chain(err.as_ref()));
            err.downcast_ref::<profilerd::daemon::DaemonError>()
                .map_or(ExitCode::FAILURE, |err| ExitCode::from(err.exit_status()))
        }
    }
}
