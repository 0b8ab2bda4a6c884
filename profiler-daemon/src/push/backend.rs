//! What each backend's API wants on the wire and how it answers:
//! - Pyroscope: Connect unary over HTTP/1.1 (`POST /push.v1.PusherService/Push`,
//!   `Content-Type: application/proto`), as Alloy's `pyroscope.write`
//!   sends; errors come back as an HTTP status with a JSON `{code, message}`.
//! - Parca: gRPC over HTTP/2 (`ProfileStoreService/WriteRaw`), as Parca
//!   Agent sends; the outcome is the `grpc-status` trailer.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use hyper::{
    HeaderMap, StatusCode,
    header::{self, HeaderName, HeaderValue},
};

use super::{
    client::{Answer, Failure, Version},
    settings::{Backend, Target},
};

pub const PYROSCOPE_PUSH: &str = "/push.v1.PusherService/Push";
pub const PARCA_WRITE_RAW: &str = "/parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw";

pub fn version(backend: Backend) -> Version {
    match backend {
        Backend::Pyroscope => Version::Http1,
        Backend::Parca => Version::Http2,
    }
}

pub fn method(backend: Backend) -> &'static str {
    match backend {
        Backend::Pyroscope => PYROSCOPE_PUSH,
        Backend::Parca => PARCA_WRITE_RAW,
    }
}

/// The request's headers and body around an encoded request message.
pub fn request(target: &Target, message: &Bytes, timeout: Duration) -> (HeaderMap, Bytes) {
    let mut headers = HeaderMap::new();
    match target.backend {
        Backend::Pyroscope => {
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/proto"),
            );
            headers.insert(
                HeaderName::from_static("connect-protocol-version"),
                HeaderValue::from_static("1"),
            );
            headers.insert(
                HeaderName::from_static("connect-timeout-ms"),
                HeaderValue::from(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
            );
            if let Some(tenant) = target
                .tenant
                .as_deref()
                .and_then(|tenant| HeaderValue::from_str(tenant).ok())
            {
                headers.insert(HeaderName::from_static("x-scope-orgid"), tenant);
            }
            (headers, message.clone())
        }
        Backend::Parca => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            headers.insert(header::TE, HeaderValue::from_static("trailers"));
            // gRPC's own deadline: the server gives up when we do.
            if let Ok(value) = HeaderValue::from_str(&format!("{}m", timeout.as_millis().min(99_999_999))) {
                headers.insert(HeaderName::from_static("grpc-timeout"), value);
            }
            (headers, grpc_frame(message))
        }
    }
}

/// A gRPC length-prefixed message: uncompressed flag, big-endian length.
fn grpc_frame(message: &[u8]) -> Bytes {
    let mut framed = BytesMut::with_capacity(message.len() + 5);
    framed.put_u8(0);
    framed.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    framed.put_slice(message);
    framed.freeze()
}

/// Accepted, or why not and whether a retry may succeed.
pub fn outcome(backend: Backend, answer: &Answer) -> Result<(), Failure> {
    match backend {
        Backend::Pyroscope => connect_outcome(answer),
        Backend::Parca => grpc_outcome(answer),
    }
}

fn connect_outcome(answer: &Answer) -> Result<(), Failure> {
    if answer.status == StatusCode::OK {
        return Ok(());
    }
    #[derive(serde::Deserialize)]
    struct ConnectError {
        code: Option<String>,
        message: Option<String>,
    }
    let detail = match serde_json::from_slice::<ConnectError>(&answer.body) {
        Ok(error) => format!(
            "{}: {}",
            error.code.unwrap_or_default(),
            error.message.unwrap_or_default()
        ),
        Err(_) => String::from_utf8_lossy(&answer.body[..answer.body.len().min(512)]).into_owned(),
    };
    let reason = format!("HTTP {}: {}", answer.status.as_u16(), detail.trim());
    if retryable_status(answer.status) {
        Err(Failure::retry(reason))
    } else {
        Err(Failure::refused(reason))
    }
}

/// Overload and server trouble pass; anything else the request itself
/// caused, and sending it again would fail again.
fn retryable_status(status: StatusCode) -> bool {
    status.is_server_error() && status != StatusCode::NOT_IMPLEMENTED
        || status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
}

fn grpc_outcome(answer: &Answer) -> Result<(), Failure> {
    // A trailers-only answer puts the status among the headers.
    let field = |name: &str| {
        answer
            .trailers
            .as_ref()
            .and_then(|trailers| trailers.get(name))
            .or_else(|| answer.headers.get(name))
            .and_then(|value| value.to_str().ok())
    };
    let Some(code) = field("grpc-status").and_then(|code| code.parse::<u32>().ok()) else {
        let reason = format!("HTTP {} without a gRPC status", answer.status.as_u16());
        return Err(if retryable_status(answer.status) {
            Failure::retry(reason)
        } else {
            Failure::refused(reason)
        });
    };
    if code == 0 {
        return Ok(());
    }
    let reason = format!(
        "gRPC status {code} ({}): {}",
        grpc_code_name(code),
        field("grpc-message").unwrap_or_default()
    );
    // UNKNOWN, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, INTERNAL,
    // UNAVAILABLE: the server's state, not the request.
    if matches!(code, 2 | 4 | 8 | 10 | 13 | 14) {
        Err(Failure::retry(reason))
    } else {
        Err(Failure::refused(reason))
    }
}

fn grpc_code_name(code: u32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    NAMES.get(code as usize).copied().unwrap_or("?")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(
        status: u16,
        headers: &[(&'static str, &str)],
        trailers: Option<&[(&'static str, &str)]>,
        body: &str,
    ) -> Answer {
        let map = |pairs: &[(&'static str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(
                    HeaderName::from_static(name),
                    HeaderValue::from_str(value).unwrap(),
                );
            }
            map
        };
        Answer {
            status: StatusCode::from_u16(status).unwrap(),
            headers: map(headers),
            body: Bytes::from(body.to_owned()),
            trailers: trailers.map(map),
        }
    }

    #[test]
    fn grpc_frames_carry_the_length_big_endian() {
        let framed = grpc_frame(&[7; 300]);
        assert_eq!(&framed[..5], &[0, 0, 0, 1, 44]);
        assert_eq!(framed.len(), 305);
    }

    #[test]
    fn grpc_status_decides_and_is_found_in_trailers_or_headers() {
        assert_eq!(
            grpc_outcome(&answer(200, &[], Some(&[("grpc-status", "0")]), "")),
            Ok(())
        );
        let unavailable = grpc_outcome(&answer(
            200,
            &[("grpc-status", "14"), ("grpc-message", "down")],
            None,
            "",
        ));
        assert!(
            matches!(&unavailable, Err(f) if f.retry && f.reason.contains("UNAVAILABLE") && f.reason.contains("down"))
        );
        let invalid = grpc_outcome(&answer(200, &[], Some(&[("grpc-status", "3")]), ""));
        assert!(matches!(&invalid, Err(f) if !f.retry && f.reason.contains("INVALID_ARGUMENT")));
        let proxy = grpc_outcome(&answer(502, &[], None, "bad gateway"));
        assert!(matches!(&proxy, Err(f) if f.retry), "{proxy:?}");
        let missing = grpc_outcome(&answer(404, &[], None, ""));
        assert!(matches!(&missing, Err(f) if !f.retry), "{missing:?}");
    }

    #[test]
    fn connect_errors_retry_only_what_may_pass() {
        assert_eq!(connect_outcome(&answer(200, &[], None, "")), Ok(()));
        let limited = connect_outcome(&answer(
            429,
            &[],
            None,
            r#"{"code":"resource_exhausted","message":"slow down"}"#,
        ));
        assert!(
            matches!(&limited, Err(f) if f.retry && f.reason.contains("slow down")),
            "{limited:?}"
        );
        let invalid = connect_outcome(&answer(
            400,
            &[],
            None,
            r#"{"code":"invalid_argument","message":"bad labels"}"#,
        ));
        assert!(
            matches!(&invalid, Err(f) if !f.retry && f.reason.contains("bad labels")),
            "{invalid:?}"
        );
        let auth = connect_outcome(&answer(401, &[], None, "no"));
        assert!(matches!(&auth, Err(f) if !f.retry), "{auth:?}");
        let down = connect_outcome(&answer(503, &[], None, "<html>"));
        assert!(
            matches!(&down, Err(f) if f.retry && f.reason.contains("<html>")),
            "{down:?}"
        );
    }
}
