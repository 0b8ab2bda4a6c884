//! The request messages of the two push APIs, written out by hand like
//! pprof's (no protoc here). Field numbers and types follow the upstream
//! definitions exactly:
//! - Pyroscope `push.v1.PushRequest` (api/push/v1/push.proto, labels from
//!   types.v1.LabelPair);
//! - Parca `parca.profilestore.v1alpha1.WriteRawRequest`
//!   (proto/parca/profilestore/v1alpha1/profilestore.proto, v0.21.0).
//!
//! Both responses are empty messages: nothing of them is decoded.

/// Pyroscope `push.v1.PushRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PushRequest {
    #[prost(message, repeated, tag = "1")]
    pub series: Vec<PyroscopeSeries>,
}

/// Pyroscope `push.v1.RawProfileSeries`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PyroscopeSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<LabelPair>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<PyroscopeSample>,
}

/// Pyroscope `types.v1.LabelPair`, and Parca's `Label` (the same fields).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct LabelPair {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// Pyroscope `push.v1.RawSample`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PyroscopeSample {
    /// A pprof profile (gzip-compressed, as served).
    #[prost(bytes = "vec", tag = "1")]
    pub raw_profile: Vec<u8>,
    /// A unique id of the profile (Pyroscope's request id for it).
    #[prost(string, tag = "2")]
    pub id: String,
}

/// Parca `WriteRawRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRawRequest {
    /// Deprecated upstream; left empty.
    #[prost(string, tag = "1")]
    pub tenant: String,
    #[prost(message, repeated, tag = "2")]
    pub series: Vec<ParcaSeries>,
    /// Whether addresses are already file-relative. Ours are as sampled
    /// (process addresses, as served to scrapers), so false: Parca then
    /// treats them as it treats a scrape of ours. The functions come along.
    #[prost(bool, tag = "3")]
    pub normalized: bool,
}

/// Parca `RawProfileSeries`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ParcaSeries {
    #[prost(message, optional, tag = "1")]
    pub labels: Option<LabelSet>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<ParcaSample>,
}

/// Parca `LabelSet`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LabelSet {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<LabelPair>,
}

/// Parca `RawSample` (its `executable_info`, field 2, is for unsymbolized
/// profiles; ours carry their functions).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ParcaSample {
    #[prost(bytes = "vec", tag = "1")]
    pub raw_profile: Vec<u8>,
}
