//! Finding the CFI row for a pc: the process's mapping, its table, a
//! per-CPU cache of recent rows, then a binary search over the table's
//! chunks of rows.

use aya_ebpf::{
    btf_maps::{self, ArrayOfMaps},
    macros::{btf_map, map},
    maps::{Array, PerCpuArray},
};
use profiler_common::{
    MAX_UNWIND_MAPPINGS, UNWIND_GROUP_CHUNKS, UNWIND_ROWS_PER_CHUNK, UnwindEnd, UnwindProcess, UnwindRow,
    UnwindRowChunk, UnwindTableRange, maps::*,
};

use super::ROWS_READ_ONLY;
use crate::walk::Walk;

/// The rows, a group of chunks per entry: the daemon creates a group's
/// inner map when a table first needs it, so the rows' kernel memory
/// follows what is loaded (see `UNWIND_GROUP_CHUNKS`).
#[btf_map]
static UNWIND_ROWS: ArrayOfMaps<
    btf_maps::Array<UnwindRowChunk, UNWIND_GROUP_CHUNKS>,
    { DEFAULT_UNWIND_ROW_GROUPS as usize },
> = ArrayOfMaps::new();
/// The first pc of each chunk of UNWIND_ROWS, for the first halvings.
#[map]
static UNWIND_CHUNK_PCS: Array<u32> = Array::with_max_entries(DEFAULT_UNWIND_ROW_CHUNKS, 0);
#[map]
static UNWIND_TABLES: Array<UnwindTableRange> = Array::with_max_entries(UNWIND_TABLE_IDS, 0);
#[map]
static ROW_CACHE: PerCpuArray<RowCache> = PerCpuArray::with_max_entries(1, 0);

const ROW_CACHE_BITS: u32 = 10;
const ROW_CACHE_SIZE: usize = 1 << ROW_CACHE_BITS;

/// The row found for a pc of a table, as loaded at `first_row` with `rows`.
#[repr(C)]
#[derive(Clone, Copy)]
struct CachedRow {
    table: u32,
    target: u32,
    first_row: u32,
    rows: u32,
    row: UnwindRow,
}

/// Direct-mapped: a slot per hash of (table, pc).
#[repr(C)]
struct RowCache {
    entries: [CachedRow; ROW_CACHE_SIZE],
}

/// `value`, as the verifier sees a number read from a map value: any
/// number, bounded by the mask the caller applies. A search's bounds then
/// carry no precision the verifier must keep apart, so its states at each
/// halving merge: verifying the searches went from seconds to milliseconds
/// (every halving doubled the states to explore). `slot` is the walk's own
/// (`Walk::opaque`): a program that interrupts this one walks in another
/// scratch, so it cannot change the value between the write and the read.
#[inline(always)]
fn opaque(slot: &mut u64, value: u32) -> u32 {
    let slot: *mut u64 = slot;
    // SAFETY: `slot` comes from a live `&mut`; volatile keeps the compiler
    // from handing `value` over without the round trip through memory.
    unsafe {
        core::ptr::write_volatile(slot, u64::from(value));
        core::ptr::read_volatile(slot) as u32
    }
}

/// The row for `pc`, or why there is none.
#[inline(always)]
pub(super) fn find_row(process: &UnwindProcess, pc: u64, walk: &mut Walk) -> Result<UnwindRow, UnwindEnd> {
    // SAFETY: both pointers come from references, live for the call, and
    // `walk` is borrowed exclusively.
    match unsafe { profilerd_find_row(process, pc, walk) } {
        FOUND => Ok(walk.row),
        end if end == UnwindEnd::NoMapping as u32 => Err(UnwindEnd::NoMapping),
        end if end == UnwindEnd::NoFramePointer as u32 => Err(UnwindEnd::NoFramePointer),
        end if end == UnwindEnd::UnsupportedRule as u32 => Err(UnwindEnd::UnsupportedRule),
        end if end == UnwindEnd::ReadFault as u32 => Err(UnwindEnd::ReadFault),
        end if end == UnwindEnd::DepthLimit as u32 => Err(UnwindEnd::DepthLimit),
        _ => Err(UnwindEnd::TableNotLoaded),
    }
}

/// What [`profilerd_find_row`] returns when it put the row in `walk.row`
/// (`UnwindEnd::Complete`, which a search never ends with).
const FOUND: u32 = UnwindEnd::Complete as u32;

/// [`search`] as a global BPF function: the verifier checks a global
/// function once per program, on its own, where it checked the inlined
/// search at both frames of the walk's step for every state the step was
/// entered with. It keeps external linkage (`no_mangle`; the sampler's
/// tests check its symbol), else it would be a static function again.
/// Returns `FOUND` or the `UnwindEnd` it ends with, as u32.
///
/// # Safety
/// Each pointer is null or valid for the call (`process` for reads, `walk`
/// for reads and writes, and not aliased meanwhile). To the verifier they
/// are memory of their type's size that may be null: the null checks are
/// what it requires.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn profilerd_find_row(process: *const UnwindProcess, pc: u64, walk: *mut Walk) -> u32 {
    // SAFETY: null or valid, the caller's contract.
    let (Some(process), Some(walk)) = (unsafe { process.as_ref() }, unsafe { walk.as_mut() }) else {
        return UnwindEnd::TableNotLoaded as u32;
    };
    match search(process, pc, walk) {
        Ok(row) => {
            walk.row = row;
            FOUND
        }
        Err(end) => end as u32,
    }
}

/// The row for `pc`, or why there is none.
#[inline(always)]
fn search(process: &UnwindProcess, pc: u64, walk: &mut Walk) -> Result<UnwindRow, UnwindEnd> {
    let count = process.count as usize;
    let (mut lo, mut hi) = (0usize, count.min(MAX_UNWIND_MAPPINGS));
    let mut found = MAX_UNWIND_MAPPINGS;
    // Callers are mostly in the same file as their callee: try its mapping first.
    let last = walk.mapping_hint as usize & (MAX_UNWIND_MAPPINGS - 1);
    let cached = &process.mappings[last];
    if last < hi && cached.start <= pc && pc < cached.end {
        found = last;
        hi = 0;
    }
    // log2(MAX_UNWIND_MAPPINGS) + 1 halvings find any mapping.
    for _ in 0..9 {
        if lo >= hi {
            break;
        }
        let mid = opaque(&mut walk.opaque, ((lo + hi) / 2) as u32) as usize;
        let mapping = &process.mappings[mid & (MAX_UNWIND_MAPPINGS - 1)];
        if pc < mapping.start {
            hi = mid;
        } else if pc >= mapping.end {
            lo = mid + 1;
        } else {
            found = mid;
            break;
        }
    }
    let Some(mapping) = process.mappings.get(found) else {
        return Err(UnwindEnd::NoMapping);
    };
    walk.mapping_hint = found as u64;
    if mapping.table == 0 {
        return Err(UnwindEnd::NoFramePointer);
    }
    let Some(range) = UNWIND_TABLES.get(mapping.table) else {
        return Err(UnwindEnd::TableNotLoaded);
    };
    let (first, rows) = (range.first_row, range.rows);
    if rows == 0 {
        return Err(UnwindEnd::TableNotLoaded);
    }
    let target = pc.wrapping_sub(mapping.bias);
    if target > u64::from(u32::MAX) {
        return Err(UnwindEnd::NoFramePointer);
    }
    let target = target as u32;
    // The same return addresses come back sample after sample: a per-CPU
    // cache of their rows saves both searches. An entry is only good for
    // the table as loaded now (its place and size), so an evicted and
    // reloaded table, or an id given to another file, never hits stale rows.
    let Some(cache) = ROW_CACHE.get_ptr_mut(0) else {
        return find_in_table(&mut walk.opaque, first, rows, target);
    };
    let slot =
        (target ^ mapping.table.wrapping_mul(0x9e37_79b9)).wrapping_mul(0x85eb_ca6b) >> (32 - ROW_CACHE_BITS);
    // SAFETY: this CPU's cache. The sampler and the off-CPU program do not
    // interrupt each other on a CPU; the allocation probes, which either can
    // interrupt, only read it (ROWS_READ_ONLY), so no write is ever torn,
    // and a probe's read torn by an interruption costs it that one frame's row.
    let entry = unsafe { &mut (*cache).entries[slot as usize & (ROW_CACHE_SIZE - 1)] };
    if entry.target == target
        && entry.table == mapping.table
        && entry.first_row == first
        && entry.rows == rows
    {
        return Ok(entry.row);
    }
    let row = find_in_table(&mut walk.opaque, first, rows, target)?;
    if walk.flags & ROWS_READ_ONLY != 0 {
        return Ok(row);
    }
    *entry = CachedRow {
        table: mapping.table,
        target,
        first_row: first,
        rows,
        row,
    };
    Ok(row)
}

/// The last row of `first..first + rows` whose pc is at most `target`.
/// Halves across the chunks' first pcs first (a dense array: a few cache
/// lines, one page), then within the one chunk left (one 4 KiB page): a cold
/// walk touches two pages per frame, not one per probe.
#[inline(always)]
fn find_in_table(opaque_slot: &mut u64, first: u32, rows: u32, target: u32) -> Result<UnwindRow, UnwindEnd> {
    const PER_CHUNK: u32 = UNWIND_ROWS_PER_CHUNK as u32;
    let end = first.saturating_add(rows);
    let (mut lo, mut hi) = (first / PER_CHUNK, (end - 1) / PER_CHUNK + 1);
    if chunk_pc(lo)? > target {
        // Before the table's first row: no FDE covers it.
        return Err(UnwindEnd::NoFramePointer);
    }
    // Invariant: chunk `lo` starts at or before `target`, every chunk from
    // `hi` on after it. 15 halvings cover the largest table (2^24 rows).
    for _ in 0..15 {
        if hi - lo <= 1 {
            break;
        }
        let mid = opaque(opaque_slot, lo + (hi - lo) / 2);
        if chunk_pc(mid)? <= target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    const GROUP: u32 = UNWIND_GROUP_CHUNKS as u32;
    let chunk = UNWIND_ROWS
        .get_value(lo / GROUP, &(lo % GROUP))
        .ok_or(UnwindEnd::TableNotLoaded)?;
    let base = lo * PER_CHUNK;
    let (mut lo, mut hi) = (0, end.saturating_sub(base).min(PER_CHUNK));
    // log2(rows per chunk) halvings finish the search.
    for _ in 0..9 {
        if hi - lo <= 1 {
            break;
        }
        let mid = opaque(opaque_slot, lo + (hi - lo) / 2);
        if chunk.rows[mid as usize & (UNWIND_ROWS_PER_CHUNK - 1)].pc <= target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(chunk.rows[lo as usize & (UNWIND_ROWS_PER_CHUNK - 1)])
}

#[inline(always)]
fn chunk_pc(chunk: u32) -> Result<u32, UnwindEnd> {
    UNWIND_CHUNK_PCS
        .get(chunk)
        .copied()
        .ok_or(UnwindEnd::TableNotLoaded)
}
