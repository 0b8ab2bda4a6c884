//! Line tables of CPython code objects: from instruction index to line.
//!
//! Pure parsers of hostile bytes: each is linear in the input (capped at
//! [`MAX_TABLE`]), uses checked arithmetic and never panics. A malformed
//! table is not an error: what was parsed before the fault stands, and the
//! instructions past it have no line (0).
//!
//! The three formats, all starting from `co_firstlineno`:
//! - 3.8, 3.9 `co_lnotab`: (byte offset delta u8, line delta i8) pairs; an
//!   offset has the line of the last pair that starts at or before it
//!   (CPython's `PyCode_Addr2Line`), the last line running on to the end.
//! - 3.10 `co_linetable` (PEP 626): (byte length u8, line delta i8) pairs,
//!   one range each; a delta of -128 means "no line" (the line stays).
//! - 3.11+ location table (CPython's Objects/locations.md): entries whose
//!   first byte has bit 7 set, kind = bits 3–6, covering (bits 0–2) + 1 code
//!   units; the line delta is 0 (kinds 0–9), kind − 10 (10–12), a signed
//!   varint (13, 14) or none (15: no line). The next entry starts at the
//!   next byte with bit 7 set, as CPython finds it.
//!
//! The parsed form is a list of ranges of code units with their line,
//! equal neighbours merged: usually smaller than the bytes (3.11 has an
//! entry per instruction, a range is per line), and at most [`MAX_RANGES`].

use crate::python::layout::LineTableFormat;

/// Line tables longer than this are read (and parsed) only this far.
pub const MAX_TABLE: usize = 64 * 1024;
/// Ranges kept of one table (8 bytes each: 64 KiB at most). A real code
/// object needs one per line of its source at most (a module body of a
/// generated 8000-line table would lose its tail: instructions past the
/// last range have no line).
pub const MAX_RANGES: usize = 8192;

/// Code units (instruction indexes) [previous range's end, end) are at `line`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    end: u32,
    /// 0: no line.
    line: u32,
}

/// A parsed line table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LineTable {
    ranges: Box<[Range]>,
    /// The line of instructions past the last range (only lnotab has one).
    tail: u32,
    /// The bytes were malformed, or had more ranges than kept.
    truncated: bool,
}

impl LineTable {
    pub fn parse(format: LineTableFormat, first_line: u32, bytes: &[u8]) -> Self {
        let bytes = &bytes[..bytes.len().min(MAX_TABLE)];
        // `co_firstlineno` is a C int: the sampler stores its bits as u32.
        let first_line = i64::from(first_line as i32);
        match format {
            LineTableFormat::Lnotab => parse_lnotab(first_line, bytes),
            LineTableFormat::Linetable310 => parse_linetable310(first_line, bytes),
            LineTableFormat::Locations => parse_locations(first_line, bytes),
        }
    }

    /// The line of the instruction at `index` (code units), 0 if none.
    pub fn line(&self, index: u64) -> u32 {
        let after = self.ranges.partition_point(|range| u64::from(range.end) <= index);
        match self.ranges.get(after) {
            Some(range) => range.line,
            None => self.tail,
        }
    }

    pub fn is_truncated(&self) -> bool {
        self.truncated
    }

    /// Bytes of memory this table holds.
    pub fn weight(&self) -> usize {
        self.ranges.len() * std::mem::size_of::<Range>()
    }
}

/// Builds the ranges in order, merging equal neighbours, up to the cap.
struct Builder {
    ranges: Vec<Range>,
    /// End of the last range (code units).
    end: u32,
    truncated: bool,
}

impl Builder {
    fn new() -> Self {
        Self {
            ranges: Vec::new(),
            end: 0,
            truncated: false,
        }
    }

    /// Code units [self.end, end) are at `line`. False once no more fit.
    fn push(&mut self, end: u32, line: Option<i64>) -> bool {
        if self.truncated {
            return false;
        }
        if end <= self.end {
            return true;
        }
        // Lines outside 1..=u32::MAX are no line (a forged delta).
        let line = line.and_then(|line| u32::try_from(line).ok()).unwrap_or(0);
        self.end = end;
        let full = self.ranges.len() >= MAX_RANGES;
        match self.ranges.last_mut() {
            Some(last) if last.line == line => last.end = end,
            _ if full => {
                self.truncated = true;
                return false;
            }
            _ => self.ranges.push(Range { end, line }),
        }
        true
    }

    fn finish(self, tail: Option<i64>, malformed: bool) -> LineTable {
        let tail = if self.truncated || malformed {
            0
        } else {
            tail.and_then(|line| u32::try_from(line).ok()).unwrap_or(0)
        };
        LineTable {
            ranges: self.ranges.into_boxed_slice(),
            tail,
            truncated: self.truncated || malformed,
        }
    }
}

/// Byte offsets to code units: byte offset o is in unit o/2, so a range
/// of bytes [s, e) holds units [ceil(s/2), ceil(e/2)).
fn units(bytes: u64) -> Option<u32> {
    u32::try_from(bytes.div_ceil(2)).ok()
}

/// 3.8, 3.9: `co_lnotab`.
fn parse_lnotab(first_line: i64, bytes: &[u8]) -> LineTable {
    let mut builder = Builder::new();
    let mut line = first_line;
    let mut offset: u64 = 0;
    // 32 Ki pairs of u8 offset deltas and i8 line deltas cannot overflow
    // the u64 offset and the i64 line (started from an i32).
    for pair in bytes.as_chunks::<2>().0 {
        let next = offset + u64::from(pair[0]);
        let Some(end) = units(next) else {
            return builder.finish(None, true);
        };
        if !builder.push(end, Some(line)) {
            break;
        }
        offset = next;
        line += i64::from(pair[1] as i8);
    }
    builder.finish(Some(line), false)
}

/// 3.10: `co_linetable`.
fn parse_linetable310(first_line: i64, bytes: &[u8]) -> LineTable {
    let mut builder = Builder::new();
    let mut line = first_line;
    let mut offset: u64 = 0;
    // As in lnotab: these sums cannot overflow.
    for pair in bytes.as_chunks::<2>().0 {
        offset += u64::from(pair[0]);
        let delta = pair[1] as i8;
        let range_line = if delta == -128 {
            None
        } else {
            line += i64::from(delta);
            Some(line)
        };
        let Some(end) = units(offset) else {
            return builder.finish(None, true);
        };
        if !builder.push(end, range_line) {
            break;
        }
    }
    builder.finish(None, false)
}

/// 3.11+: the location table.
fn parse_locations(first_line: i64, bytes: &[u8]) -> LineTable {
    let mut builder = Builder::new();
    let mut line = first_line;
    let mut end: u32 = 0;
    let mut at = 0;
    while let Some(&first) = bytes.get(at) {
        if first & 0x80 == 0 {
            return builder.finish(None, true);
        }
        // The entry runs to the next byte with bit 7 set (`at` < len: the
        // slice and the one below are in bounds).
        let rest = &bytes[at + 1..];
        let size = rest
            .iter()
            .position(|byte| byte & 0x80 != 0)
            .unwrap_or(rest.len());
        let extra = &rest[..size];
        at += 1 + size;

        let kind = (first >> 3) & 15;
        let delta = match kind {
            0..=9 => Some(0),
            10..=12 => Some(i64::from(kind - 10)),
            13 | 14 => match signed_varint(extra) {
                Some(delta) => Some(delta),
                None => return builder.finish(None, true),
            },
            _ => None,
        };
        let range_line = match delta {
            // Deltas are under 2^31 and at most 64 Ki of them: this cannot
            // fail, but a forged table gets checked arithmetic anyway.
            Some(delta) => match line.checked_add(delta) {
                Some(next) => {
                    line = next;
                    Some(line)
                }
                None => return builder.finish(None, true),
            },
            None => None,
        };
        // At most 8 units an entry, 64 Ki entries: far from u32::MAX.
        end = end.saturating_add(u32::from(first & 7) + 1);
        if !builder.push(end, range_line) {
            break;
        }
    }
    builder.finish(None, false)
}

/// An unsigned varint: 6-bit chunks, least significant first, 0x40 = more.
/// None if it runs past the entry or past 32 bits.
fn varint(bytes: &[u8]) -> Option<u32> {
    let mut value: u32 = 0;
    for (index, byte) in bytes.iter().enumerate() {
        let shift = 6 * index as u32;
        let chunk = u32::from(byte & 63);
        if shift >= 32 || (shift > 26 && chunk >> (32 - shift) != 0) {
            return None;
        }
        value |= chunk << shift;
        if byte & 64 == 0 {
            return Some(value);
        }
    }
    None
}

/// A signed varint: the sign in the least significant bit.
fn signed_varint(bytes: &[u8]) -> Option<i64> {
    let value = varint(bytes)?;
    let magnitude = i64::from(value >> 1);
    Some(if value & 1 != 0 { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests;
