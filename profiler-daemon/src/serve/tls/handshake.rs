//! The TLS handshake of one connection, inside its task and under its
//! connection's bounds: it must end within `http_header_timeout_ms` of the
//! accept (the first request's headers share that clock), and a handshaking
//! connection can be evicted like an idle one. A client that connects and
//! never says hello holds its slot no longer than one that never sends a
//! request.

use std::{net::SocketAddr, pin::pin, time::Instant};

use tokio::{net::TcpStream, sync::watch};
use tokio_rustls::{rustls, server::TlsStream};

use super::{Handshake, Tls, fingerprint};
use crate::error::Chain;
use crate::serve::connections::{CloseReason, ConnectionLimits, Slot};

/// A TLS record of type handshake: how every ClientHello begins.
const HANDSHAKE_RECORD: u8 = 0x16;

/// What a plain-HTTP client gets: a clear error, as Go's servers answer it.
const NOT_TLS_ANSWER: &[u8] = b"HTTP/1.1 400 Bad Request\r\n\
Content-Type: text/plain; charset=utf-8\r\n\
X-Go-Pprof: 1\r\n\
Connection: close\r\n\
Content-Length: 48\r\n\
\r\n\
this port speaks TLS: use https:// to reach it\r\n";

/// A connection after its handshake.
pub struct Secured {
    pub stream: TlsStream<TcpStream>,
    /// The client presented a certificate the client CA signed.
    pub certified: bool,
}

/// Runs the handshake; `Err` carries the bound that closed the connection,
/// if one did (the others are counted as handshake outcomes).
pub async fn handshake(
    tls: &Tls,
    tcp: TcpStream,
    client: SocketAddr,
    slot: &Slot,
    limits: &ConnectionLimits,
    stopping: &mut watch::Receiver<bool>,
) -> Result<Secured, Option<CloseReason>> {
    // A new connection waits for its headers: it always has a deadline.
    let deadline = slot
        .deadline(limits)
        .map_or_else(|| Instant::now() + limits.header_timeout, |(at, _)| at);
    let mut work = pin!(secure(tls, tcp));
    let result = loop {
        tokio::select! {
            result = work.as_mut() => break result,
            () = tokio::time::sleep_until(deadline.into()) => {
                tls.count(Handshake::Timeout);
                tracing::debug!(%client, "TLS handshake not done within the header timeout; closing");
                return Err(Some(CloseReason::HeaderTimeout));
            }
            () = slot.changed() => {
                if slot.take_eviction() {
                    return Err(Some(CloseReason::Evicted));
                }
            }
            _ = stopping.wait_for(|stop| *stop) => return Err(None),
        }
    };
    let outcome = match &result {
        Ok(_) => Handshake::Ok,
        Err(Failure::NotTls) => Handshake::NotTls,
        Err(Failure::Io(err)) if refused_client_certificate(err) => Handshake::ClientCertificate,
        Err(Failure::Io(_)) => Handshake::Failed,
    };
    tls.count(outcome);
    let stream = match result {
        Ok(stream) => stream,
        Err(Failure::NotTls) => {
            tracing::debug!(%client, "not a TLS client (plain HTTP?) on the TLS port: answered 400");
            return Err(None);
        }
        Err(Failure::Io(err)) => {
            tracing::debug!(%client, "TLS handshake failed: {}", Chain(&err));
            return Err(None);
        }
    };
    // With a client CA, rustls completes no handshake without a verified
    // certificate: one is there exactly when the CA signed it.
    let presented = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first());
    let certified = tls.requires_client_certificate() && presented.is_some();
    if let Some(certificate) = presented {
        tracing::debug!(%client, "TLS client certificate SHA-256 {}", fingerprint(certificate));
    }
    Ok(Secured { stream, certified })
}

enum Failure {
    NotTls,
    Io(std::io::Error),
}

async fn secure(tls: &Tls, mut tcp: TcpStream) -> Result<TlsStream<TcpStream>, Failure> {
    let mut first = [0u8; 1];
    match tcp.peek(&mut first).await {
        Ok(0) => {
            return Err(Failure::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the client closed the connection before its hello",
            )));
        }
        Ok(_) => {}
        Err(err) => return Err(Failure::Io(err)),
    }
    if first[0] != HANDSHAKE_RECORD {
        // A request line starts with a method in capitals.
        if first[0].is_ascii_uppercase() {
            answer_not_tls(&mut tcp).await;
        }
        return Err(Failure::NotTls);
    }
    tls.acceptor().accept(tcp).await.map_err(Failure::Io)
}

/// Tells a plain-HTTP client what went wrong; the caller then closes. What
/// it sent is read first (what has arrived, up to 4 KiB), so that closing
/// does not reset the connection before the client reads the answer.
async fn answer_not_tls(tcp: &mut TcpStream) {
    let mut request = [0u8; 4096];
    let _ = tcp.try_read(&mut request);
    let mut answer = NOT_TLS_ANSWER;
    while !answer.is_empty() {
        if tcp.writable().await.is_err() {
            return;
        }
        match tcp.try_write(answer) {
            Ok(written) => answer = &answer[written..],
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

/// Whether rustls refused the client's certificate (none, or not the CA's).
fn refused_client_certificate(err: &std::io::Error) -> bool {
    matches!(
        err.get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>()),
        Some(rustls::Error::NoCertificatesPresented | rustls::Error::InvalidCertificate(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_http_answer_has_the_length_it_says() {
        let text = std::str::from_utf8(NOT_TLS_ANSWER).expect("ASCII");
        let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{text}"
        );
    }
}
