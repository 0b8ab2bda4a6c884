//! Reads the certificate chain, the key and the client CA (PEM) and builds
//! the rustls server configuration from them.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use tokio_rustls::rustls::{
    self, InconsistentKeys, RootCertStore, ServerConfig,
    crypto::{CryptoProvider, ring},
    pki_types::{
        CertificateDer, PrivateKeyDer,
        pem::{self, PemObject},
    },
    server::{VerifierBuilderError, WebPkiClientVerifier},
};

/// The files named by `tls_cert_file`, `tls_key_file`, `tls_client_ca_file`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate, then the intermediates a client needs.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Clients must present a certificate this CA signed (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {what} {}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} {} is not valid PEM", path.display())]
    Pem {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: pem::Error,
    },
    #[error("{what} {} holds no {expected}", path.display())]
    Empty {
        what: &'static str,
        path: PathBuf,
        expected: &'static str,
    },
    #[error("the client CA {} holds a certificate that cannot be a trust anchor", path.display())]
    BadClientCa {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("the client CA {} cannot verify clients", path.display())]
    Verifier {
        path: PathBuf,
        #[source]
        source: VerifierBuilderError,
    },
    #[error("the key {} does not match the certificate {} (their public keys differ)", key.display(), cert.display())]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    #[error("the key {} cannot serve the certificate {}", key.display(), cert.display())]
    KeyUnusable {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("setting up TLS")]
    Protocol(#[source] rustls::Error),
    #[error("{0}")]
    Settings(String),
}

const CHAIN: &str = "the certificate file";
const KEY: &str = "the key file";
const CLIENT_CA: &str = "the client CA file";

/// The ALPN protocols offered: the server speaks HTTP/1.1 only.
const ALPN: &[&[u8]] = &[b"http/1.1"];

/// A configuration built from the files.
pub struct Loaded {
    pub config: Arc<ServerConfig>,
    /// The SHA-256 fingerprint of the server's certificate, for the log.
    pub fingerprint: String,
}

/// Reads every file and builds the configuration: new connections use it.
pub fn server_config(files: &TlsFiles) -> Result<Loaded, TlsError> {
    let chain = certificates(&files.cert, CHAIN)?;
    let fingerprint = super::fingerprint(&chain[0]);
    let key = private_key(&files.key)?;
    let provider = Arc::new(ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Protocol)?;
    let builder = match &files.client_ca {
        Some(path) => builder.with_client_cert_verifier(client_verifier(path, provider)?),
        None => builder.with_no_client_auth(),
    };
    // rustls checks that the key's public half is the certificate's.
    let mut config = builder.with_single_cert(chain, key).map_err(|source| {
        let (cert, key) = (files.cert.clone(), files.key.clone());
        match source {
            rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch) => {
                TlsError::KeyMismatch { cert, key }
            }
            source => TlsError::KeyUnusable { cert, key, source },
        }
    })?;
    config.alpn_protocols = ALPN.iter().map(|protocol| protocol.to_vec()).collect();
    Ok(Loaded {
        config: Arc::new(config),
        fingerprint,
    })
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

fn pem_error(path: &Path, what: &'static str) -> impl Fn(pem::Error) -> TlsError {
    move |source| TlsError::Pem {
        what,
        path: path.to_owned(),
        source,
    }
}

/// Every `CERTIFICATE` section of `path`, in order (other sections are skipped).
fn certificates(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let text = read(path, what)?;
    let chain = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_error(path, what))?;
    if chain.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_owned(),
            expected: "certificate (BEGIN CERTIFICATE)",
        });
    }
    Ok(chain)
}

/// The first private key of `path`: PKCS#8, PKCS#1 (RSA) or SEC1 (EC).
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let text = read(path, KEY)?;
    PrivateKeyDer::from_pem_slice(&text).map_err(|err| match err {
        pem::Error::NoItemsFound => TlsError::Empty {
            what: KEY,
            path: path.to_owned(),
            expected: "private key (BEGIN PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY)",
        },
        err => pem_error(path, KEY)(err),
    })
}

fn client_verifier(
    path: &Path,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let mut roots = RootCertStore::empty();
    for certificate in certificates(path, CLIENT_CA)? {
        roots.add(certificate).map_err(|source| TlsError::BadClientCa {
            path: path.to_owned(),
            source,
        })?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|source| TlsError::Verifier {
            path: path.to_owned(),
            source,
        })
}
