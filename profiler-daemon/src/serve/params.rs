//! Query-string parsing and validation for the profile endpoints: pure, so
//! every accepted and rejected input is unit-tested here.

use std::fmt;

use crate::{cgroup, kind::ProfileType, store::Filter};

/// Longer query strings are refused before parsing (no legitimate request
/// comes close; a long one is a mistake or an attack).
pub const MAX_QUERY_BYTES: usize = 4096;
/// Parameters every profile endpoint accepts.
const COMMON_PARAMETERS: [&str; 8] = [
    "pid",
    "tid",
    "comm",
    "unit",
    "cgroup",
    "container",
    "seconds",
    "type",
];
/// Bytes of a rejected value quoted back in an error message.
const MAX_QUOTED: usize = 64;
/// `/proc/PID/comm` of kernel workers can exceed TASK_COMM_LEN; nothing is longer.
const MAX_COMM_BYTES: usize = 64;
/// Go's net/http/pprof profiles this long when `seconds` is missing or invalid.
const GO_DEFAULT_SECONDS: u64 = 30;
pub const DEFAULT_SECONDS: u64 = 10;

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
    pub seconds: u64,
    pub filter: Filter,
    /// `type=`; the Go paths say it by their name instead.
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
    #[error("seconds: given more than once; expected a single value")]
    RepeatedSeconds,
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
/// defaults to [`DEFAULT_SECONDS`] (or the retention if that is shorter).
pub fn parse_pprof(query: Option<&str>, limits: &Limits) -> Result<ProfileParams, ParamError> {
    parse(query, limits, Mode::Strict, &[]).map(|(params, _)| params)
}

/// As [`parse_pprof`], plus the endpoint's own `options` (each at most once),
/// returned as (name, value) for the endpoint to validate.
pub fn parse_with_options(
    query: Option<&str>,
    limits: &Limits,
    options: &[&'static str],
) -> Result<(ProfileParams, EndpointOptions), ParamError> {
    parse(query, limits, Mode::Strict, options)
}

/// `/debug/pprof/profile` (and `offcpu`, `wall`): as Go's handler, a
/// missing, unparsable or non-positive `seconds` means 30, and unknown
/// parameters are ignored (`type` too: the path names the profile); seconds
/// beyond the retention and bad filters are still errors.
pub fn parse_go_profile(
    query: Option<&str>,
    limits: &Limits,
    profile_type: ProfileType,
) -> Result<ProfileParams, ParamError> {
    parse(query, limits, Mode::Go, &[]).map(|(params, _)| ProfileParams {
        profile_type,
        ..params
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Strict,
    Go,
}

fn parse(
    query: Option<&str>,
    limits: &Limits,
    mode: Mode,
    options: &[&'static str],
) -> Result<(ProfileParams, EndpointOptions), ParamError> {
    let mut chosen = EndpointOptions::new();
    let query = query.unwrap_or_default();
    if query.len() > MAX_QUERY_BYTES {
        return Err(ParamError::TooLong { len: query.len() });
    }
    let mut filter = Filter::default();
    let mut seconds: Option<u64> = None;
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
                Mode::Strict if seconds.is_some() => return Err(ParamError::RepeatedSeconds),
                Mode::Strict => seconds = Some(parse_seconds(&value, limits)?),
                // Go reads the first value only.
                Mode::Go if seconds.is_some() => {}
                Mode::Go => seconds = Some(parse_go_seconds(&value, limits)?),
            },
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
    let default = match mode {
        Mode::Strict => DEFAULT_SECONDS,
        Mode::Go => GO_DEFAULT_SECONDS,
    };
    Ok((
        ProfileParams {
            seconds: seconds.unwrap_or(default.min(limits.max_seconds)),
            filter,
            profile_type: profile_type.unwrap_or_default(),
        },
        chosen,
    ))
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

fn parse_seconds(value: &str, limits: &Limits) -> Result<u64, ParamError> {
    parse_decimal(value)
        .filter(|seconds| (1..=limits.max_seconds).contains(seconds))
        .ok_or_else(|| seconds_error(value, limits))
}

fn parse_go_seconds(value: &str, limits: &Limits) -> Result<u64, ParamError> {
    // Go parses a signed 64-bit integer and falls back on anything else.
    match value.parse::<i64>() {
        Ok(seconds) if seconds > 0 => {
            let seconds = seconds.unsigned_abs();
            if seconds > limits.max_seconds {
                return Err(seconds_error(value, limits));
            }
            Ok(seconds)
        }
        _ => Ok(GO_DEFAULT_SECONDS.min(limits.max_seconds)),
    }
}

fn seconds_error(value: &str, limits: &Limits) -> ParamError {
    ParamError::Invalid {
        name: "seconds",
        value: Quoted::new(value),
        expected: format!("an integer from 1 to {} (the retention)", limits.max_seconds),
    }
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
