//! Who may see what, by the kernel's own rules. Root and the members of the
//! access group (and bearer-token holders) see every process and the
//! kernel's addresses; any other local user sees only the processes the
//! kernel would let them read ([`crate::collect::ReadableBy`]: not set-uid
//! programs they started), and kernel frames without addresses unless the
//! kernel shows them addresses in /proc/kallsyms ([`kallsyms`]). The connecting user is
//! identified by the kernel once per connection — socket diagnostics for
//! TCP on this machine, SO_PEERCRED for the Unix socket — and a connection
//! whose user cannot be told is refused (403) on every endpoint that shows
//! processes. `/metrics` stays open: it carries no process names.

mod groups;
pub mod kallsyms;
mod sock_diag;

use std::{net::SocketAddr, sync::Arc};

use axum::{
    extract::FromRequestParts,
    http::{HeaderMap, StatusCode, header::AUTHORIZATION, request::Parts},
};

use super::HttpError;
use crate::error::Chain;
use crate::store::Visible;

pub use sock_diag::{PeerError, peer_uid};

/// The group whose members see every process.
pub const DEFAULT_GROUP: &str = "profilerd";

/// The other end of a connection, as accepted.
#[derive(Clone, Copy, Debug)]
pub enum Peer {
    Tcp {
        client: SocketAddr,
        server: SocketAddr,
    },
    /// The uid from SO_PEERCRED, if it could be read.
    Unix {
        uid: Option<u32>,
    },
}

#[derive(Clone, Debug)]
pub struct AccessPolicy {
    group: Arc<str>,
    /// A request bearing it sees every process (scrapers elsewhere).
    token: Option<Arc<[u8]>>,
}

/// What a request's `Authorization` header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bearer {
    /// No token is configured, or the request has none: identify the user.
    Absent,
    Valid,
    Invalid,
}

impl AccessPolicy {
    pub fn new(group: &str) -> Self {
        Self {
            group: group.into(),
            token: None,
        }
    }

    /// Accepts requests bearing `token` as seeing every process.
    pub fn with_token(mut self, token: &[u8]) -> Self {
        self.token = Some(token.into());
        self
    }

    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Checks a request's bearer token, in time independent of where it
    /// differs (a remote guesser learns nothing from the timing).
    pub fn bearer(&self, headers: &HeaderMap) -> Bearer {
        let Some(token) = &self.token else {
            return Bearer::Absent;
        };
        let Some(given) = headers
            .get(AUTHORIZATION)
            .and_then(|value| value.as_bytes().strip_prefix(b"Bearer "))
        else {
            return Bearer::Absent;
        };
        let differs = given.len() != token.len()
            || given
                .iter()
                .zip(token.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                != 0;
        if differs { Bearer::Invalid } else { Bearer::Valid }
    }

    /// Blocking: asks the kernel and the user database (which may be remote).
    pub fn identify(&self, peer: Peer) -> Caller {
        let uid = match peer {
            Peer::Tcp { client, server } => peer_uid(client, server).map_err(|err| Chain(&err).to_string()),
            Peer::Unix { uid } => uid.ok_or_else(|| "SO_PEERCRED gave no credentials".to_owned()),
        };
        match uid {
            Ok(uid) => Caller(Ok(self.visible_to(uid))),
            Err(reason) => {
                tracing::debug!(?peer, "refusing a connection whose user is unknown: {reason}");
                Caller(Err(reason.into()))
            }
        }
    }

    /// What `uid` may see. The group is looked up each time, so adding a
    /// user to it takes effect without a restart.
    pub fn visible_to(&self, uid: u32) -> Visible {
        if uid == 0 || groups::is_member(uid, &self.group) {
            Visible::All
        } else {
            Visible::User(uid)
        }
    }
}

/// A connection's identity, put on each of its requests.
#[derive(Clone, Debug)]
pub struct Caller(Result<Visible, Arc<str>>);

impl Caller {
    pub fn unknown(reason: &str) -> Self {
        Caller(Err(reason.into()))
    }

    /// A request with the configured bearer token.
    pub fn token_holder() -> Self {
        Caller(Ok(Visible::All))
    }

    pub fn is_known(&self) -> bool {
        self.0.is_ok()
    }
}

/// A request whose bearer token is wrong, or which needs one and has none:
/// 401 on every endpoint that shows processes.
#[derive(Clone, Debug)]
pub struct Unauthorized(pub &'static str);

/// What one request may see: which processes, and whether kernel frames
/// carry their addresses. Answers are shared by requests of equal scope only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Scope {
    pub visible: Visible,
    /// False: kernel frames keep their names, their addresses are 0.
    pub kernel_addresses: bool,
}

impl Scope {
    /// Everything: root, the access group, a bearer token (granted what
    /// CAP_PERFMON grants perf, kernel addresses included).
    pub const ALL: Scope = Scope {
        visible: Visible::All,
        kernel_addresses: true,
    };

    /// The scope of a caller who sees `visible`, under the kernel's
    /// settings now.
    pub fn of(visible: Visible) -> Self {
        match visible {
            Visible::All => Scope::ALL,
            Visible::User(_) => Scope {
                visible,
                kernel_addresses: kallsyms::shown_to_users(),
            },
        }
    }
}

/// What a request may see; 403 when its user is unknown.
#[derive(Clone, Copy, Debug)]
pub struct Viewer(pub Scope);

impl<S: Send + Sync> FromRequestParts<S> for Viewer {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, HttpError> {
        if let Some(Unauthorized(reason)) = parts.extensions.get::<Unauthorized>() {
            return Err(HttpError::new(StatusCode::UNAUTHORIZED, (*reason).to_owned()));
        }
        let reason = match parts.extensions.get::<Caller>() {
            Some(Caller(Ok(visible))) => return Ok(Viewer(Scope::of(*visible))),
            Some(Caller(Err(reason))) => reason.to_string(),
            None => "the connection was not identified".to_owned(),
        };
        Err(HttpError::new(
            StatusCode::FORBIDDEN,
            format!("profilerd cannot tell which user opened this connection, so it shows nothing: {reason}"),
        ))
    }
}
