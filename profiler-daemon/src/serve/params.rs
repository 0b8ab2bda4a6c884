//! Query-string parsing and validation for the profile endpoints: pure, so
//! every accepted and rejected input is unit-tested here.

use std::fmt;

use crate::{cgroup, kind::ProfileType, profile::Filter};

mod window;
pub use window::{Span, stored_part};

/// Longer query strings are refused before parsing (no legitimate request
/// comes close; a long one is a mistake or an attack).
pub const MAX_QUERY_BYTES: usize = 4096;
/// Parameters every profile endpoint accepts.
const COMMON_PARAMETERS: [&str; 10] = [
    "pid",
    "tid",
    "comm",
    "unit",
    "cgroup",
    "container",
    "seconds",
    "start",
    "end",
    "type",
];
/// Bytes of a rejected value quoted back in an error message.
const MAX_QUOTED: usize = 64;
/// `/proc/PID/comm` of kernel workers can exceed TASK_COMM_LEN; nothing is longer.
const MAX_COMM_BYTES: usize = 64;

/// What bounds the accepted values.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// `/proc/sys/kernel/pid_max`: the largest pid (and tid) plus one.
    pub pid_max: u32,
    /// Longest window a request may ask for: the store's retention.
    pub max_seconds: u64,
}

/// A validated profile request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileParams {
    /// `seconds=`, or `start=` and `end=`.
    pub span: Span,
    pub filter: Filter,
    /// `type=`.
    pub profile_type: ProfileType,
}

/// A validated Go-compatible profile request: it blocks `seconds`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoParams {
    pub seconds: u64,
    pub filter: Filter,
    /// Said by the path.
    pub profile_type: ProfileType,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    #[error("query string too long: {len} bytes; at most {MAX_QUERY_BYTES} are accepted")]
    TooLong { len: usize },
    #[error("{name}: {value} is not accepted; expected {expected}")]
    Invalid {
        name: &'static str,
        value: Quoted,
        expected: String,
    },
    #[error("{name}: given more than once; expected a single value")]
    Repeated { name: &'static str },
    #[error(
        "seconds cannot be given with start or end: seconds=N asks for the last N seconds, start and end for a window in Unix milliseconds; give one or the other"
    )]
    SecondsAndWindow,
    #[error(
        "{given} without {missing}: a window needs both start and end, in Unix milliseconds (start inclusive, end exclusive)"
    )]
    HalfWindow {
        given: &'static str,
        missing: &'static str,
    },
    #[error("start {start} is not before end {end}; expected start < end (Unix milliseconds, end exclusive)")]
    EmptyWindow { start: u64, end: u64 },
    #[error("start to end is {ms} ms; at most {max_ms} ms (the retention) is accepted")]
    WindowTooLong { ms: u64, max_ms: u64 },
    #[error("unknown parameter {name}; accepted: {accepted}")]
    Unknown { name: Quoted, accepted: String },
}

/// A user-supplied string, quoted and shortened for a one-line message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quoted(String);

impl Quoted {
    pub fn new(value: &str) -> Self {
        let mut end = value.len().min(MAX_QUOTED);
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        let ellipsis = if end < value.len() { "..." } else { "" };
        // Debug formatting escapes quotes, newlines and control characters.
        Self(format!("{:?}{ellipsis}", &value[..end]))
    }
}

impl fmt::Display for Quoted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An endpoint's own parameters as (name, value), for it to validate.
pub type EndpointOptions = Vec<(&'static str, String)>;

/// `/pprof`: strict. Unknown parameters and bad seconds are errors; seconds
/// defaults to [`window::DEFAULT_SECONDS`] (or the retention if that is shorter);
/// `start` and `end` come together, instead of `seconds`.
pub fn parse_pprof(query: Option<&str>, limits: &Limits) -> Result<ProfileParams, ParamError> {
    parse_with_options(query, limits, &[]).map(|(params, _)| params)
}

/// As [`parse_pprof`], plus the endpoint's own `options` (each at most once),
/// returned as (name, value) for the endpoint to validate.
pub fn parse_with_options(
    query: Option<&str>,
    limits: &Limits,
    options: &[&'static str],
) -> Result<(ProfileParams, EndpointOptions), ParamError> {
    let parsed = parse(query, limits, Mode::Strict, options)?;
    let params = ProfileParams {
        span: parsed.window.span(limits)?,
        filter: parsed.filter,
        profile_type: parsed.profile_type.unwrap_or_default(),
    };
    Ok((params, parsed.options))
}

/// `/debug/pprof/profile` (and `offcpu`, `wall`): as Go's handler, a
/// missing, unparsable or non-positive `seconds` means 30, and unknown
/// parameters are ignored (`type` too: the path names the profile); seconds
/// beyond the retention and bad filters are still errors. `start` and `end`
/// are not theirs: ignored, as any parameter Go does not know.
pub fn parse_go_profile(
    query: Option<&str>,
    limits: &Limits,
    profile_type: ProfileType,
) -> Result<GoParams, ParamError> {
    let parsed = parse(query, limits, Mode::Go, &[])?;
    Ok(GoParams {
        seconds: parsed.window.into_go_seconds(limits),
        filter: parsed.filter,
        profile_type,
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Strict,
    Go,
}

/// A query string, each parameter checked on its own.
struct Parsed {
    window: window::Given,
    filter: Filter,
    profile_type: Option<ProfileType>,
    options: EndpointOptions,
}

fn parse(
    query: Option<&str>,
    limits: &Limits,
    mode: Mode,
    options: &[&'static str],
) -> Result<Parsed, ParamError> {
    let mut chosen = EndpointOptions::new();
    let query = query.unwrap_or_default();
    if query.len() > MAX_QUERY_BYTES {
        return Err(ParamError::TooLong { len: query.len() });
    }
    let mut filter = Filter::default();
    let mut window = window::Given::default();
    let mut profile_type: Option<ProfileType> = None;
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        match &*name {
            "pid" => push_ids(&mut filter.pids, "pid", "process", &value, limits)?,
            "tid" => push_ids(&mut filter.tids, "tid", "thread", &value, limits)?,
            "comm" => {
                let comm = parse_comm(&value)?;
                if !filter.comms.contains(&comm) {
                    filter.comms.push(comm);
                }
            }
            "unit" => push_units(&mut filter.units, &value)?,
            "cgroup" => {
                let prefix = parse_cgroup(&value)?;
                if !filter.cgroups.contains(&prefix) {
                    filter.cgroups.push(prefix);
                }
            }
            "container" => push_containers(&mut filter.containers, &value)?,
            "seconds" => match mode {
                Mode::Strict => window.strict_seconds(&value, limits)?,
                Mode::Go => window.go_seconds(&value, limits)?,
            },
            "start" if mode == Mode::Strict => window.bound("start", &value)?,
            "end" if mode == Mode::Strict => window.bound("end", &value)?,
            "type" if mode == Mode::Strict => {
                if profile_type.is_some() {
                    return Err(ParamError::Invalid {
                        name: "type",
                        value: Quoted::new(&value),
                        expected: "a single value".to_owned(),
                    });
                }
                profile_type = Some(ProfileType::parse(&value).ok_or_else(|| ParamError::Invalid {
                    name: "type",
                    value: Quoted::new(&value),
                    expected: format!("a profile type: {}", ProfileType::accepted()),
                })?);
            }
            _ if mode == Mode::Go => {}
            other => match options.iter().find(|option| **option == other) {
                Some(&option) if chosen.iter().any(|(seen, _)| *seen == option) => {
                    return Err(ParamError::Invalid {
                        name: option,
                        value: Quoted::new(&value),
                        expected: "a single value".to_owned(),
                    });
                }
                Some(&option) => chosen.push((option, value.into_owned())),
                None => {
                    return Err(ParamError::Unknown {
                        name: Quoted::new(&name),
                        // This endpoint's own list, so the message says what would work here.
                        accepted: COMMON_PARAMETERS
                            .iter()
                            .chain(options)
                            .copied()
                            .collect::<Vec<_>>()
                            .join(", "),
                    });
                }
            },
        }
    }
    Ok(Parsed {
        window,
        filter,
        profile_type,
        options: chosen,
    })
}

/// One value of a repeatable id parameter: `1,2,3`.
fn push_ids(
    ids: &mut Vec<u32>,
    name: &'static str,
    what: &str,
    value: &str,
    limits: &Limits,
) -> Result<(), ParamError> {
    // Ids are below pid_max.
    let max = limits.pid_max.saturating_sub(1).max(1);
    for part in value.split(',') {
        let id = parse_decimal(part)
            .and_then(|id| u32::try_from(id).ok())
            .filter(|id| (1..=max).contains(id))
            .ok_or_else(|| ParamError::Invalid {
                name,
                value: Quoted::new(part),
                expected: format!("a {what} id from 1 to {max}; repeat {name}= or separate ids with commas"),
            })?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(())
}

fn parse_comm(value: &str) -> Result<String, ParamError> {
    if value.is_empty() || value.len() > MAX_COMM_BYTES || value.chars().any(char::is_control) {
        return Err(ParamError::Invalid {
            name: "comm",
            value: Quoted::new(value),
            expected: format!("a process name of 1 to {MAX_COMM_BYTES} bytes, as in /proc/PID/comm"),
        });
    }
    Ok(value.to_owned())
}

/// `unit=nginx.service,user@1000.service/app.service`: exact unit names as
/// [`cgroup::unit_of`] gives them.
fn push_units(units: &mut Vec<String>, value: &str) -> Result<(), ParamError> {
    for part in value.split(',') {
        // A name is valid when it is what a cgroup of that name would give.
        let valid = cgroup::unit_of(&format!("/{part}")).as_deref() == Some(part);
        if !valid {
            return Err(ParamError::Invalid {
                name: "unit",
                value: Quoted::new(part),
                expected: "a systemd unit name such as nginx.service (a user's unit: user@1000.service/app.service); repeat unit= or separate names with commas".to_owned(),
            });
        }
        if !units.iter().any(|unit| unit == part) {
            units.push(part.to_owned());
        }
    }
    Ok(())
}

/// `cgroup=/system.slice`: a path prefix, normalized. Not split on commas:
/// cgroup names may hold them.
fn parse_cgroup(value: &str) -> Result<String, ParamError> {
    if value.len() > cgroup::MAX_PATH_BYTES
        || value.chars().any(char::is_control)
        || value.split('/').any(|part| part == "." || part == "..")
    {
        return Err(ParamError::Invalid {
            name: "cgroup",
            value: Quoted::new(value),
            expected: format!(
                "a cgroup path prefix such as /system.slice, at most {} bytes, without . or .. components",
                cgroup::MAX_PATH_BYTES
            ),
        });
    }
    Ok(cgroup::normalize_prefix(value))
}

/// Longest container id (docker, containerd, cri-o, podman).
const CONTAINER_ID_LEN: usize = 64;

/// `container=4f1e0c2a`: container ids or prefixes of them, lowercase hex.
fn push_containers(containers: &mut Vec<String>, value: &str) -> Result<(), ParamError> {
    for part in value.split(',') {
        if part.is_empty()
            || part.len() > CONTAINER_ID_LEN
            || !part
                .bytes()
                .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
        {
            return Err(ParamError::Invalid {
                name: "container",
                value: Quoted::new(part),
                expected: format!(
                    "a container id or a unique prefix of one, 1 to {CONTAINER_ID_LEN} lowercase hex digits; repeat container= or separate ids with commas"
                ),
            });
        }
        if !containers.iter().any(|id| id == part) {
            containers.push(part.to_owned());
        }
    }
    Ok(())
}

/// Digits only: no sign, no spaces, no exponent (so `+5`, ` 5` and `1e9` fail).
fn parse_decimal(value: &str) -> Option<u64> {
    if value.is_empty() || !value.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

#[cfg(test)]
mod tests;
