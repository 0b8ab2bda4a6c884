//! A window's profile as one push request message per backend.

use bytes::Bytes;
use prost::Message;

use super::{
    proto::{
        LabelPair, LabelSet, ParcaSample, ParcaSeries, PushRequest, PyroscopeSample, PyroscopeSeries,
        WriteRawRequest,
    },
    series::{self, PROFILE_NAME},
    settings::{Backend, ExtraLabel},
};
use crate::profile::{Profile, pprof};

/// The labels every series of this daemon carries besides its service.
#[derive(Clone, Debug)]
pub struct CommonLabels {
    pub hostname: String,
    pub extra: Vec<ExtraLabel>,
}

/// One window, encoded for one backend.
#[derive(Clone, Debug)]
pub struct Encoded {
    /// The request message (protobuf), without transport framing.
    pub message: Bytes,
    /// Samples in it, all series together.
    pub samples: u64,
    pub series: usize,
}

/// Encodes `window` (a whole-machine CPU profile) for `backend`.
pub fn encode(backend: Backend, window: &Profile, common: &CommonLabels) -> std::io::Result<Encoded> {
    let labels = series::sample_labels(backend);
    let series = series::split(window, labels);
    let mut encoded = Vec::with_capacity(series.len());
    for one in &series {
        let pairs = series_labels(&one.service_name, common);
        let raw_profile = pprof::encode_gzip_with(&one.profile, labels)?;
        encoded.push((pairs, raw_profile));
    }
    let message = match backend {
        Backend::Pyroscope => PushRequest {
            series: encoded
                .into_iter()
                .map(|(labels, raw_profile)| PyroscopeSeries {
                    labels,
                    samples: vec![PyroscopeSample {
                        raw_profile,
                        id: String::new(),
                    }],
                })
                .collect(),
        }
        .encode_to_vec(),
        Backend::Parca => WriteRawRequest {
            tenant: String::new(),
            series: encoded
                .into_iter()
                .map(|(labels, raw_profile)| ParcaSeries {
                    labels: Some(LabelSet { labels }),
                    samples: vec![ParcaSample { raw_profile }],
                })
                .collect(),
            normalized: false,
        }
        .encode_to_vec(),
    };
    Ok(Encoded {
        message: Bytes::from(message),
        samples: window.total_samples(),
        series: series.len(),
    })
}

/// A series' labels, sorted by name as both backends keep them.
pub fn series_labels(service_name: &str, common: &CommonLabels) -> Vec<LabelPair> {
    let pair = |name: &str, value: &str| LabelPair {
        name: name.to_owned(),
        value: value.to_owned(),
    };
    let mut labels = vec![pair("__name__", PROFILE_NAME), pair("service_name", service_name)];
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
