//! The `--push*` flags, and how they and the config file's `[push]`
//! section make the [`PushSettings`] the daemon runs with.

use std::{path::PathBuf, time::Duration};

use clap::Args;

use super::settings::{self, ExtraLabel, PushSection, PushSettings, Target, TargetSection, TargetSpec};

/// Each push flag and the `[push]` key that sets it (`targets.KEY`: a key
/// of each `[[push.targets]]`).
pub const FLAG_KEYS: [(&str, &str); 11] = [
    ("push", "targets"),
    ("push_interval_seconds", "interval_seconds"),
    ("push_timeout_seconds", "timeout_seconds"),
    ("push_labels", "labels"),
    ("push_spool_kb", "spool_kb"),
    ("push_spool_dir", "spool_dir"),
    ("push_bearer_token_file", "targets.bearer_token_file"),
    ("push_basic_auth_user", "targets.basic_auth_user"),
    (
        "push_basic_auth_password_file",
        "targets.basic_auth_password_file",
    ),
    ("push_ca_file", "targets.ca_file"),
    ("push_tenant", "targets.tenant"),
];

/// Pushing profiles to Pyroscope or Parca. Per-target settings of targets
/// given with --push come from the --push-* flags below; the config file's
/// `[[push.targets]]` set them per target.
#[derive(Debug, Clone, Args)]
pub struct PushArgs {
    /// Push CPU profiles to BACKEND at URL, e.g. `parca=http://parca:7070`
    /// or `pyroscope=https://profiles-prod-001.grafana.net` (repeatable).
    #[arg(long = "push", value_name = "BACKEND=URL")]
    pub push: Vec<TargetSpec>,
    /// How often a window of profiles is pushed, in seconds.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub push_interval_seconds: u64,
    /// Limit of one push attempt, in seconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub push_timeout_seconds: u64,
    /// A label added to every pushed series (repeatable), e.g. `env=prod`.
    #[arg(long = "push-label", value_name = "NAME=VALUE")]
    pub push_labels: Vec<ExtraLabel>,
    /// Bound of each target's queue of windows not yet accepted, in KiB
    /// (65536: 64 MiB); past it the oldest windows are dropped (and counted).
    #[arg(long, default_value_t = 65_536, value_parser = clap::value_parser!(u64).range(16..=67_108_864))]
    pub push_spool_kb: u64,
    /// Keep queued windows in this directory (created 0700) too, so that a
    /// restart sends what was not yet accepted.
    #[arg(long)]
    pub push_spool_dir: Option<PathBuf>,
    /// Send `Authorization: Bearer` with the token in this file.
    #[arg(long)]
    pub push_bearer_token_file: Option<PathBuf>,
    /// Basic auth user (with --push-basic-auth-password-file).
    #[arg(long)]
    pub push_basic_auth_user: Option<String>,
    /// Basic auth password, read from this file at every push.
    #[arg(long)]
    pub push_basic_auth_password_file: Option<PathBuf>,
    /// A CA (PEM) to trust for https targets, besides the system's.
    #[arg(long)]
    pub push_ca_file: Option<PathBuf>,
    /// Pyroscope tenant (`X-Scope-OrgID`), for multi-tenant servers.
    #[arg(long)]
    pub push_tenant: Option<String>,
    /// The config file's targets, when no --push is given.
    #[arg(skip)]
    pub file_targets: Vec<TargetSection>,
}

impl PushArgs {
    /// The `[push]` section into the push flags not given on the command line;
    /// its targets only when no --push is.
    pub fn apply_section(&mut self, push: &PushSection, from_file: &dyn Fn(&str) -> bool) {
        let args = self;
        for (value, target, id) in [
            (
                push.interval_seconds,
                &mut args.push_interval_seconds,
                "push_interval_seconds",
            ),
            (
                push.timeout_seconds,
                &mut args.push_timeout_seconds,
                "push_timeout_seconds",
            ),
            (push.spool_kb, &mut args.push_spool_kb, "push_spool_kb"),
        ] {
            if let (Some(value), true) = (value, from_file(id)) {
                *target = value;
            }
        }
        if let (Some(dir), true) = (&push.spool_dir, from_file("push_spool_dir")) {
            args.push_spool_dir = (!dir.as_os_str().is_empty()).then(|| dir.clone());
        }
        if from_file("push_labels") && !push.labels.is_empty() {
            // Checked by `Config::parse`.
            args.push_labels = push
                .labels
                .iter()
                .filter_map(|(name, value)| ExtraLabel::new(name, value).ok())
                .collect();
        }
        if from_file("push") {
            args.file_targets.clone_from(&push.targets);
        }
    }

    /// The settings, checked: every target's URL and auth, and the
    /// interval against the store's retention (a window must still be in
    /// the store when it is cut).
    pub fn settings(&self, retention: Duration) -> Result<PushSettings, String> {
        let mut targets: Vec<Target> = Vec::new();
        for spec in &self.push {
            let section = TargetSection {
                backend: spec.backend,
                url: spec.endpoint.to_string(),
                tenant: self.push_tenant.clone(),
                basic_auth_user: self.push_basic_auth_user.clone(),
                basic_auth_password_file: self.push_basic_auth_password_file.clone(),
                bearer_token_file: self.push_bearer_token_file.clone(),
                ca_file: self.push_ca_file.clone(),
            };
            targets.push(section.resolve().map_err(|err| format!("--push: {err}"))?);
        }
        for section in &self.file_targets {
            targets.push(
                section
                    .resolve()
                    .map_err(|err| format!("[[push.targets]]: {err}"))?,
            );
        }
        let interval = Duration::from_secs(self.push_interval_seconds);
        if !targets.is_empty() && interval >= retention {
            return Err(format!(
                "push interval {}s: expected less than retention_seconds ({}s), or windows expire before they are pushed",
                interval.as_secs(),
                retention.as_secs()
            ));
        }
        Ok(PushSettings {
            targets,
            interval,
            timeout: Duration::from_secs(self.push_timeout_seconds),
            labels: self.push_labels.clone(),
            spool_bytes: usize::try_from(self.push_spool_kb << 10).unwrap_or(usize::MAX),
            spool_dir: self
                .push_spool_dir
                .clone()
                .filter(|dir| !dir.as_os_str().is_empty()),
            hostname: settings::hostname(),
        })
    }
}

/// The `[push]` section as `check-config` prints it (valid TOML, after
/// every top-level key).
pub fn describe(args: &PushArgs) -> String {
    let mut out = format!(
        "\n[push]\ninterval_seconds = {}\ntimeout_seconds = {}\nspool_kb = {}\nspool_dir = {:?}\n",
        args.push_interval_seconds,
        args.push_timeout_seconds,
        args.push_spool_kb,
        args.push_spool_dir
            .as_ref()
            .map(|dir| dir.display().to_string())
            .unwrap_or_default(),
    );
    let labels: Vec<String> = args
        .push_labels
        .iter()
        .map(|label| format!("{} = {:?}", label.name, label.value))
        .collect();
    out.push_str(&format!("labels = {{ {} }}\n", labels.join(", ")));
    let from_flags = args.push.iter().map(|spec| TargetSection {
        backend: spec.backend,
        url: spec.endpoint.to_string(),
        tenant: args.push_tenant.clone(),
        basic_auth_user: args.push_basic_auth_user.clone(),
        basic_auth_password_file: args.push_basic_auth_password_file.clone(),
        bearer_token_file: args.push_bearer_token_file.clone(),
        ca_file: args.push_ca_file.clone(),
    });
    for target in from_flags.chain(args.file_targets.iter().cloned()) {
        out.push_str(&format!(
            "\n[[push.targets]]\nbackend = \"{}\"\nurl = {:?}\n",
            target.backend.name(),
            target.url
        ));
        let optional = [
            ("tenant", target.tenant.clone()),
            ("basic_auth_user", target.basic_auth_user.clone()),
            (
                "basic_auth_password_file",
                shown(target.basic_auth_password_file.as_ref()),
            ),
            ("bearer_token_file", shown(target.bearer_token_file.as_ref())),
            ("ca_file", shown(target.ca_file.as_ref())),
        ];
        for (key, value) in optional {
            if let Some(value) = value {
                out.push_str(&format!("{key} = {value:?}\n"));
            }
        }
    }
    out
}

fn shown(path: Option<&PathBuf>) -> Option<String> {
    path.map(|path| path.display().to_string())
}
