//! `/etc/profilerd/profilerd.toml`: the daemon's settings, one key per
//! command-line flag. Flags given on the command line win over the file;
//! the file wins over the built-in defaults.

use std::{net::SocketAddr, ops::RangeInclusive, path::Path};

use clap::{ArgMatches, parser::ValueSource};
use serde::Deserialize;

use crate::cli::DaemonArgs;

pub const DEFAULT_PATH: &str = "/etc/profilerd/profilerd.toml";

#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub listen: Option<SocketAddr>,
    pub retention_seconds: Option<u64>,
    pub store_max_mb: Option<u64>,
    pub frequency: Option<u64>,
    pub drain_interval_ms: Option<u64>,
    pub counts_map_entries: Option<u64>,
    pub user_stack_map_entries: Option<u64>,
    pub kernel_stack_map_entries: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{path}: {key} = {value} is out of range; expected {min} to {max}")]
    OutOfRange {
        path: String,
        key: &'static str,
        value: u64,
        min: u64,
        max: u64,
    },
}

/// The accepted range of each numeric key: the same as its flag's.
const RANGES: [(&str, RangeInclusive<u64>); 7] = [
    ("retention_seconds", 1..=86_400),
    ("store_max_mb", 1..=65_536),
    ("frequency", 1..=10_000),
    ("drain_interval_ms", 50..=60_000),
    ("counts_map_entries", 1..=1 << 22),
    ("user_stack_map_entries", 1..=1 << 20),
    ("kernel_stack_map_entries", 1..=1 << 20),
];

impl Config {
    /// Parses and validates a config file's text; `path` only names it in errors.
    pub fn parse(text: &str, path: &str) -> Result<Self, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|err| ConfigError::Parse {
            path: path.to_owned(),
            // toml's message names the key and the line; keep it on one line.
            message: err
                .to_string()
                .replace('\n', " ")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
        })?;
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
                    key,
                    value,
                    min: *range.start(),
                    max: *range.end(),
                });
            }
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

    fn numbers(&self) -> [(&'static str, Option<u64>); 7] {
        [
            ("retention_seconds", self.retention_seconds),
            ("store_max_mb", self.store_max_mb),
            ("frequency", self.frequency),
            ("drain_interval_ms", self.drain_interval_ms),
            ("counts_map_entries", self.counts_map_entries),
            ("user_stack_map_entries", self.user_stack_map_entries),
            ("kernel_stack_map_entries", self.kernel_stack_map_entries),
        ]
    }

    /// Sets every key of the file into `args`, except those whose flag was
    /// given on the command line (per `matches`).
    pub fn apply(&self, args: &mut DaemonArgs, matches: &ArgMatches) {
        let from_flag = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
        let narrow = |value: u64| u32::try_from(value).unwrap_or(u32::MAX);
        if let Some(listen) = self.listen
            && !from_flag("listen")
        {
            args.listen = listen;
        }
        let sampling = &mut args.sampling;
        let set_u64 = |target: &mut u64, value: Option<u64>, id: &str| {
            if let Some(value) = value
                && !from_flag(id)
            {
                *target = value;
            }
        };
        set_u64(
            &mut args.retention_seconds,
            self.retention_seconds,
            "retention_seconds",
        );
        set_u64(&mut args.store_max_mb, self.store_max_mb, "store_max_mb");
        set_u64(&mut sampling.frequency, self.frequency, "frequency");
        set_u64(
            &mut sampling.drain_interval_ms,
            self.drain_interval_ms,
            "drain_interval_ms",
        );
        for (target, value, id) in [
            (
                &mut sampling.counts_map_entries,
                self.counts_map_entries,
                "counts_map_entries",
            ),
            (
                &mut sampling.user_stack_map_entries,
                self.user_stack_map_entries,
                "user_stack_map_entries",
            ),
            (
                &mut sampling.kernel_stack_map_entries,
                self.kernel_stack_map_entries,
                "kernel_stack_map_entries",
            ),
        ] {
            if let Some(value) = value
                && !from_flag(id)
            {
                *target = narrow(value);
            }
        }
    }
}

/// The effective settings, as `check-config` prints them.
pub fn describe(args: &DaemonArgs) -> String {
    let s = &args.sampling;
    format!(
        "listen = \"{}\"\nretention_seconds = {}\nstore_max_mb = {}\nfrequency = {}\ndrain_interval_ms = {}\n\
         counts_map_entries = {}\nuser_stack_map_entries = {}\nkernel_stack_map_entries = {}\n",
        args.listen,
        args.retention_seconds,
        args.store_max_mb,
        s.frequency,
        s.drain_interval_ms,
        s.counts_map_entries,
        s.user_stack_map_entries,
        s.kernel_stack_map_entries
    )
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches};

    use super::*;
    use crate::cli::Cli;

    fn daemon_args(argv: &[&str]) -> (DaemonArgs, ArgMatches) {
        let matches = Cli::command().get_matches_from(argv);
        let cli = Cli::from_arg_matches(&matches).expect("valid arguments");
        (cli.daemon, matches)
    }

    #[test]
    fn an_unknown_key_is_named() {
        let err = Config::parse("frequency = 99\nfrequncy = 5\n", "test.toml").expect_err("typo must fail");
        let message = err.to_string();
        assert!(
            message.contains("frequncy") && message.contains("test.toml"),
            "{message}"
        );
        assert!(!message.contains('\n'), "one line: {message}");
    }

    #[test]
    fn a_bad_value_is_named_with_its_range() {
        let err = Config::parse("frequency = 0\n", "t.toml").expect_err("0 Hz must fail");
        assert_eq!(
            err.to_string(),
            "t.toml: frequency = 0 is out of range; expected 1 to 10000"
        );
        let err = Config::parse("listen = \"nowhere\"\n", "t.toml").expect_err("a bad address must fail");
        assert!(err.to_string().contains("listen"), "{err}");
    }

    #[test]
    fn flags_override_the_file_which_overrides_defaults() {
        let config = Config::parse(
            "frequency = 199\nretention_seconds = 600\nlisten = \"127.0.0.1:9000\"\n",
            "t",
        )
        .expect("valid");
        let (mut args, matches) = daemon_args(&["profilerd", "--frequency", "49"]);
        config.apply(&mut args, &matches);
        assert_eq!(args.sampling.frequency, 49, "the flag wins");
        assert_eq!(args.retention_seconds, 600, "the file beats the default");
        assert_eq!(args.listen.to_string(), "127.0.0.1:9000");
        assert_eq!(args.store_max_mb, 64, "untouched keys keep their default");
    }

    #[test]
    fn the_shipped_default_config_is_valid_and_documents_every_key() {
        let text = include_str!("../../deploy/profilerd.toml");
        Config::parse(text, "deploy/profilerd.toml").expect("the shipped config parses");
        for key in ["listen", "retention_seconds", "store_max_mb"]
            .iter()
            .chain(RANGES.iter().map(|(key, _)| key))
        {
            assert!(
                text.contains(&format!("# {key} =")),
                "deploy/profilerd.toml should document {key}"
            );
        }
    }
}
