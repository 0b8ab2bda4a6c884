//! A window's profile as one push request message per backend.

use bytes::Bytes;
use prost::Message;

use super::{
    heap::{self, Heap},
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
pub fn encode(
    backend: Backend,
    window: &[Profile],
    heap: Option<&Heap>,
    common: &CommonLabels,
) -> std::io::Result<Vec<Encoded>> {
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
    if let Some(heap) = heap
        && let Some(name) = backend.profile_name(heap.allocated.profile_type)
    {
        for one in heap::split(heap, labels) {
            let mut pairs = series_labels(name, &one.service_name, common);
            match backend {
                Backend::Pyroscope => {
                    // Its allocations are the window's, not running totals.
                    pairs.push(label("__delta__", "false"));
                    pairs.sort_by(|a, b| a.name.cmp(&b.name));
                    let raw_profile = pprof::gzip_bytes(&one.together().encode_to_vec())?;
                    encoded.push((pairs, raw_profile, one.samples()));
                }
                Backend::Parca => {
                    // Two profiles of one series; its samples counted once.
                    let mut samples = one.samples();
                    for part in one.apart(labels).into_iter().flatten() {
                        let raw_profile = pprof::gzip_bytes(&part.encode_to_vec())?;
                        encoded.push((pairs.clone(), raw_profile, std::mem::take(&mut samples)));
                    }
                }
            }
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
    let mut labels = vec![
        label("__name__", profile_name),
        label("service_name", service_name),
    ];
    // A configured hostname label replaces the machine's name.
    if !common.extra.iter().any(|extra| extra.name == "hostname") {
        labels.push(label("hostname", &common.hostname));
    }
    labels.extend(common.extra.iter().map(|extra| label(&extra.name, &extra.value)));
    labels.sort_by(|a, b| a.name.cmp(&b.name));
    labels
}

fn label(name: &str, value: &str) -> LabelPair {
    LabelPair {
        name: name.to_owned(),
        value: value.to_owned(),
    }
}

#[cfg(test)]
mod tests;
