//! Who may see what. The kernel's rule for profiling others: root and the
//! members of the access group see every process; any other local user sees
//! only the processes whose real uid is theirs. The connecting user is
//! identified by the kernel once per connection — socket diagnostics for
//! TCP on this machine, SO_PEERCRED for the Unix socket — and a connection
//! whose user cannot be told is refused (403) on every endpoint that shows
//! processes. `/metrics` stays open: it carries no process names.

mod groups;
mod sock_diag;

use std::{net::SocketAddr, sync::Arc};

use axum::{extract::FromRequestParts, http::StatusCode, http::request::Parts};

use super::HttpError;
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
}

impl AccessPolicy {
    pub fn new(group: &str) -> Self {
        Self { group: group.into() }
    }

    /// Blocking: asks the kernel and the user database (which may be remote).
    pub fn identify(&self, peer: Peer) -> Caller {
        let uid = match peer {
            Peer::Tcp { client, server } => peer_uid(client, server).map_err(|err| err.to_string()),
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
            Visible::OwnedBy(uid)
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
}

/// The processes a request may see; 403 when its user is unknown.
#[derive(Clone, Copy, Debug)]
pub struct Viewer(pub Visible);

impl<S: Send + Sync> FromRequestParts<S> for Viewer {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, HttpError> {
        let reason = match parts.extensions.get::<Caller>() {
            Some(Caller(Ok(visible))) => return Ok(Viewer(*visible)),
            Some(Caller(Err(reason))) => reason.to_string(),
            None => "the connection was not identified".to_owned(),
        };
        Err(HttpError::new(
            StatusCode::FORBIDDEN,
            format!("profilerd cannot tell which user opened this connection, so it shows nothing: {reason}"),
        ))
    }
}
