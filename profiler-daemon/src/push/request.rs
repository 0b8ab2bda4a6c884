//! A window's profile as one push request message per backend.

use bytes::Bytes;
use prost::Message;

use super::{
    proto::{
        LabelPair, LabelSet, ParcaSample, ParcaSeries, PushRequest, PyroscopeSample, PyroscopeSeries,
        WriteRawRequest,
    },
    series,
    settings::{Backend, ExtraLabel},
};
use crate::profile::{Profile, pprof};

/// The labels every series of this daemon carries besides its service.
#[derive(Clone, Debug)]
pub struct CommonLabels {
    pub hostname: String,
    pub extra: Vec<ExtraLabel>,
}

/// One request of a window, encoded for one backend.
#[derive(Clone, Debug)]
pub struct Encoded {
    /// The request message (protobuf), without transport framing.
    pub message: Bytes,
    /// Samples in it.
    pub samples: u64,
    pub series: usize,
}

/// Encodes a window's whole-machine profiles (one per profile type) for
/// `backend`, each type under the name the backend knows it by
/// ([`Backend::profile_name`]; types it has no name for are left out): for
/// Parca one request, which it stores whole or not at all; for Pyroscope one
/// request per series, since it may store some series of a request and
/// still answer an error, and a retry of the whole would count those twice.
pub fn encode(backend: Backend, window: &[Profile], common: &CommonLabels) -> std::io::Result<Vec<Encoded>> {
    let labels = series::sample_labels(backend);
    let mut encoded = Vec::new();
    for profile in window {
        let Some(name) = backend.profile_name(profile.profile_type) else {
            continue;
        };
        for one in series::split(profile, labels) {
            let pairs = series_labels(name, &one.service_name, common);
            let raw_profile = pprof::encode_gzip_with(&one.profile, labels)?;
            encoded.push((pairs, raw_profile, one.profile.total_samples()));
        }
    }
    Ok(match backend {
        Backend::Pyroscope => encoded
            .into_iter()
            .map(|(labels, raw_profile, samples)| Encoded {
                message: Bytes::from(
                    PushRequest {
                        series: vec![PyroscopeSeries {
                            labels,
                            samples: vec![PyroscopeSample {
                                raw_profile,
                                id: String::new(),
                            }],
                        }],
                    }
                    .encode_to_vec(),
                ),
                samples,
                series: 1,
            })
            .collect(),
        Backend::Parca if encoded.is_empty() => Vec::new(),
        Backend::Parca => {
            let count = encoded.len();
            let samples = encoded.iter().map(|(_, _, samples)| samples).sum();
            let message = WriteRawRequest {
                tenant: String::new(),
                series: encoded
                    .into_iter()
                    .map(|(labels, raw_profile, _)| ParcaSeries {
                        labels: Some(LabelSet { labels }),
                        samples: vec![ParcaSample { raw_profile }],
                    })
                    .collect(),
                normalized: false,
            };
            vec![Encoded {
                message: Bytes::from(message.encode_to_vec()),
                samples,
                series: count,
            }]
        }
    })
}

/// A series' labels, sorted by name as both backends keep them.
pub fn series_labels(profile_name: &str, service_name: &str, common: &CommonLabels) -> Vec<LabelPair> {
    let pair = |name: &str, value: &str| LabelPair {
        name: name.to_owned(),
        value: value.to_owned(),
    };
    let mut labels = vec![pair("__name__", profile_name), pair("service_name", service_name)];
    // A configured hostname label replaces the machine's name.
    if !common.extra.iter().any(|label| label.name == "hostname") {
        labels.push(pair("hostname", &common.hostname));
    }
    labels.extend(common.extra.iter().map(|label| pair(&label.name, &label.value)));
    labels.sort_by(|a, b| a.name.cmp(&b.name));
    labels
}

#[cfg(test)]
mod tests;
