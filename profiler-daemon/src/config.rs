//! `/etc/profilerd/profilerd.toml`: the daemon's settings, one key per
//! command-line flag. Flags given on the command line win over the file;
//! the file wins over the built-in defaults.

use std::{
    ops::RangeInclusive,
    path::{Path, PathBuf},
};

use clap::{ArgMatches, parser::ValueSource};
use serde::Deserialize;

use crate::{cli::DaemonArgs, serve::ListenAddress};

mod describe;
pub use describe::describe;

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
    pub unwind: Option<crate::collect::UnwindMode>,
    pub unwind_table_memory_mb: Option<u64>,
    pub unwind_table_user_share_percent: Option<u64>,
    pub off_cpu: Option<bool>,
    pub python_frames: Option<bool>,
    pub proc_root: Option<PathBuf>,
    pub off_cpu_sample_every: Option<u64>,
    pub off_cpu_min_us: Option<u64>,
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

/// Every error names the file and, when known, the line (`FILE:LINE:`), so
/// editors and `journalctl` readers land on it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{}{message}", line_prefix(*.line))]
    Parse {
        path: String,
        line: Option<usize>,
        message: String,
    },
    #[error("{path}:{}{key} = {value} is out of range; expected {min} to {max}", line_prefix(*.line))]
    OutOfRange {
        path: String,
        line: Option<usize>,
        key: &'static str,
        value: u64,
        min: u64,
        max: u64,
    },
}

fn line_prefix(line: Option<usize>) -> String {
    line.map_or_else(|| " ".to_owned(), |line| format!("{line}: "))
}

/// The keys that are not numbers (RANGES has the others).
pub const OTHER_KEYS: [&str; 11] = [
    "listen",
    "unwind",
    "off_cpu",
    "python_frames",
    "proc_root",
    "access_group",
    "access_token_file",
    "insecure",
    "tls_cert_file",
    "tls_key_file",
    "tls_client_ca_file",
];

/// The accepted range of each numeric key: the same as its flag's (a test
/// checks them against clap's).
pub const RANGES: [(&str, RangeInclusive<u64>); 22] = [
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
    ("off_cpu_min_us", 0..=10_000_000),
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

    fn numbers(&self) -> [(&'static str, Option<u64>); 22] {
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
            ("off_cpu_min_us", self.off_cpu_min_us),
            ("http_max_connections", self.http_max_connections),
            ("http_header_timeout_ms", self.http_header_timeout_ms),
            ("http_idle_timeout_seconds", self.http_idle_timeout_seconds),
            ("scrape_concurrency", self.scrape_concurrency),
            ("scrape_queue", self.scrape_queue),
            ("scrape_memory_mb", self.scrape_memory_mb),
            ("scrape_share_ms", self.scrape_share_ms),
        ]
    }

    /// Sets every key of the file into `args`, except those whose flag was
    /// given on the command line (per `matches`).
    pub fn apply(&self, args: &mut DaemonArgs, matches: &ArgMatches) {
        let from_file = |id: &str| matches.value_source(id) != Some(ValueSource::CommandLine);
        fn set<T: Copy>(target: &mut T, value: Option<T>, from_file: bool) {
            if let (Some(value), true) = (value, from_file) {
                *target = value;
            }
        }
        // Only reached with values inside RANGES, which all fit in u32.
        let narrow = |value: Option<u64>| value.map(|value| u32::try_from(value).unwrap_or(u32::MAX));
        let sampling = &mut args.sampling;
        if let (Some(listen), true) = (&self.listen, from_file("listen")) {
            args.listen = listen.clone();
        }
        set(
            &mut args.retention_seconds,
            self.retention_seconds,
            from_file("retention_seconds"),
        );
        set(
            &mut args.store_max_mb,
            self.store_max_mb,
            from_file("store_max_mb"),
        );
        set(
            &mut args.store_user_share_percent,
            self.store_user_share_percent,
            from_file("store_user_share_percent"),
        );
        set(&mut sampling.frequency, self.frequency, from_file("frequency"));
        set(
            &mut sampling.drain_interval_ms,
            self.drain_interval_ms,
            from_file("drain_interval_ms"),
        );
        set(
            &mut sampling.counts_map_entries,
            narrow(self.counts_map_entries),
            from_file("counts_map_entries"),
        );
        set(
            &mut sampling.user_stack_map_entries,
            narrow(self.user_stack_map_entries),
            from_file("user_stack_map_entries"),
        );
        set(
            &mut sampling.kernel_stack_map_entries,
            narrow(self.kernel_stack_map_entries),
            from_file("kernel_stack_map_entries"),
        );
        set(
            &mut sampling.max_open_files,
            narrow(self.max_open_files),
            from_file("max_open_files"),
        );
        set(
            &mut sampling.symbolizer_memory_mb,
            self.symbolizer_memory_mb,
            from_file("symbolizer_memory_mb"),
        );
        set(
            &mut sampling.symbolizer_deadline_ms,
            self.symbolizer_deadline_ms,
            from_file("symbolizer_deadline_ms"),
        );
        set(&mut sampling.unwind, self.unwind, from_file("unwind"));
        set(
            &mut sampling.unwind_table_memory_mb,
            self.unwind_table_memory_mb,
            from_file("unwind_table_memory_mb"),
        );
        set(
            &mut sampling.unwind_table_user_share_percent,
            self.unwind_table_user_share_percent,
            from_file("unwind_table_user_share_percent"),
        );
        set(&mut sampling.off_cpu, self.off_cpu, from_file("off_cpu"));
        if let (Some(on), true) = (self.python_frames, from_file("python_frames")) {
            sampling.no_python_frames = !on;
        }
        if let (Some(root), true) = (&self.proc_root, from_file("proc_root")) {
            sampling.proc_root.clone_from(root);
        }
        set(
            &mut sampling.off_cpu_sample_every,
            self.off_cpu_sample_every,
            from_file("off_cpu_sample_every"),
        );
        set(
            &mut sampling.off_cpu_min_us,
            self.off_cpu_min_us,
            from_file("off_cpu_min_us"),
        );
        if let (Some(file), true) = (&self.access_token_file, from_file("access_token_file")) {
            // `check-config` prints "" for none.
            args.access_token_file = (!file.as_os_str().is_empty()).then(|| file.clone());
        }
        set(&mut args.insecure, self.insecure, from_file("insecure"));
        for (file, target, id) in [
            (&self.tls_cert_file, &mut args.tls.tls_cert_file, "tls_cert_file"),
            (&self.tls_key_file, &mut args.tls.tls_key_file, "tls_key_file"),
            (
                &self.tls_client_ca_file,
                &mut args.tls.tls_client_ca_file,
                "tls_client_ca_file",
            ),
        ] {
            if let (Some(file), true) = (file, from_file(id)) {
                *target = (!file.as_os_str().is_empty()).then(|| file.clone());
            }
        }
        if let (Some(group), true) = (&self.access_group, from_file("access_group")) {
            args.access_group.clone_from(group);
        }
        let http = &mut args.http;
        set(
            &mut http.http_max_connections,
            self.http_max_connections,
            from_file("http_max_connections"),
        );
        set(
            &mut http.http_header_timeout_ms,
            self.http_header_timeout_ms,
            from_file("http_header_timeout_ms"),
        );
        set(
            &mut http.http_idle_timeout_seconds,
            self.http_idle_timeout_seconds,
            from_file("http_idle_timeout_seconds"),
        );
        for (target, value, key) in [
            (
                &mut http.scrape_concurrency,
                self.scrape_concurrency,
                "scrape_concurrency",
            ),
            (&mut http.scrape_queue, self.scrape_queue, "scrape_queue"),
            (
                &mut http.scrape_memory_mb,
                self.scrape_memory_mb,
                "scrape_memory_mb",
            ),
            (&mut http.scrape_share_ms, self.scrape_share_ms, "scrape_share_ms"),
        ] {
            set(target, value, from_file(key));
        }
        if let Some(push) = &self.push {
            args.push.apply_section(push, &from_file);
        }
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

/// toml's own message (which names an unknown key and lists the known ones),
/// on one line, at `FILE:LINE:`; for a bad value, the key it belongs to.
fn parse_error(text: &str, path: &str, err: &toml::de::Error) -> ConfigError {
    let message = err.message().split_whitespace().collect::<Vec<_>>().join(" ");
    let line = err.span().map(|span| line_number(text, span.start));
    let key = line
        .and_then(|line| text.lines().nth(line - 1))
        .and_then(|text| text.split_once('='))
        .map(|(key, _)| key.trim().trim_matches('"'))
        .filter(|key| !key.is_empty() && !message.contains(&format!("`{key}`")));
    ConfigError::Parse {
        path: path.to_owned(),
        line,
        message: match key {
            Some(key) => format!("{key}: {message}"),
            None => message,
        },
    }
}

/// 1-based line of a byte offset.
fn line_number(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&byte| byte == b'\n')
        .count()
        + 1
}

/// The 1-based line where `key = ...` is set, for a value that parsed but is invalid.
fn line_of_key(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|line| {
            line.split_once('=')
                .is_some_and(|(name, _)| name.trim().trim_matches('"') == key)
        })
        .map(|index| index + 1)
}

#[cfg(test)]
mod tests;
