//! What `go tool pprof` prints only rounded: a profile's window, read from
//! the protobuf itself.

use std::io::Read;

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
