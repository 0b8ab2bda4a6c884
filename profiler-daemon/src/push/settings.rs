//! What to push where: the `[push]` section of the config file and the
//! `--push*` flags, checked and resolved into [`PushSettings`].

use std::{fmt, path::PathBuf, str::FromStr, time::Duration};

use serde::Deserialize;

use crate::kind::ProfileType;

/// The API a target speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Grafana Pyroscope's `push.v1.PusherService/Push` (Connect, HTTP/1.1).
    Pyroscope,
    /// Parca's `parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw` (gRPC).
    Parca,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Self::Pyroscope => "pyroscope",
            Self::Parca => "parca",
        }
    }

    /// The name (`__name__`) this backend stores `profile_type` under; None
    /// when it is not pushed there (see its description in `kind.rs`).
    pub fn profile_name(self, profile_type: ProfileType) -> Option<&'static str> {
        let names = &profile_type.describe().push;
        match self {
            Self::Pyroscope => names.pyroscope,
            Self::Parca => names.parca,
        }
    }
}

/// Where a target is: `http://` or `https://`, a host, an optional port and
/// an optional path prefix (a backend served under a sub-path).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// Without a trailing slash; empty for none.
    pub prefix: String,
}

impl Endpoint {
    /// The URL of `method` (`/package.Service/Method`) on this endpoint.
    pub fn url_of(&self, method: &str) -> String {
        format!("{}{}", self.origin(), self.path_of(method))
    }

    /// The path of `method` on this endpoint, its prefix included.
    pub fn path_of(&self, method: &str) -> String {
        format!("{}{method}", self.prefix)
    }

    pub fn origin(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        let default_port = if self.tls { 443 } else { 80 };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == default_port {
            format!("{scheme}://{host}")
        } else {
            format!("{scheme}://{host}:{}", self.port)
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.origin(), self.prefix)
    }
}

impl FromStr for Endpoint {
    type Err = String;

    fn from_str(url: &str) -> Result<Self, String> {
        let (tls, rest) = if let Some(rest) = url.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err(format!("{url:?}: expected an http:// or https:// URL"));
        };
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if authority.contains('@') {
            return Err(format!(
                "{url:?}: credentials in the URL would show in logs and metrics; use basic_auth_user and basic_auth_password_file"
            ));
        }
        if path.contains(['?', '#']) {
            return Err(format!("{url:?}: expected no query or fragment"));
        }
        let (host, port) =
            split_host_port(authority).ok_or_else(|| format!("{url:?}: expected HOST[:PORT]"))?;
        Ok(Endpoint {
            tls,
            host: host.to_owned(),
            port: port.unwrap_or(if tls { 443 } else { 80 }),
            prefix: path.trim_end_matches('/').to_owned(),
        })
    }
}

fn split_host_port(authority: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let valid_host = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
    let port = match port {
        Some(port) => Some(port.parse().ok().filter(|&port| port > 0)?),
        None => None,
    };
    valid_host.then_some((host, port))
}

/// How a target is told who we are.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Auth {
    #[default]
    None,
    /// HTTP basic auth; the password is read from a file at every push, so
    /// that a rotated one is used without a restart.
    Basic { user: String, password_file: PathBuf },
    /// `Authorization: Bearer`, the token read from a file at every push.
    Bearer { token_file: PathBuf },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub backend: Backend,
    pub endpoint: Endpoint,
    pub auth: Auth,
    /// A CA (PEM) trusted besides the system's, for https.
    pub ca_file: Option<PathBuf>,
    /// Pyroscope's tenant (`X-Scope-OrgID`), for multi-tenant servers.
    pub tenant: Option<String>,
}

impl Target {
    /// How logs and metrics name it: `backend URL` (no credentials).
    pub fn name(&self) -> String {
        format!("{} {}", self.backend.name(), self.endpoint)
    }
}

/// `BACKEND=URL`, as `--push` takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetSpec {
    pub backend: Backend,
    pub endpoint: Endpoint,
}

impl FromStr for TargetSpec {
    type Err = String;

    fn from_str(spec: &str) -> Result<Self, String> {
        let (backend, url) = spec
            .split_once('=')
            .ok_or_else(|| format!("{spec:?}: expected BACKEND=URL, e.g. parca=http://127.0.0.1:7070"))?;
        let backend = match backend {
            "pyroscope" => Backend::Pyroscope,
            "parca" => Backend::Parca,
            other => return Err(format!("{other:?}: expected pyroscope or parca")),
        };
        Ok(TargetSpec {
            backend,
            endpoint: url.parse()?,
        })
    }
}

/// A `NAME=VALUE` label added to every series pushed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ExtraLabel {
    pub name: String,
    pub value: String,
}

impl FromStr for ExtraLabel {
    type Err = String;

    fn from_str(spec: &str) -> Result<Self, String> {
        let (name, value) = spec
            .split_once('=')
            .ok_or_else(|| format!("{spec:?}: expected NAME=VALUE"))?;
        ExtraLabel::new(name, value)
    }
}

/// Labels every series has of its own: not to be set as extra labels.
pub const RESERVED_LABELS: [&str; 2] = ["__name__", "service_name"];

impl ExtraLabel {
    /// Checked against Prometheus's label name rule, which both backends
    /// apply, and the names the series already carry.
    pub fn new(name: &str, value: &str) -> Result<Self, String> {
        let mut chars = name.chars();
        let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid || name.starts_with("__") {
            return Err(format!(
                "label name {name:?}: expected letters, digits and _, not starting with a digit or __"
            ));
        }
        if RESERVED_LABELS.contains(&name) {
            return Err(format!("label {name:?} is set by profilerd for every series"));
        }
        if value.is_empty() || value.len() > 1024 {
            return Err(format!("label {name:?}: expected a value of 1 to 1024 bytes"));
        }
        Ok(ExtraLabel {
            name: name.to_owned(),
            value: value.to_owned(),
        })
    }
}

/// The push configuration the daemon runs with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushSettings {
    pub targets: Vec<Target>,
    /// How often a window is cut and pushed.
    pub interval: Duration,
    /// Limit of one push attempt, connection included.
    pub timeout: Duration,
    pub labels: Vec<ExtraLabel>,
    /// Bound of each target's queue of windows not yet accepted.
    pub spool_bytes: usize,
    /// Where queued windows are kept across restarts, if anywhere.
    pub spool_dir: Option<PathBuf>,
    /// The `hostname` label.
    pub hostname: String,
}

/// The `[push]` section of the config file.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PushSection {
    pub interval_seconds: Option<u64>,
    pub timeout_seconds: Option<u64>,
    pub spool_kb: Option<u64>,
    pub spool_dir: Option<PathBuf>,
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub targets: Vec<TargetSection>,
}

/// One `[[push.targets]]` of the config file.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TargetSection {
    pub backend: Backend,
    pub url: String,
    pub tenant: Option<String>,
    pub basic_auth_user: Option<String>,
    pub basic_auth_password_file: Option<PathBuf>,
    pub bearer_token_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
}

/// Ranges of the numeric push settings, shared by flags and the file.
pub const INTERVAL_SECONDS: std::ops::RangeInclusive<u64> = 1..=3600;
pub const TIMEOUT_SECONDS: std::ops::RangeInclusive<u64> = 1..=300;
pub const SPOOL_KB: std::ops::RangeInclusive<u64> = 16..=67_108_864;

impl TargetSection {
    pub fn resolve(&self) -> Result<Target, String> {
        let auth = match (
            &self.basic_auth_user,
            &self.basic_auth_password_file,
            &self.bearer_token_file,
        ) {
            (None, None, None) => Auth::None,
            (Some(user), Some(password_file), None) => Auth::Basic {
                user: user.clone(),
                password_file: password_file.clone(),
            },
            (None, None, Some(token_file)) => Auth::Bearer {
                token_file: token_file.clone(),
            },
            (Some(_), None, _) | (None, Some(_), _) => {
                return Err(format!(
                    "{}: basic_auth_user and basic_auth_password_file go together",
                    self.url
                ));
            }
            (Some(_), Some(_), Some(_)) => {
                return Err(format!("{}: basic auth or a bearer token, not both", self.url));
            }
        };
        let tenant = self.tenant.clone().filter(|tenant| !tenant.is_empty());
        if let Some(tenant) = &tenant
            && (tenant.len() > 150 || !tenant.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(format!(
                "{}: tenant {tenant:?} is not a valid header value",
                self.url
            ));
        }
        Ok(Target {
            backend: self.backend,
            endpoint: self.url.parse()?,
            auth,
            ca_file: self.ca_file.clone().filter(|file| !file.as_os_str().is_empty()),
            tenant,
        })
    }
}

impl PushSection {
    /// Range checks of the numbers, for the config file's own errors.
    pub fn numbers(&self) -> [(&'static str, Option<u64>, std::ops::RangeInclusive<u64>); 3] {
        [
            ("push.interval_seconds", self.interval_seconds, INTERVAL_SECONDS),
            ("push.timeout_seconds", self.timeout_seconds, TIMEOUT_SECONDS),
            ("push.spool_kb", self.spool_kb, SPOOL_KB),
        ]
    }

    /// Checks what serde could not: targets and labels.
    pub fn check(&self) -> Result<(), String> {
        for target in &self.targets {
            target.resolve()?;
        }
        for (name, value) in &self.labels {
            ExtraLabel::new(name, value)?;
        }
        Ok(())
    }
}

/// The machine's name, for the `hostname` label.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

#[cfg(test)]
mod tests;
