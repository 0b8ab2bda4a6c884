//! `/etc/profilerd/profilerd.toml`: the daemon's settings, one key per
//! command-line flag. Flags given on the command line win over the file;
//! the file wins over the built-in defaults.

use std::{
    ops::RangeInclusive,
    path::{Path, PathBuf},
};

use clap::ArgMatches;
use serde::Deserialize;

use crate::{cli::DaemonArgs, serve::ListenAddress};

mod apply;
mod describe;
mod error;
pub use describe::describe;
pub use error::ConfigError;
use error::{line_of_key, parse_error};

pub const DEFAULT_PATH: &str = "/etc/profilerd/profilerd.toml";

/// Exit status for an unusable config file (sysexits' EX_CONFIG): the unit's
/// `RestartPreventExitStatus=` names it, since restarting cannot fix a file.
pub const EXIT_CONFIG: u8 = 78;

#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub listen: Option<ListenAddress>,
    pub retention_seconds: Option<u64>,
    pub store_max_mb: Option<u64>,
    pub store_user_share_percent: Option<u64>,
    pub frequency: Option<u64>,
    pub drain_interval_ms: Option<u64>,
    pub counts_map_entries: Option<u64>,
    pub user_stack_map_entries: Option<u64>,
    pub kernel_stack_map_entries: Option<u64>,
    pub max_open_files: Option<u64>,
    pub symbolizer_memory_mb: Option<u64>,
    pub symbolizer_deadline_ms: Option<u64>,
    pub debug_file_lines: Option<bool>,
    pub unwind: Option<crate::collect::UnwindMode>,
    pub unwind_table_memory_mb: Option<u64>,
    pub unwind_table_user_share_percent: Option<u64>,
    pub off_cpu: Option<bool>,
    pub python_frames: Option<bool>,
    pub proc_root: Option<PathBuf>,
    pub off_cpu_sample_every: Option<u64>,
    pub off_cpu_budget: Option<u64>,
    pub off_cpu_min_us: Option<u64>,
    pub alloc_sample_bytes: Option<u64>,
    pub alloc_max_processes: Option<u64>,
    pub alloc_budget_percent: Option<u64>,
    pub alloc_trace_comms: Option<Vec<String>>,
    pub alloc_trace_units: Option<Vec<String>>,
    pub alloc_trace_pids: Option<Vec<u32>>,
    pub http_max_connections: Option<u64>,
    pub http_header_timeout_ms: Option<u64>,
    pub http_idle_timeout_seconds: Option<u64>,
    pub scrape_concurrency: Option<u64>,
    pub scrape_queue: Option<u64>,
    pub scrape_memory_mb: Option<u64>,
    pub scrape_share_ms: Option<u64>,
    pub access_group: Option<String>,
    pub access_token_file: Option<PathBuf>,
    pub insecure: Option<bool>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    pub tls_client_ca_file: Option<PathBuf>,
    /// Where and how to push profiles (a `[push]` table after the keys above).
    pub push: Option<crate::push::settings::PushSection>,
}

/// The keys that are not numbers (RANGES has the others).
pub const OTHER_KEYS: [&str; 15] = [
    "listen",
    "debug_file_lines",
    "unwind",
    "off_cpu",
    "python_frames",
    "proc_root",
    "alloc_trace_comms",
    "alloc_trace_units",
    "alloc_trace_pids",
    "access_group",
    "access_token_file",
    "insecure",
    "tls_cert_file",
    "tls_key_file",
    "tls_client_ca_file",
];

/// The accepted range of each numeric key: the same as its flag's (a test
/// checks them against clap's).
pub const RANGES: [(&str, RangeInclusive<u64>); 26] = [
    ("retention_seconds", 1..=86_400),
    ("store_max_mb", 1..=65_536),
    ("store_user_share_percent", 0..=100),
    ("frequency", 1..=10_000),
    ("drain_interval_ms", 50..=60_000),
    ("counts_map_entries", 1..=1 << 22),
    ("user_stack_map_entries", 1..=1 << 20),
    ("kernel_stack_map_entries", 1..=1 << 20),
    ("max_open_files", 16..=65_536),
    ("symbolizer_memory_mb", 64..=65_536),
    ("symbolizer_deadline_ms", 100..=600_000),
    ("unwind_table_memory_mb", 1..=4096),
    ("unwind_table_user_share_percent", 0..=100),
    ("off_cpu_sample_every", 1..=1_000_000),
    ("off_cpu_budget", 0..=1_000_000),
    ("off_cpu_min_us", 0..=10_000_000),
    ("alloc_sample_bytes", 0..=1 << 30),
    ("alloc_max_processes", 1..=64),
    ("alloc_budget_percent", 1..=100),
    ("http_max_connections", 1..=65_536),
    ("http_header_timeout_ms", 100..=300_000),
    ("http_idle_timeout_seconds", 1..=3600),
    ("scrape_concurrency", 1..=64),
    ("scrape_queue", 0..=4096),
    ("scrape_memory_mb", 4..=65_536),
    ("scrape_share_ms", 0..=1000),
];

impl Config {
    /// Parses and validates a config file's text; `path` only names it in errors.
    pub fn parse(text: &str, path: &str) -> Result<Self, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|err| parse_error(text, path, &err))?;
        for (key, value) in config.numbers() {
            let Some(value) = value else { continue };
            let range = RANGES
                .iter()
                .find(|(name, _)| *name == key)
                .map(|(_, range)| range.clone());
            if let Some(range) = range
                && !range.contains(&value)
            {
                return Err(ConfigError::OutOfRange {
                    path: path.to_owned(),
                    line: line_of_key(text, key),
                    key,
                    value,
                    min: *range.start(),
                    max: *range.end(),
                });
            }
        }
        if let Some(root) = &config.proc_root {
            crate::procfs::check(root).map_err(|message| ConfigError::Parse {
                path: path.to_owned(),
                line: line_of_key(text, "proc_root"),
                message: format!("proc_root: {message}"),
            })?;
        }
        if let Some(push) = &config.push {
            for (key, value, range) in push.numbers() {
                if let Some(value) = value
                    && !range.contains(&value)
                {
                    let bare = key.trim_start_matches("push.");
                    return Err(ConfigError::OutOfRange {
                        path: path.to_owned(),
                        line: line_of_key(text, bare),
                        key,
                        value,
                        min: *range.start(),
                        max: *range.end(),
                    });
                }
            }
            push.check().map_err(|message| ConfigError::Parse {
                path: path.to_owned(),
                line: None,
                message: format!("[push]: {message}"),
            })?;
        }
        Ok(config)
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&text, &shown)
    }

    fn numbers(&self) -> [(&'static str, Option<u64>); 26] {
        [
            ("retention_seconds", self.retention_seconds),
            ("store_max_mb", self.store_max_mb),
            ("store_user_share_percent", self.store_user_share_percent),
            ("frequency", self.frequency),
            ("drain_interval_ms", self.drain_interval_ms),
            ("counts_map_entries", self.counts_map_entries),
            ("user_stack_map_entries", self.user_stack_map_entries),
            ("kernel_stack_map_entries", self.kernel_stack_map_entries),
            ("max_open_files", self.max_open_files),
            ("symbolizer_memory_mb", self.symbolizer_memory_mb),
            ("symbolizer_deadline_ms", self.symbolizer_deadline_ms),
            ("unwind_table_memory_mb", self.unwind_table_memory_mb),
            (
                "unwind_table_user_share_percent",
                self.unwind_table_user_share_percent,
            ),
            ("off_cpu_sample_every", self.off_cpu_sample_every),
            ("off_cpu_budget", self.off_cpu_budget),
            ("off_cpu_min_us", self.off_cpu_min_us),
            ("alloc_sample_bytes", self.alloc_sample_bytes),
            ("alloc_max_processes", self.alloc_max_processes),
            ("alloc_budget_percent", self.alloc_budget_percent),
            ("http_max_connections", self.http_max_connections),
            ("http_header_timeout_ms", self.http_header_timeout_ms),
            ("http_idle_timeout_seconds", self.http_idle_timeout_seconds),
            ("scrape_concurrency", self.scrape_concurrency),
            ("scrape_queue", self.scrape_queue),
            ("scrape_memory_mb", self.scrape_memory_mb),
            ("scrape_share_ms", self.scrape_share_ms),
        ]
    }
}

/// Applies the daemon's config file to `args`: the one given with --config
/// (which must exist), else `default_path` if it exists, else none. Returns
/// the file used.
pub fn apply_file(
    args: &mut DaemonArgs,
    matches: &ArgMatches,
    default_path: &Path,
) -> Result<Option<PathBuf>, ConfigError> {
    let path = match &args.config {
        Some(path) => path.clone(),
        None if default_path.exists() => default_path.to_owned(),
        None => return Ok(None),
    };
    Config::load(&path)?.apply(args, matches);
    Ok(Some(path))
}

#[cfg(test)]
mod tests;
