//! What `go tool pprof` prints only rounded or not at all, read from the
//! protobuf itself: a profile's window, and its samples with each frame's
//! mapping, file and line ([`decode`]).

use std::{collections::HashMap, io::Read};

/// `time_nanos` and `duration_nanos` (fields 9 and 10 of `Profile`) of a
/// gzipped profile; 0 for a field that is absent (protobuf's default).
pub fn window_nanos(gzipped: &[u8]) -> (u64, u64) {
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(gzipped)
        .read_to_end(&mut bytes)
        .expect("a profile is gzipped protobuf");
    let (mut time, mut duration) = (0, 0);
    let mut at = 0;
    while at < bytes.len() {
        let key = varint(&bytes, &mut at);
        match (key >> 3, key & 7) {
            (9, 0) => time = varint(&bytes, &mut at),
            (10, 0) => duration = varint(&bytes, &mut at),
            (_, 0) => {
                varint(&bytes, &mut at);
            }
            (_, 1) => at += 8,
            (_, 2) => {
                let len = varint(&bytes, &mut at);
                at += usize::try_from(len).expect("a field length within the profile");
            }
            (_, 5) => at += 4,
            (field, wire) => panic!("field {field} of the profile has wire type {wire}, not protobuf's"),
        }
    }
    assert_eq!(at, bytes.len(), "the profile's last field runs past its end");
    (time, duration)
}

fn varint(bytes: &[u8], at: &mut usize) -> u64 {
    let mut value = 0;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at).expect("a varint within the profile");
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return value;
        }
    }
    panic!("a varint of the profile is longer than 10 bytes")
}

/// One frame of a decoded sample: a line of a location (an inlined
/// function is a frame of its own, innermost first, as pprof orders them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    pub function: String,
    /// The function's name as the binary or the kernel spells it (mangled).
    pub system_name: String,
    /// The function's file name (a source file, or "" when unknown).
    pub file: String,
    pub line: i64,
    /// The file name of the location's mapping: the binary or library, or
    /// a pseudo mapping such as `[kernel.kallsyms]` or `[python]`.
    pub mapping: String,
    pub address: u64,
}

/// One sample of a decoded profile.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub values: Vec<i64>,
    /// String labels, and numeric ones as their decimal text.
    pub labels: HashMap<String, String>,
    /// Leaf first, as pprof orders a sample's locations.
    pub frames: Vec<Frame>,
}

impl Sample {
    pub fn label(&self, key: &str) -> &str {
        self.labels.get(key).map_or("", String::as_str)
    }

    /// Its first value: the sample count of a CPU profile.
    pub fn count(&self) -> u64 {
        self.values
            .first()
            .map_or(0, |&value| u64::try_from(value).unwrap_or(0))
    }
}

/// A profile read from its protobuf with [`crate::protowire`]: what
/// `go tool pprof -raw` prints, with each location's mapping and each
/// line's file and number kept.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    pub samples: Vec<Sample>,
    pub time_nanos: u64,
    pub duration_nanos: u64,
}

impl Profile {
    /// Samples whose `key` label is one of `values`.
    pub fn with_label<'a>(
        &'a self,
        key: &'a str,
        values: &'a [String],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples
            .iter()
            .filter(move |sample| values.iter().any(|value| value == sample.label(key)))
    }
}

fn message<'a>(what: &str, bytes: &'a [u8]) -> Vec<crate::protowire::Field<'a>> {
    crate::protowire::fields(bytes).unwrap_or_else(|err| panic!("a profile's {what}: {err}"))
}

/// Decodes a gzipped profile, panicking with what is wrong with it.
pub fn decode(gzipped: &[u8]) -> Profile {
    use crate::protowire::{bytes_of, fields, packed_varints, varint_of};
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(gzipped)
        .read_to_end(&mut bytes)
        .expect("a profile is gzipped protobuf");
    let profile = fields(&bytes).unwrap_or_else(|err| panic!("a profile is protobuf: {err}"));
    let strings: Vec<String> = bytes_of(&profile, 6)
        .iter()
        .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
        .collect();
    let string = |index: u64| {
        usize::try_from(index)
            .ok()
            .and_then(|index| strings.get(index))
            .cloned()
            .unwrap_or_else(|| panic!("string {index} past the profile's table of {}", strings.len()))
    };
    let mappings: HashMap<u64, String> = bytes_of(&profile, 3)
        .iter()
        .map(|bytes| message("mapping", bytes))
        .map(|mapping| (varint_of(&mapping, 1), string(varint_of(&mapping, 5))))
        .collect();
    // id -> (name, system name, file)
    let functions: HashMap<u64, (String, String, String)> = bytes_of(&profile, 5)
        .iter()
        .map(|bytes| message("function", bytes))
        .map(|function| {
            (
                varint_of(&function, 1),
                (
                    string(varint_of(&function, 2)),
                    string(varint_of(&function, 3)),
                    string(varint_of(&function, 4)),
                ),
            )
        })
        .collect();
    let locations: HashMap<u64, Vec<Frame>> = bytes_of(&profile, 4)
        .iter()
        .map(|bytes| message("location", bytes))
        .map(|location| {
            let mapping = mappings
                .get(&varint_of(&location, 2))
                .cloned()
                .unwrap_or_default();
            let address = varint_of(&location, 3);
            let frames = bytes_of(&location, 4)
                .iter()
                .map(|bytes| message("line", bytes))
                .map(|line| {
                    let (function, system_name, file) =
                        functions.get(&varint_of(&line, 1)).cloned().unwrap_or_default();
                    Frame {
                        function,
                        system_name,
                        file,
                        // int64 on the wire: a negative line is a 10-byte varint.
                        line: varint_of(&line, 2) as i64,
                        mapping: mapping.clone(),
                        address,
                    }
                })
                .collect::<Vec<_>>();
            (varint_of(&location, 1), frames)
        })
        .collect();
    let samples = bytes_of(&profile, 2)
        .iter()
        .map(|bytes| message("sample", bytes))
        .map(|sample| {
            let ids = packed_varints(&sample, 1).unwrap_or_else(|err| panic!("a sample's locations: {err}"));
            let values = packed_varints(&sample, 2)
                .unwrap_or_else(|err| panic!("a sample's values: {err}"))
                .into_iter()
                .map(|value| value as i64)
                .collect();
            let labels = bytes_of(&sample, 3)
                .iter()
                .map(|bytes| message("label", bytes))
                .map(|label| {
                    let key = string(varint_of(&label, 1));
                    let value = match varint_of(&label, 2) {
                        0 => varint_of(&label, 3).to_string(),
                        index => string(index),
                    };
                    (key, value)
                })
                .collect();
            let frames =
                ids.iter()
                    .flat_map(|id| {
                        locations.get(id).cloned().unwrap_or_else(|| {
                            panic!("a sample names location {id}, which the profile lacks")
                        })
                    })
                    .collect();
            Sample {
                values,
                labels,
                frames,
            }
        })
        .collect();
    Profile {
        samples,
        time_nanos: varint_of(&profile, 9),
        duration_nanos: varint_of(&profile, 10),
    }
}
