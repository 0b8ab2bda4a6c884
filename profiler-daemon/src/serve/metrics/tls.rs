//! TLS metrics: handshakes by outcome and certificate reloads (SIGHUP).

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;

use crate::serve::tls::TlsSnapshot;
use crate::telemetry::labelled_counters;

pub fn encode(out: &mut DescriptorEncoder, tls: &TlsSnapshot) -> fmt::Result {
    labelled_counters(
        out,
        "tls_handshakes",
        "TLS handshakes on the listener, by outcome (not_tls: plain HTTP or other bytes; \
         client_certificate: none, or not signed by the client CA)",
        "outcome",
        &tls.handshakes,
    )?;
    labelled_counters(
        out,
        "tls_reloads",
        "Reloads of the TLS certificate, key and client CA on SIGHUP, by outcome (failed: the \
         previous ones stay in use)",
        "outcome",
        &tls.reloads,
    )
}
