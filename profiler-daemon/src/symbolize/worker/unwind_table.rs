//! Compiles CFI (`.eh_frame`, `.debug_frame`) into the sorted row table the
//! BPF walker searches: every FDE's rows evaluated by gimli, mapped to the
//! walker's rules (`unwind_rules`), laid out by pc with a `NoInfo` row
//! wherever no FDE covers the code, and consecutive equal rows merged.
//!
//! The CFI comes from files any user controls: every loop is bounded (rows,
//! bytes of CFI evaluated), an FDE gimli cannot evaluate is skipped and
//! counted, and overlapping FDEs are resolved the same way every time.

use std::{collections::HashMap, ops::Range};

use gimli::{
    BaseAddresses, CieOrFde, CommonInformationEntry, EndianSlice, FrameDescriptionEntry, LittleEndian,
    UnwindContext, UnwindSection, X86_64,
};
use profiler_common::UnwindRow;

use super::{
    protocol::MAX_TABLE_ROWS,
    unwind_rules::{Rules, rules_of, unsupported},
};

pub(super) type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// CIEs kept parsed; a file with more parses the others again per FDE.
const MAX_CACHED_CIES: usize = 4096;

/// What one file may cost.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    /// Rows evaluated, before merging.
    pub raw_rows: u64,
    /// FDEs with rows.
    pub fdes: usize,
    /// Rows of the finished table.
    pub table_rows: usize,
    /// Bytes of CFI programs evaluated, counting a CIE's initial
    /// instructions again for each of its FDEs (gimli re-runs them): one huge
    /// CIE shared by every FDE must not cost `CIE size * FDE count`.
    pub evaluated_bytes: u64,
}

impl Limits {
    /// Far above real files (libLLVM-15: 0.98 M rows, 98 k FDEs; the largest
    /// C++ servers ~3 M rows), and within the worker's default memory limit
    /// at worst (16 M rows of 8 bytes, 4 M FDEs of 24: about 0.5 GiB peak
    /// with the finished table and its encoding).
    pub const FILE: Self = Self {
        raw_rows: 16 << 20,
        fdes: 4 << 20,
        table_rows: MAX_TABLE_ROWS,
        evaluated_bytes: 256 << 20,
    };
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(super) enum TableError {
    #[error("code at addresses beyond 4 GiB ({0:#x}): rows hold 32-bit addresses")]
    BeyondFourGiB(u64),
    #[error("more than {0} rows")]
    TooManyRows(u64),
    #[error("more than {0} FDEs")]
    TooManyFdes(usize),
    #[error("more than {0} bytes of CFI to evaluate")]
    TooMuchCfi(u64),
    #[error("no usable FDE covers executable code")]
    NoFdes,
}

/// A compiled table and what it took.
#[derive(Debug)]
pub(super) struct Compiled {
    /// Sorted by pc, strictly increasing, ending with a `NoInfo` row.
    pub rows: Vec<UnwindRow>,
    /// FDEs whose rows are in the table.
    pub fdes: u32,
    /// FDEs gimli could not parse or evaluate, outside every executable
    /// segment, or overlapping an earlier FDE of the same section.
    pub fdes_skipped: u32,
    /// Rows of the sorted table (gap rows included) before equal neighbours merged.
    pub rows_before_merge: u32,
    /// Rows whose CFA or rbp rule the walker cannot follow.
    pub unsupported_rows: u32,
    /// The sections that contributed rows, in priority order.
    pub sources: Vec<&'static str>,
}

/// One FDE's rows (merged within the FDE) in `Compiler::rows`. Indices
/// and counts fit in 32 bits: rows are bounded far below.
#[derive(Clone, Copy, Debug)]
struct Span {
    start: u32,
    end: u32,
    first: u32,
    len: u32,
    raw_rows: u32,
    /// Index of the FDE in its source, and of the source (earlier sources
    /// win overlaps).
    order: u32,
    source: u8,
}

impl Span {
    fn rows(&self) -> Range<usize> {
        self.first as usize..(self.first + self.len) as usize
    }
}

/// Collects the FDEs of one or more sections, earlier sections first.
pub(super) struct Compiler<'c> {
    /// Executable segments' address ranges: FDEs elsewhere describe no code
    /// that can run (e.g. FDEs of discarded functions at address 0).
    code: &'c [Range<u64>],
    limits: Limits,
    rows: Vec<UnwindRow>,
    spans: Vec<Span>,
    sources: Vec<&'static str>,
    skipped: u32,
    raw_rows: u64,
    evaluated_bytes: u64,
}

impl<'c> Compiler<'c> {
    pub fn new(code: &'c [Range<u64>], limits: Limits) -> Self {
        Self {
            code,
            limits,
            rows: Vec::new(),
            spans: Vec::new(),
            sources: Vec::new(),
            skipped: 0,
            raw_rows: 0,
            evaluated_bytes: 0,
        }
    }

    /// Adds every FDE of `section` (named `name` in the report). Where its
    /// FDEs overlap those of a section added earlier, the earlier ones win.
    pub fn add<'a, S>(
        &mut self,
        section: &S,
        bases: &BaseAddresses,
        name: &'static str,
    ) -> Result<(), TableError>
    where
        S: UnwindSection<Slice<'a>>,
    {
        // A file has four CFI sections at most.
        let source = u8::try_from(self.sources.len()).unwrap_or(u8::MAX);
        self.sources.push(name);
        let mut context = UnwindContext::new();
        let mut cies: HashMap<usize, CommonInformationEntry<Slice<'a>>> = HashMap::new();
        let mut entries = section.entries(bases);
        let mut order = 0u32;
        loop {
            let partial = match entries.next() {
                Ok(Some(CieOrFde::Fde(partial))) => partial,
                Ok(Some(CieOrFde::Cie(_))) => continue,
                Ok(None) => break,
                // The entry's length could not be read: nothing after it can be found.
                Err(_) => {
                    self.skipped = self.skipped.saturating_add(1);
                    break;
                }
            };
            let parsed = partial.parse(|section, bases, offset| {
                let key: usize = gimli::UnwindOffset::into(offset);
                if let Some(cie) = cies.get(&key) {
                    return Ok(cie.clone());
                }
                let cie = section.cie_from_offset(bases, offset)?;
                if cies.len() < MAX_CACHED_CIES {
                    cies.insert(key, cie.clone());
                }
                Ok(cie)
            });
            let Ok(fde) = parsed else {
                self.skipped = self.skipped.saturating_add(1);
                continue;
            };
            self.evaluated_bytes += (fde.cie().entry_len() + fde.entry_len()) as u64;
            if self.evaluated_bytes > self.limits.evaluated_bytes {
                return Err(TableError::TooMuchCfi(self.limits.evaluated_bytes));
            }
            self.add_fde(section, bases, &mut context, &fde, source, order)?;
            order = order.saturating_add(1);
        }
        Ok(())
    }

    fn add_fde<'a, S>(
        &mut self,
        section: &S,
        bases: &BaseAddresses,
        context: &mut UnwindContext<usize>,
        fde: &FrameDescriptionEntry<Slice<'a>>,
        source: u8,
        order: u32,
    ) -> Result<(), TableError>
    where
        S: UnwindSection<Slice<'a>>,
    {
        let start = fde.initial_address();
        if fde.len() == 0 {
            return Ok(()); // Describes nothing.
        }
        let Some(end) = start.checked_add(fde.len()) else {
            self.skipped = self.skipped.saturating_add(1);
            return Ok(());
        };
        if !self
            .code
            .iter()
            .any(|code| code.start <= start && end <= code.end)
        {
            self.skipped = self.skipped.saturating_add(1);
            return Ok(());
        }
        // The end needs a row too (NoInfo): it must fit as well.
        let (Ok(start32), Ok(end32)) = (u32::try_from(start), u32::try_from(end)) else {
            return Err(TableError::BeyondFourGiB(end));
        };
        let signal = fde.is_signal_trampoline();
        // Not x86-64's return address column: rows of another ABI.
        let foreign = fde.cie().return_address_register() != X86_64::RA;
        let first = self.rows.len();
        let mut raw_rows = 0;
        let outcome = (|| -> gimli::Result<()> {
            let mut table = fde.rows(section, bases, context)?;
            while let Some(row) = table.next_row()? {
                let (row_start, row_end) = (row.start_address(), row.end_address().min(end));
                if row_start >= row_end {
                    continue; // Empty, or past the FDE's end.
                }
                raw_rows += 1;
                if self.raw_rows + raw_rows > self.limits.raw_rows {
                    return Ok(());
                }
                let rules = if signal {
                    Rules::SIGNAL
                } else if foreign {
                    Rules::UNSUPPORTED
                } else {
                    rules_of(row, section)
                };
                if self.rows.len() > first && self.rows.last().map(Rules::of) == Some(rules) {
                    continue;
                }
                // start <= row_start < row_end <= end, which fits in 32 bits.
                self.rows.push(rules.at(row_start as u32));
            }
            Ok(())
        })();
        if outcome.is_err() || self.rows.len() == first {
            self.rows.truncate(first);
            self.skipped = self.skipped.saturating_add(u32::from(outcome.is_err()));
            return Ok(());
        }
        self.raw_rows += raw_rows;
        if self.raw_rows > self.limits.raw_rows {
            return Err(TableError::TooManyRows(self.limits.raw_rows));
        }
        if self.spans.len() >= self.limits.fdes {
            return Err(TableError::TooManyFdes(self.limits.fdes));
        }
        let narrow =
            |value: usize| u32::try_from(value).map_err(|_| TableError::TooManyRows(self.limits.raw_rows));
        self.spans.push(Span {
            start: start32,
            end: end32,
            first: narrow(first)?,
            len: narrow(self.rows.len() - first)?,
            raw_rows: narrow(raw_rows as usize)?,
            order,
            source,
        });
        Ok(())
    }

    /// Lays the FDEs out by pc and merges equal neighbours.
    pub fn finish(mut self) -> Result<Compiled, TableError> {
        let kept = self.resolve_overlaps();
        if kept.is_empty() {
            return Err(TableError::NoFdes);
        }
        let mut sources: Vec<u8> = kept.iter().map(|span| span.source).collect();
        sources.sort_unstable();
        sources.dedup();
        // Each kept FDE's rows and a NoInfo row at most: no regrowth, whose
        // copies were a large file's peak in the worker.
        let mut rows: Vec<UnwindRow> = Vec::with_capacity(
            kept.iter()
                .map(|span| span.len as usize + 1)
                .sum::<usize>()
                .min(self.limits.table_rows),
        );
        let mut before = 0u64;
        let limit = self.limits.table_rows;
        let mut push = |row: UnwindRow| -> Result<(), TableError> {
            before += 1;
            if rows.last().map(Rules::of) != Some(Rules::of(&row)) {
                if rows.len() >= limit {
                    return Err(TableError::TooManyRows(limit as u64));
                }
                rows.push(row);
            }
            Ok(())
        };
        for (index, span) in kept.iter().enumerate() {
            for row in &self.rows[span.rows()] {
                push(*row)?;
            }
            if kept.get(index + 1).map(|next| next.start) != Some(span.end) {
                push(Rules::NO_INFO.at(span.end))?;
            }
        }
        // `push` counted the rows merged within FDEs once; count them all.
        before += kept
            .iter()
            .map(|span| u64::from(span.raw_rows - span.len))
            .sum::<u64>();
        let unsupported_rows = rows.iter().filter(|row| unsupported(row)).count();
        Ok(Compiled {
            unsupported_rows: saturate(unsupported_rows as u64),
            rows,
            fdes: saturate(kept.len() as u64),
            fdes_skipped: self.skipped,
            rows_before_merge: saturate(before),
            sources: sources
                .into_iter()
                .map(|index| self.sources[usize::from(index)])
                .collect(),
        })
    }

    /// The FDEs that make the table, sorted by start and disjoint: within a
    /// source the one starting first (then the one first in the section)
    /// wins and the others are skipped; across sources the earlier source
    /// wins and the later one's duplicates are dropped without counting.
    fn resolve_overlaps(&mut self) -> Vec<Span> {
        self.spans
            .sort_by_key(|span| (span.source, span.start, span.order));
        // At most every span: no regrowth (a large file has 100,000s).
        let mut kept: Vec<Span> = Vec::with_capacity(self.spans.len());
        let mut level_start = 0;
        while level_start < self.spans.len() {
            let source = self.spans[level_start].source;
            let level_end =
                level_start + self.spans[level_start..].partition_point(|span| span.source == source);
            let earlier = kept.clone();
            let mut reached = 0u32;
            for span in &self.spans[level_start..level_end] {
                if span.start < reached {
                    self.skipped = self.skipped.saturating_add(1);
                    continue;
                }
                reached = span.end;
                // `earlier` is sorted and disjoint, so its ends are sorted too.
                let after = earlier.partition_point(|other| other.end <= span.start);
                if earlier.get(after).is_some_and(|other| other.start < span.end) {
                    continue;
                }
                kept.push(*span);
            }
            kept.sort_by_key(|span| span.start);
            level_start = level_end;
        }
        kept
    }
}

fn saturate(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

#[cfg(test)]
#[path = "unwind_table_tests.rs"]
mod tests;
