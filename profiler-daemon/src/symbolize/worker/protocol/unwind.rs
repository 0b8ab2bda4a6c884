//! The unwind-table answer of the protocol, and the daemon's checks of it.

use profiler_common::{CfaRule, RbpRule, UnwindRow};

use super::MAX_RESPONSE_BYTES;

/// Rows in one unwind table: a response holding them (8 bytes each) and the
/// rest of its fields fits a frame with 1 MiB to spare (8,257,536 rows, about
/// three times the largest tables reported in the field).
pub const MAX_TABLE_ROWS: usize = (MAX_RESPONSE_BYTES - (1 << 20)) / size_of::<UnwindRow>();
/// PT_LOAD segments reported per file (real files have 2 to 5).
pub const MAX_LOAD_SEGMENTS: usize = 1024;
/// A longer build id is not one (GNU ld writes 20 bytes).
pub const MAX_BUILD_ID_BYTES: usize = 64;

/// A file's compiled CFI, as the worker says it is: validate with
/// [`UnwindTable::rows`] and [`UnwindTable::check_segments`] before use.
#[derive(Clone, PartialEq, prost::Message)]
pub struct UnwindTable {
    /// Packed little-endian `UnwindRow`s, 8 bytes each. `Bytes`: decoded
    /// from a `Bytes` frame it is a slice of the frame, not a copy (a table
    /// can be megabytes, and three copies of it were the daemon's peak heap).
    #[prost(bytes = "bytes", tag = "1")]
    pub rows: bytes::Bytes,
    /// FDEs whose rows are in the table.
    #[prost(uint32, tag = "2")]
    pub fdes: u32,
    /// FDEs left out: unreadable, outside executable segments, or overlapping.
    #[prost(uint32, tag = "3")]
    pub fdes_skipped: u32,
    /// Rows (gap rows included) before equal neighbours were merged.
    #[prost(uint32, tag = "4")]
    pub rows_before_merge: u32,
    /// Rows whose CFA or rbp rule the walker cannot follow.
    #[prost(uint32, tag = "5")]
    pub unsupported_rows: u32,
    /// The sections that contributed, e.g. ".eh_frame", ".eh_frame+.debug_frame",
    /// ".eh_frame+debug file .debug_frame".
    #[prost(string, tag = "6")]
    pub source: String,
    /// Time the worker took, reading the file included.
    #[prost(uint64, tag = "7")]
    pub compile_ns: u64,
    /// The file's PT_LOAD segments, in program-header order. A mapping of
    /// the file at `start` from file offset `offset` has the bias
    /// `start - (vaddr + (offset - file_offset))` for the segment holding `offset`.
    #[prost(message, repeated, tag = "8")]
    pub segments: Vec<LoadSegment>,
    /// The file is a CPython interpreter: where its state and eval loop are.
    #[prost(message, optional, tag = "9")]
    pub python: Option<PythonSymbols>,
}

/// A CPython interpreter's symbols (ELF virtual addresses). Unchecked: the
/// daemon checks them against the process's memory and the version's layout.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct PythonSymbols {
    /// `_PyRuntime`.
    #[prost(uint64, tag = "1")]
    pub runtime: u64,
    /// `_PyEval_EvalFrameDefault` and its size.
    #[prost(uint64, tag = "2")]
    pub eval_start: u64,
    #[prost(uint64, tag = "3")]
    pub eval_size: u64,
    /// PY_VERSION_HEX from `Py_Version` (3.11+) or the soname; 0: unknown.
    #[prost(uint32, tag = "4")]
    pub version_hex: u32,
}

#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct LoadSegment {
    #[prost(uint64, tag = "1")]
    pub file_offset: u64,
    #[prost(uint64, tag = "2")]
    pub vaddr: u64,
    #[prost(uint64, tag = "3")]
    pub file_size: u64,
}

/// Why the daemon refuses a table the worker sent (a worker that does this
/// is broken or subverted).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidTable {
    #[error("{0} bytes of rows is not a whole number of rows")]
    PartialRow(usize),
    #[error("{0} rows is over the bound of {MAX_TABLE_ROWS}")]
    TooManyRows(usize),
    #[error("the table has no rows")]
    Empty,
    #[error("row {0} does not come after the one before it")]
    NotSorted(usize),
    #[error("row {0} has unknown rules {1:#04x}")]
    UnknownRule(usize, u8),
    #[error("the last row is not a NoInfo row")]
    NoEnd,
    #[error("{0} load segments is over the bound of {MAX_LOAD_SEGMENTS}")]
    TooManySegments(usize),
    #[error("load segment {0} wraps around the address space")]
    SegmentWraps(usize),
}

impl UnwindTable {
    /// Packs rows as [`UnwindTable::rows`] reads them.
    pub fn encode_rows(rows: &[UnwindRow]) -> bytes::Bytes {
        let mut bytes = Vec::with_capacity(size_of_val(rows));
        for row in rows {
            bytes.extend_from_slice(&row.pc.to_le_bytes());
            bytes.extend_from_slice(&row.cfa_offset.to_le_bytes());
            bytes.extend_from_slice(&row.rbp_offset.to_le_bytes());
            bytes.push(row.rules);
        }
        bytes.into()
    }

    /// The rows, once checked to be what the walker may rely on: a whole
    /// number of rows, at most [`MAX_TABLE_ROWS`], pcs strictly increasing,
    /// known rules, and a final `NoInfo` row.
    pub fn rows(&self) -> Result<Vec<UnwindRow>, InvalidTable> {
        const ROW: usize = size_of::<UnwindRow>();
        if !self.rows.len().is_multiple_of(ROW) {
            return Err(InvalidTable::PartialRow(self.rows.len()));
        }
        let count = self.rows.len() / ROW;
        if count > MAX_TABLE_ROWS {
            return Err(InvalidTable::TooManyRows(count));
        }
        let mut rows = Vec::with_capacity(count);
        for (index, bytes) in self.rows.as_chunks::<ROW>().0.iter().enumerate() {
            let row = UnwindRow {
                pc: u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
                cfa_offset: u16::from_le_bytes([bytes[4], bytes[5]]),
                rbp_offset: i8::from_le_bytes([bytes[6]]),
                rules: bytes[7],
            };
            if row.cfa_rule() > CfaRule::Unsupported as u8 || row.rbp_rule() > RbpRule::Unsupported as u8 {
                return Err(InvalidTable::UnknownRule(index, row.rules));
            }
            if rows.last().is_some_and(|last: &UnwindRow| last.pc >= row.pc) {
                return Err(InvalidTable::NotSorted(index));
            }
            rows.push(row);
        }
        match rows.last() {
            None => Err(InvalidTable::Empty),
            Some(last) if last.cfa_rule() != CfaRule::NoInfo as u8 => Err(InvalidTable::NoEnd),
            Some(_) => Ok(rows),
        }
    }

    /// Checks the load segments: a bounded count, none wrapping around.
    pub fn check_segments(&self) -> Result<(), InvalidTable> {
        if self.segments.len() > MAX_LOAD_SEGMENTS {
            return Err(InvalidTable::TooManySegments(self.segments.len()));
        }
        match self.segments.iter().position(|segment| {
            segment.file_offset.checked_add(segment.file_size).is_none()
                || segment.vaddr.checked_add(segment.file_size).is_none()
        }) {
            Some(index) => Err(InvalidTable::SegmentWraps(index)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pc: u32, cfa: CfaRule, rbp: RbpRule) -> UnwindRow {
        UnwindRow {
            pc,
            cfa_offset: 2,
            rbp_offset: -2,
            rules: cfa as u8 | (rbp as u8) << 4,
        }
    }

    fn table(rows: &[UnwindRow]) -> UnwindTable {
        UnwindTable {
            rows: UnwindTable::encode_rows(rows),
            ..UnwindTable::default()
        }
    }

    #[test]
    fn rows_survive_the_round_trip() {
        let rows = [
            row(0x1000, CfaRule::Rsp, RbpRule::Offset),
            row(0x1004, CfaRule::DerefRsp, RbpRule::Unsupported),
            row(0xffff_ffff, CfaRule::NoInfo, RbpRule::Unchanged),
        ];
        assert_eq!(table(&rows).rows(), Ok(rows.to_vec()));
        assert_eq!(
            UnwindTable::encode_rows(&rows[..1])[..],
            [0x00, 0x10, 0, 0, 2, 0, 0xfe, 0x11]
        );
    }

    #[test]
    fn what_a_subverted_worker_may_send_is_refused() {
        let end = row(0x2000, CfaRule::NoInfo, RbpRule::Unchanged);
        let mut ragged = table(&[end]);
        ragged.rows = [&ragged.rows[..], &[0]].concat().into();
        assert_eq!(ragged.rows(), Err(InvalidTable::PartialRow(9)));
        assert_eq!(table(&[]).rows(), Err(InvalidTable::Empty));
        let first = row(0x1000, CfaRule::Rsp, RbpRule::Unchanged);
        assert_eq!(
            table(&[first, first, end]).rows(),
            Err(InvalidTable::NotSorted(1))
        );
        assert_eq!(table(&[end, first]).rows(), Err(InvalidTable::NotSorted(1)));
        assert_eq!(table(&[first]).rows(), Err(InvalidTable::NoEnd));
        let mut unknown = first;
        unknown.rules = 8;
        assert_eq!(
            table(&[unknown, end]).rows(),
            Err(InvalidTable::UnknownRule(0, 8))
        );
        unknown.rules = 3 << 4;
        assert_eq!(
            table(&[unknown, end]).rows(),
            Err(InvalidTable::UnknownRule(0, 0x30))
        );
        let too_many = UnwindTable {
            rows: vec![0; (MAX_TABLE_ROWS + 1) * size_of::<UnwindRow>()].into(),
            ..UnwindTable::default()
        };
        assert_eq!(
            too_many.rows(),
            Err(InvalidTable::TooManyRows(MAX_TABLE_ROWS + 1))
        );
    }

    #[test]
    fn the_largest_table_fits_a_response_frame() {
        use prost::Message as _;
        let rows: Vec<UnwindRow> = (0..MAX_TABLE_ROWS as u32)
            .map(|pc| row(pc, CfaRule::Rsp, RbpRule::Unchanged))
            .collect();
        let mut table = table(&rows);
        table.source = "x".repeat(super::super::MAX_NAME_BYTES);
        table.segments = vec![
            LoadSegment {
                file_offset: u64::MAX / 2,
                vaddr: u64::MAX / 2,
                file_size: u64::MAX / 2,
            };
            MAX_LOAD_SEGMENTS
        ];
        let response = super::super::Response {
            error: "x".repeat(super::super::MAX_NAME_BYTES),
            build_id: vec![0xff; 64],
            unwind_table: Some(table),
            ..Default::default()
        };
        assert!(response.encoded_len() <= MAX_RESPONSE_BYTES);
    }

    #[test]
    fn segments_are_bounded_and_never_wrap() {
        let segment = LoadSegment {
            file_offset: 0x1000,
            vaddr: 0x40_1000,
            file_size: 0x2000,
        };
        let mut table = UnwindTable {
            segments: vec![segment; 3],
            ..UnwindTable::default()
        };
        assert_eq!(table.check_segments(), Ok(()));
        table.segments[2].vaddr = u64::MAX - 0x10;
        assert_eq!(table.check_segments(), Err(InvalidTable::SegmentWraps(2)));
        table.segments = vec![segment; MAX_LOAD_SEGMENTS + 1];
        assert_eq!(
            table.check_segments(),
            Err(InvalidTable::TooManySegments(MAX_LOAD_SEGMENTS + 1))
        );
    }
}
