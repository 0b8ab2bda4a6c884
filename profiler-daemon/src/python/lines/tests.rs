//! Real tables (a function with a `with`, a `try` and a loop, compiled by
//! each version; expected lines from `dis.findlinestarts` (3.8),
//! `co_lines()` (3.10) and `co_positions()` (3.11+), "no line" as 0), and
//! random bytes.

use super::*;

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&text[at..at + 2], 16).expect("test hex"))
        .collect()
}

fn check(format: LineTableFormat, table: &str, expected: &[u32]) {
    let table = LineTable::parse(format, 2, &hex(table));
    assert!(!table.is_truncated());
    let lines: Vec<u32> = (0..expected.len() as u64).map(|at| table.line(at)).collect();
    assert_eq!(lines, expected);
}

#[test]
fn lnotab_3_8() {
    let expected = [
        3, 3, 3, 3, 3, 4, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 8,
        8, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11, 11, 13, 13, 13, 13, 13, 14, 14,
    ];
    let bytes = "00010a0102010a0110011c0104010c0108010a020a01";
    check(LineTableFormat::Lnotab, bytes, &expected);
    // The last line runs on past the table (PyCode_Addr2Line).
    let table = LineTable::parse(LineTableFormat::Lnotab, 2, &hex(bytes));
    assert_eq!(table.line(1000), 14);
    assert_eq!(LineTable::parse(LineTableFormat::Lnotab, 7, &[]).line(3), 7);
}

#[test]
fn linetable_3_10() {
    let expected = [
        3, 3, 3, 3, 3, 4, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 0, 0, 0, 0, 6, 0, 3, 3, 3, 3,
        3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 8, 8, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11, 11, 13, 13, 13,
        13, 13, 14, 14,
    ];
    let bytes = "0a0102010a010e010c01088002ff02801cfd04050c0108010a010a020401";
    check(LineTableFormat::Linetable310, bytes, &expected);
    let table = LineTable::parse(LineTableFormat::Linetable310, 2, &hex(bytes));
    assert_eq!(table.line(expected.len() as u64), 0);
}

#[test]
fn locations_3_11() {
    let expected = [
        2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 0, 6, 6, 6, 6,
        6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 0, 0, 0, 0, 6, 0, 0, 0, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
        0, 0, 0, 3, 3, 3, 3, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 11,
        11, 11, 11, 11, 11, 13, 13, 13, 13, 13, 13, 14, 14,
    ];
    let bytes = concat!(
        "8000dd090d886189178c17f0000405119041f002030911d80c0d884189438c4388438843f8dd0f10",
        "f000010911f000010911f000010911d80c108844884488448844f8f8f8f8f003010911f8f8f8f007",
        "040511f000040511f000040511f100040511f400040511f000040511f000040511f000040511f000",
        "040511f000040511f000040511f8f8f8f000040511f000040511f000040511f000040511f00a000d",
        "0e8045dd0d12903189588c58f000040517f0000405178801d80b0c88718935f000030917d80c1190",
        "51894a88458845e00c119051894a88458845d80b10804c"
    );
    check(LineTableFormat::Locations, bytes, &expected);
    let table = LineTable::parse(LineTableFormat::Locations, 2, &hex(bytes));
    assert_eq!(table.line(expected.len() as u64), 0);
}

#[test]
fn locations_3_12_and_3_13() {
    let expected_3_12 = [
        2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 5, 5, 5, 5, 5, 5, 5, 3, 3, 3, 3, 3, 3, 3, 3, 8, 8, 9, 9, 9,
        9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 13, 13, 13, 13, 13, 13,
        9, 14, 14, 0, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 0, 0, 0, 0, 6, 0, 0, 0, 3, 3, 3, 3, 3, 3, 3, 3,
        3, 0, 0, 0,
    ];
    let bytes_3_12 = concat!(
        "8000dc090d88618b17f0000405119041f002030911d90c0d8c43f705040511f00a000d0e8045dc0d",
        "1290318b58f2000405178801d80b0c88718a35d80c119051894a8945e00c119051894a8945f00904",
        "0517f00a000c11804cf8f411001011f200010911dc0c10fbf003010911faf707040511f000040511fa"
    );
    check(LineTableFormat::Locations, bytes_3_12, &expected_3_12);
    let expected_3_13 = [
        2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 5, 5, 5, 5, 5, 5, 5, 3, 3, 3, 3, 3, 3, 3, 3, 8, 8, 9, 9, 9,
        9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 13,
        13, 13, 13, 13, 13, 9, 9, 14, 14, 0, 6, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 0, 0, 0, 0, 6, 0, 0,
        0, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0, 0, 0,
    ];
    let bytes_3_13 = concat!(
        "8000dc090d88618c179041f002030911d90c0d8c43f705000a11f00a000d0e8045dc0d1290318e58",
        "8801d80b0c88718f35d80c11894a8a45e00c11894a8a45f109000e16f00a000c11804cf8f411001011",
        "f300010911dc0c10fbf003010911faf707000a118d17fa"
    );
    check(LineTableFormat::Locations, bytes_3_13, &expected_3_13);
}

#[test]
fn malformed_locations_keep_what_came_before() {
    // A first byte without bit 7 (bytes without it after an entry's first
    // are that entry's, as CPython reads them).
    let table = LineTable::parse(LineTableFormat::Locations, 5, &[0x01, 0x80]);
    assert!(table.is_truncated());
    assert_eq!(table.line(0), 0);
    // A kind 13 varint running on past 32 bits.
    let table = LineTable::parse(
        LineTableFormat::Locations,
        5,
        &[0xe8, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x01],
    );
    assert!(table.is_truncated());
    // A kind 13 entry cut short: its varint says "more" at the end.
    let table = LineTable::parse(LineTableFormat::Locations, 5, &[0x80, 0x00, 0xe9, 0x42]);
    assert_eq!((table.line(0), table.line(1)), (5, 0));
    // Deltas taking the line below 1: no line, no wrap.
    let table = LineTable::parse(LineTableFormat::Locations, 1, &[0xe8, 0x05, 0x80, 0x00]);
    assert_eq!((table.line(0), table.line(1)), (0, 0));
    // A first line beyond i32 (a forged int) reads as negative: no line.
    let table = LineTable::parse(LineTableFormat::Lnotab, u32::MAX, &[2, 0]);
    assert_eq!(table.line(0), 0);
}

#[test]
fn ranges_are_capped() {
    // Alternating lines (kind 11: +1, kind 13: -1), one unit each: 3 ×
    // MAX_RANGES entries.
    let bytes: Vec<u8> = (0..3 * MAX_RANGES)
        .flat_map(|at| if at % 2 == 0 { [0xd8, 0x01] } else { [0xe8, 0x03] })
        .collect();
    let table = LineTable::parse(LineTableFormat::Locations, 10, &bytes);
    assert!(table.is_truncated());
    assert!(table.weight() <= MAX_RANGES * 8);
    assert_eq!((table.line(0), table.line(1)), (11, 10));
    assert_eq!(table.line(3 * MAX_RANGES as u64 - 1), 0);
}

/// xorshift64*: deterministic, no crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

#[test]
fn random_bytes_never_panic_and_stay_bounded() {
    let formats = [
        LineTableFormat::Lnotab,
        LineTableFormat::Linetable310,
        LineTableFormat::Locations,
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let started = std::time::Instant::now();
    for case in 0..20_000 {
        // Mostly short tables, sometimes past the cap.
        let len = match case % 100 {
            0 => MAX_TABLE + rng.below(4096) as usize,
            1..=9 => rng.below(16 * 1024) as usize,
            _ => rng.below(256) as usize,
        };
        // Bytes biased towards valid-looking entries: bit 7 set half the time.
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                let byte = rng.next() as u8;
                if rng.below(2) == 0 { byte | 0x80 } else { byte }
            })
            .collect();
        let first_line = match rng.below(4) {
            0 => rng.next() as u32,
            _ => rng.below(5000) as u32,
        };
        let format = formats[rng.below(3) as usize];
        let table = LineTable::parse(format, first_line, &bytes);
        assert!(table.weight() <= MAX_RANGES * 8);
        for _ in 0..16 {
            let index = match rng.below(3) {
                0 => rng.next(),
                _ => rng.below(1 << 18),
            };
            let _ = table.line(index);
        }
    }
    // ~25 MB of input in all: well under a second in release builds; the
    // bound catches anything worse than linear.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}
