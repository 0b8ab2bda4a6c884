//! The two texts `/metrics` is served in, and which a request gets.
//!
//! prometheus-client encodes OpenMetrics 1.0.0 only; clients that do not ask
//! for it (no `Accept`, `*/*`, `text/plain`: curl, `promtool check metrics`,
//! older scrapers) get the Prometheus text format 0.0.4, converted from it
//! ([`text004`]). Prometheus itself asks for OpenMetrics first and gets it.

mod accept;
mod text004;

use axum::{
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};

use self::accept::Format;
use crate::serve::HttpError;

/// The `Content-Type` of each format.
const OPEN_METRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT_004: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The answer to a request with `request_headers`, from the whole OpenMetrics
/// exposition (ending in `# EOF`). A text that cannot be converted is our
/// bug: a 500 that says where, rather than a body scrapers would misread.
pub fn respond(request_headers: &HeaderMap, open_metrics: String) -> Result<Response, HttpError> {
    let accept = request_headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok());
    let (body, content_type) = match accept::negotiate(accept) {
        Format::OpenMetrics => (open_metrics, OPEN_METRICS),
        Format::Text004 => {
            let text = text004::to_text_004(&open_metrics).map_err(|err| {
                HttpError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("converting metrics to the text format 0.0.4: {err}"),
                )
            })?;
            (text, TEXT_004)
        }
    };
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // The body depends on Accept: caches must key on it.
    headers.insert(header::VARY, HeaderValue::from_static("Accept"));
    Ok(response)
}
