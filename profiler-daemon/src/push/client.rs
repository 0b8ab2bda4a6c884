//! One push attempt on the wire: a connection (TCP, TLS for https), one
//! request (HTTP/1.1 for Pyroscope's Connect API, HTTP/2 for Parca's gRPC),
//! the answer read within bounds. Each attempt opens its own connection: at
//! one push per interval the handshake costs little, and nothing is left
//! half-open across a backend's restart.

use std::{path::Path, sync::Arc};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{
    HeaderMap, Request, StatusCode,
    client::conn::{http1, http2},
    header::{self, HeaderValue},
};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio_rustls::{
    TlsConnector,
    rustls::{
        self, ClientConfig, RootCertStore,
        crypto::ring,
        pki_types::{CertificateDer, ServerName, pem::PemObject},
    },
};

use super::settings::{Auth, Endpoint, Target};

/// The most of an answer read: an error message, never a profile.
const MAX_ANSWER_BYTES: usize = 64 << 10;

/// The most of a password or token file read.
const MAX_SECRET_BYTES: u64 = 16 << 10;

pub const USER_AGENT: &str = concat!("profilerd/", env!("CARGO_PKG_VERSION"));

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("reading the CA file {path}")]
    CaFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no PEM certificate in it")]
    CaEmpty { path: String },
    #[error("{path}: a certificate rustls refuses")]
    CaRefused {
        path: String,
        #[source]
        source: rustls::Error,
    },
    #[error("TLS settings")]
    Tls(#[source] rustls::Error),
}

/// Why an attempt failed, and whether trying again may help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub retry: bool,
    pub reason: String,
}

impl Failure {
    pub fn retry(reason: impl Into<String>) -> Self {
        Self {
            retry: true,
            reason: reason.into(),
        }
    }

    pub fn refused(reason: impl Into<String>) -> Self {
        Self {
            retry: false,
            reason: reason.into(),
        }
    }
}

/// What came back, within [`MAX_ANSWER_BYTES`].
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    Http1,
    Http2,
}

/// A target's connection settings, checked once at start.
pub struct Client {
    endpoint: Endpoint,
    auth: Auth,
    tls: Option<TlsConnector>,
    version: Version,
}

impl Client {
    pub fn new(target: &Target, version: Version) -> Result<Self, ClientError> {
        let tls = if target.endpoint.tls {
            Some(connector(target.ca_file.as_deref(), version)?)
        } else {
            None
        };
        Ok(Self {
            endpoint: target.endpoint.clone(),
            auth: target.auth.clone(),
            tls,
            version,
        })
    }

    /// POSTs `body` to `method` (`/package.Service/Method`) with `headers`.
    pub async fn post(&self, method: &str, mut headers: HeaderMap, body: Bytes) -> Result<Answer, Failure> {
        if let Some(value) = authorization(&self.auth)? {
            headers.insert(header::AUTHORIZATION, value);
        }
        // HTTP/1.1 to an origin server takes the path alone (origin-form,
        // RFC 9112 3.2.1; the absolute form is for proxies), the host in
        // `Host`; HTTP/2 takes the whole URL (`:scheme`, `:authority`).
        let uri = match self.version {
            Version::Http1 => self.endpoint.path_of(method),
            Version::Http2 => self.endpoint.url_of(method),
        };
        let mut request = Request::post(&uri)
            .body(Full::new(body))
            .map_err(|err| Failure::refused(format!("{uri}: {err}")))?;
        let host = HeaderValue::from_str(
            self.endpoint
                .origin()
                .split_once("://")
                .map_or("", |(_, host)| host),
        )
        .map_err(|err| Failure::refused(format!("host: {err}")))?;
        *request.headers_mut() = headers;
        request
            .headers_mut()
            .insert(header::USER_AGENT, HeaderValue::from_static(USER_AGENT));
        if self.version == Version::Http1 {
            request.headers_mut().insert(header::HOST, host);
        }
        let tcp = TcpStream::connect((self.endpoint.host.as_str(), self.endpoint.port))
            .await
            .map_err(|err| Failure::retry(format!("connecting to {}: {err}", self.endpoint)))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => self.exchange(tcp, request).await,
            Some(connector) => {
                let name = ServerName::try_from(self.endpoint.host.clone())
                    .map_err(|err| Failure::refused(format!("{}: {err}", self.endpoint.host)))?;
                let stream = connector
                    .connect(name, tcp)
                    .await
                    .map_err(|err| Failure::retry(format!("TLS with {}: {err}", self.endpoint)))?;
                self.exchange(stream, request).await
            }
        }
    }

    async fn exchange<S>(&self, stream: S, request: Request<Full<Bytes>>) -> Result<Answer, Failure>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let io = TokioIo::new(stream);
        let lost = |err: hyper::Error| Failure::retry(format!("HTTP: {err}"));
        let (response, connection) = match self.version {
            Version::Http1 => {
                let (mut sender, connection) = http1::handshake(io).await.map_err(lost)?;
                let connection = tokio::spawn(connection);
                (sender.send_request(request).await, connection)
            }
            Version::Http2 => {
                let (mut sender, connection) =
                    http2::handshake(TokioExecutor::new(), io).await.map_err(lost)?;
                let connection = tokio::spawn(connection);
                (sender.send_request(request).await, connection)
            }
        };
        // Dropping the connection's task ends it, whatever the server does.
        let _abort = AbortOnDrop(connection);
        let response = response.map_err(lost)?;
        let (parts, body) = response.into_parts();
        let collected = Limited::new(body, MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|err| Failure::retry(format!("reading the answer: {err}")))?;
        let trailers = collected.trailers().cloned();
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body: collected.to_bytes(),
            trailers,
        })
    }
}

struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The system's roots (webpki's rules, through rustls-native-certs: the
/// distribution's bundle, or SSL_CERT_FILE) plus `ca_file`.
fn connector(ca_file: Option<&Path>, version: Version) -> Result<TlsConnector, ClientError> {
    let mut roots = RootCertStore::empty();
    // Unreadable system certificates are skipped: a CA file may be all that is needed.
    let (_added, _ignored) = roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    if let Some(path) = ca_file {
        let shown = path.display().to_string();
        let text = std::fs::read(path).map_err(|source| ClientError::CaFile {
            path: shown.clone(),
            source,
        })?;
        let certificates: Vec<_> = CertificateDer::pem_slice_iter(&text)
            .filter_map(Result::ok)
            .collect();
        if certificates.is_empty() {
            return Err(ClientError::CaEmpty { path: shown });
        }
        for certificate in certificates {
            roots.add(certificate).map_err(|source| ClientError::CaRefused {
                path: shown.clone(),
                source,
            })?;
        }
    }
    let mut config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(ClientError::Tls)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![match version {
        Version::Http1 => b"http/1.1".to_vec(),
        Version::Http2 => b"h2".to_vec(),
    }];
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The Authorization header, its secret read now: a rotated file is used
/// from the next push on.
fn authorization(auth: &Auth) -> Result<Option<HeaderValue>, Failure> {
    // A secret is a line: a file much larger is not one (nor read whole).
    let read = |path: &Path| {
        use std::io::Read;
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|file| file.take(MAX_SECRET_BYTES + 1).read_to_string(&mut text))
            .map_err(|err| Failure::retry(format!("reading {}: {err}", path.display())))?;
        if text.len() as u64 > MAX_SECRET_BYTES {
            return Err(Failure::retry(format!(
                "{}: larger than {MAX_SECRET_BYTES} bytes, not a credential",
                path.display()
            )));
        }
        Ok(text.trim_end_matches(['\n', '\r']).to_owned())
    };
    let value = match auth {
        Auth::None => return Ok(None),
        Auth::Basic { user, password_file } => {
            use base64::Engine;
            let password = read(password_file)?;
            let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            format!("Basic {encoded}")
        }
        Auth::Bearer { token_file } => format!("Bearer {}", read(token_file)?.trim()),
    };
    let mut value = HeaderValue::from_str(&value)
        .map_err(|_| Failure::retry("the credentials file holds characters a header cannot carry"))?;
    value.set_sensitive(true);
    Ok(Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_auth_reads_the_password_file_each_time() {
        let dir = std::env::temp_dir().join(format!("profilerd-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("password");
        std::fs::write(&file, "secret\n").unwrap();
        let auth = Auth::Basic {
            user: "123".into(),
            password_file: file.clone(),
        };
        // base64("123:secret")
        assert_eq!(authorization(&auth).unwrap().unwrap(), "Basic MTIzOnNlY3JldA==");
        std::fs::write(&file, "rotated").unwrap();
        assert_eq!(authorization(&auth).unwrap().unwrap(), "Basic MTIzOnJvdGF0ZWQ=");
        std::fs::remove_file(&file).unwrap();
        let failure = authorization(&auth).unwrap_err();
        assert!(
            failure.retry && failure.reason.contains("password"),
            "{failure:?}"
        );
        let _ = std::fs::remove_dir(&dir);
    }
}
