//! TLS on the TCP listener (rustls, ring provider), optionally requiring
//! client certificates signed by a configured CA (mutual TLS). A verified
//! client certificate grants what the bearer token grants: every process.
//!
//! SIGHUP re-reads the certificate chain, the key and the client CA from
//! the files named at start: new connections use the new configuration,
//! open ones keep theirs. A reload that fails is logged and counted, and
//! the previous configuration stays in use.

mod handshake;
mod load;

use std::{
    fmt::Write as _,
    path::Path,
    sync::{
        Arc, RwLock,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio_rustls::{TlsAcceptor, rustls::ServerConfig};

pub(super) use self::handshake::{Secured, handshake};
pub use self::load::{TlsError, TlsFiles};
use super::ListenAddress;

/// How a TLS handshake ended (the `outcome` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handshake {
    Ok,
    /// The client spoke something else, such as plain HTTP.
    NotTls,
    /// No client certificate, or one the client CA did not sign.
    ClientCertificate,
    /// Not done within http_header_timeout_ms of connecting.
    Timeout,
    /// Any other failure: a protocol error, the client gave up or refused
    /// our certificate.
    Failed,
}

impl Handshake {
    pub const ALL: [Self; 5] = [
        Self::Ok,
        Self::NotTls,
        Self::ClientCertificate,
        Self::Timeout,
        Self::Failed,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::NotTls => "not_tls",
            Self::ClientCertificate => "client_certificate",
            Self::Timeout => "timeout",
            Self::Failed => "failed",
        }
    }
}

/// The TLS state of the listener: the configuration new connections get,
/// and the counters for /metrics.
pub struct Tls {
    files: TlsFiles,
    config: RwLock<Arc<ServerConfig>>,
    handshakes: [AtomicU64; Handshake::ALL.len()],
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
}

/// The TLS counters at scrape time.
#[derive(Clone, Copy, Debug)]
pub struct TlsSnapshot {
    pub handshakes: [(&'static str, u64); Handshake::ALL.len()],
    pub reloads: [(&'static str, u64); 2],
}

impl Tls {
    /// The TLS the settings ask for: none without `tls_cert_file`. Every
    /// file is read now, so a bad one stops the daemon at start.
    pub fn from_settings(
        listen: &ListenAddress,
        cert: Option<&Path>,
        key: Option<&Path>,
        client_ca: Option<&Path>,
    ) -> Result<Option<Self>, TlsError> {
        let (cert, key) = match (cert, key) {
            (None, None) if client_ca.is_none() => return Ok(None),
            (Some(cert), Some(key)) => (cert, key),
            _ => {
                return Err(TlsError::Settings(
                    "TLS needs both tls_cert_file and tls_key_file (tls_client_ca_file goes with them)"
                        .to_owned(),
                ));
            }
        };
        if let ListenAddress::Unix(_) = listen {
            return Err(TlsError::Settings(format!(
                "TLS is for TCP listeners; {listen} is a Unix socket, whose clients the kernel names"
            )));
        }
        let files = TlsFiles {
            cert: cert.to_owned(),
            key: key.to_owned(),
            client_ca: client_ca.map(Path::to_owned),
        };
        let loaded = load::server_config(&files)?;
        tracing::info!(
            certificate = %loaded.fingerprint,
            client_ca = ?files.client_ca,
            "TLS on: serving {}",
            files.cert.display()
        );
        Ok(Some(Self {
            files,
            config: RwLock::new(loaded.config),
            handshakes: Default::default(),
            reloads_ok: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
        }))
    }

    /// Whether every client must present a certificate the client CA signed.
    pub fn requires_client_certificate(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// Re-reads the files (blocking); on failure keeps the configuration in use.
    pub fn reload(&self) -> Result<(), TlsError> {
        match load::server_config(&self.files) {
            Ok(loaded) => {
                tracing::info!(
                    certificate = %loaded.fingerprint,
                    "TLS reloaded: new connections get {}",
                    self.files.cert.display()
                );
                *self
                    .config
                    .write()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = loaded.config;
                self.reloads_ok.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(err) => {
                tracing::error!(
                    "reloading TLS failed, still serving the previous certificate: {}",
                    crate::error::Chain(&err)
                );
                self.reloads_failed.fetch_add(1, Ordering::Relaxed);
                Err(err)
            }
        }
    }

    fn acceptor(&self) -> TlsAcceptor {
        // A configuration is swapped whole: a panic elsewhere cannot tear it.
        let config = self
            .config
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        TlsAcceptor::from(config.clone())
    }

    fn count(&self, outcome: Handshake) {
        let index = Handshake::ALL.iter().position(|&o| o == outcome).unwrap_or(0);
        self.handshakes[index].fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> TlsSnapshot {
        TlsSnapshot {
            handshakes: Handshake::ALL.map(|outcome| {
                (
                    outcome.label(),
                    self.handshakes[outcome as usize].load(Ordering::Relaxed),
                )
            }),
            reloads: [
                ("ok", self.reloads_ok.load(Ordering::Relaxed)),
                ("failed", self.reloads_failed.load(Ordering::Relaxed)),
            ],
        }
    }
}

/// Takes SIGHUP over from its default action (which would kill us): call it
/// early, so that a reload sent while the daemon starts is not fatal.
pub fn hangups() -> Option<Signal> {
    match signal(SignalKind::hangup()) {
        Ok(hangups) => Some(hangups),
        Err(err) => {
            tracing::warn!("no SIGHUP handler ({err}): certificates cannot be reloaded");
            None
        }
    }
}

/// Reloads `tls` on every SIGHUP, for as long as the daemon runs. Without
/// TLS, SIGHUP is logged and ignored.
pub async fn reload_on_sighup(tls: Option<Arc<Tls>>, hangups: Option<Signal>) {
    let Some(mut hangups) = hangups else {
        return std::future::pending().await;
    };
    while hangups.recv().await.is_some() {
        let Some(tls) = tls.clone() else {
            tracing::info!("SIGHUP: nothing to reload (no TLS configured)");
            continue;
        };
        // Reads files: off the async workers. Its outcome is logged there.
        let _ = tokio::task::spawn_blocking(move || tls.reload()).await;
    }
}

/// SHA-256 of a DER certificate, as `openssl x509 -fingerprint -sha256` prints it.
pub fn fingerprint(der: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, der);
    let mut text = String::with_capacity(digest.as_ref().len() * 3);
    for (i, byte) in digest.as_ref().iter().enumerate() {
        let separator = if i == 0 { "" } else { ":" };
        let _ = write!(text, "{separator}{byte:02X}");
    }
    text
}
