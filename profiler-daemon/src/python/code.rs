//! Reading a CPython code object (name, file, line table) out of a process.
//!
//! The process's owner controls every byte read, so every length is
//! capped before it is used, every pointer followed costs one bounded read,
//! and nothing is followed twice (no loops to forge). What is read is
//! copied once and decoded from the copy: bytes changing under the reader
//! give a wrong name at worst.
//!
//! - Type: the object's `ob_type` must be a type named "code" (its
//!   `tp_name`). That costs two reads, so [`read_code_with`] takes the type
//!   already checked in this process and skips them for it. A forged type
//!   named "code" passes: the check catches addresses that no longer hold
//!   code objects, not forgeries (nothing can).
//! - Strings (`str`): only compact ones, as every code object's are
//!   (interned or created whole); the state's kind says 1, 2 or 4 bytes per
//!   character (ASCII, Latin-1, UCS-2, UCS-4), decoded by code point; what
//!   is no Unicode scalar value (lone surrogates, forged values) becomes
//!   U+FFFD. Names longer than [`MAX_NAME`] characters and filenames longer
//!   than [`MAX_FILENAME`] are cut to that many, the last one "…".
//! - Name: `co_qualname` on 3.11+ (`Ledger.settle.<locals>.one_round`);
//!   3.8–3.10 code objects have no qualified name, only `co_name`
//!   (`one_round`).
//! - Line table: read up to [`MAX_TABLE`] bytes, parsed once (see [`lines`]).
//!
//! Offsets of the object header (`ob_type` at 8) and of `PyTypeObject.tp_name`
//! are those of the default (GIL) builds of 3.8–3.13; free-threaded builds
//! are not supported.
//!
//! [`lines`]: crate::python::lines

use std::sync::Arc;

use profiler_common::python::{NO_INSTRUCTION, code_key};
use thiserror::Error;

use crate::python::layout::{Layout, StringLayout};
use crate::python::lines::{LineTable, MAX_TABLE};
use crate::python::memory::{Memory, MemoryError};

/// Characters kept of a function's (qualified) name.
pub const MAX_NAME: usize = 1024;
/// Characters kept of a filename (PATH_MAX is 4096 bytes).
pub const MAX_FILENAME: usize = 4096;

/// `PyObject.ob_type`.
const OBJECT_TYPE: u64 = 8;
/// `PyTypeObject.tp_name`, after the variable-size object header.
const TYPE_NAME: u64 = 0x18;

/// What a sample needs of a code object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeObject {
    /// `co_qualname` (3.11+) or `co_name`.
    pub qualname: Arc<str>,
    pub filename: Arc<str>,
    /// `co_firstlineno`, its bits as the sampler reads them.
    pub first_line: u32,
    pub lines: LineTable,
}

impl CodeObject {
    /// The line of `instruction` (an index in 2-byte code units, as the
    /// sampler stores it): the first line for a frame that has not started
    /// ([`NO_INSTRUCTION`]), 0 for an instruction that has no line.
    pub fn line(&self, instruction: u64) -> u32 {
        if instruction == NO_INSTRUCTION {
            return self.first_line;
        }
        self.lines.line(instruction)
    }

    /// The bits the sampler stored with the frame, to check this is the
    /// code object it saw.
    pub fn key(&self) -> u64 {
        code_key(self.first_line)
    }

    /// Bytes of memory this object holds, roughly (for the cache's bound).
    pub fn weight(&self) -> usize {
        // Each Arc<str> has two counters before the bytes.
        std::mem::size_of::<Self>() + self.qualname.len() + self.filename.len() + 32 + self.lines.weight()
    }
}

#[derive(Debug, Error)]
pub enum CodeError {
    #[error("reading the {what} at {address:#x}: {source}")]
    Read {
        what: &'static str,
        address: u64,
        #[source]
        source: MemoryError,
    },
    #[error("{address:#x} is not a code object: its type {type_address:#x} is not named \"code\"")]
    NotCode { address: u64, type_address: u64 },
    #[error("the {what} at {address:#x} is not a compact str (state {state:#x})")]
    BadString {
        what: &'static str,
        address: u64,
        state: u32,
    },
    #[error("the {what} at {address:#x} has a negative length ({length})")]
    BadLength {
        what: &'static str,
        address: u64,
        length: i64,
    },
    #[error("the layout's code object offsets are out of range")]
    BadLayout,
}

/// Reads the code object at `address`, checking its type by name.
pub fn read_code(memory: &impl Memory, layout: &Layout, address: u64) -> Result<CodeObject, CodeError> {
    read_code_with(memory, layout, address, &mut None)
}

/// As [`read_code`]; `code_type` is the address of the process's code type
/// once one object passed the check by name (set here then), so that the
/// objects after it cost no reads for it.
pub fn read_code_with(
    memory: &impl Memory,
    layout: &Layout,
    address: u64,
    code_type: &mut Option<u64>,
) -> Result<CodeObject, CodeError> {
    let offsets = &layout.code;
    let name_offset = offsets.qualname.unwrap_or(offsets.name);
    // One read for the header and every field used (≤ 0x90 bytes in 3.8–3.13).
    let pointers = [offsets.filename, name_offset, offsets.line_table];
    let size = pointers
        .iter()
        .map(|&offset| usize::from(offset) + 8)
        .chain([usize::from(offsets.first_line) + 4, OBJECT_TYPE as usize + 8])
        .max()
        .unwrap_or(0);
    let mut header = vec![0; size];
    read(memory, "code object", address, &mut header)?;

    let type_address = field_u64(&header, OBJECT_TYPE as usize)?;
    check_type(memory, address, type_address, code_type)?;
    let first_line = field_u32(&header, usize::from(offsets.first_line))?;
    let strings = &layout.strings;
    let name = field_u64(&header, usize::from(name_offset))?;
    let qualname = read_str(memory, strings, "name", name, MAX_NAME)?;
    let filename = field_u64(&header, usize::from(offsets.filename))?;
    let filename = read_str(memory, strings, "filename", filename, MAX_FILENAME)?;
    let table = field_u64(&header, usize::from(offsets.line_table))?;
    let table = read_bytes(memory, strings, "line table", table, MAX_TABLE)?;
    let lines = LineTable::parse(offsets.line_table_format, first_line, &table);
    Ok(CodeObject {
        qualname,
        filename,
        first_line,
        lines,
    })
}

fn read(memory: &impl Memory, what: &'static str, address: u64, buffer: &mut [u8]) -> Result<(), CodeError> {
    memory.read(address, buffer).map_err(|source| CodeError::Read {
        what,
        address,
        source,
    })
}

fn field_u64(bytes: &[u8], at: usize) -> Result<u64, CodeError> {
    let field = bytes.get(at..at + 8).ok_or(CodeError::BadLayout)?;
    let mut value = [0; 8];
    value.copy_from_slice(field);
    Ok(u64::from_ne_bytes(value))
}

fn field_u32(bytes: &[u8], at: usize) -> Result<u32, CodeError> {
    let field = bytes.get(at..at + 4).ok_or(CodeError::BadLayout)?;
    let mut value = [0; 4];
    value.copy_from_slice(field);
    Ok(u32::from_ne_bytes(value))
}

fn check_type(
    memory: &impl Memory,
    address: u64,
    type_address: u64,
    code_type: &mut Option<u64>,
) -> Result<(), CodeError> {
    if *code_type == Some(type_address) {
        return Ok(());
    }
    let name_field = type_address.wrapping_add(TYPE_NAME);
    let name = memory.read_u64(name_field).map_err(|source| CodeError::Read {
        what: "type",
        address: name_field,
        source,
    })?;
    let mut text = [0; 5];
    read(memory, "type name", name, &mut text)?;
    if &text != b"code\0" {
        return Err(CodeError::NotCode {
            address,
            type_address,
        });
    }
    code_type.get_or_insert(type_address);
    Ok(())
}

/// The bytes of a `bytes` object, at most `max` of them.
fn read_bytes(
    memory: &impl Memory,
    layout: &StringLayout,
    what: &'static str,
    address: u64,
    max: usize,
) -> Result<Vec<u8>, CodeError> {
    let mut header = vec![0; usize::from(layout.bytes_size) + 8];
    read(memory, what, address, &mut header)?;
    let length = field_u64(&header, usize::from(layout.bytes_size))? as i64;
    let Ok(length) = usize::try_from(length) else {
        return Err(CodeError::BadLength {
            what,
            address,
            length,
        });
    };
    let mut bytes = vec![0; length.min(max)];
    let data = address.wrapping_add(u64::from(layout.bytes_data));
    read(memory, what, data, &mut bytes)?;
    Ok(bytes)
}

/// A compact `str`, decoded, cut to `max` characters.
fn read_str(
    memory: &impl Memory,
    layout: &StringLayout,
    what: &'static str,
    address: u64,
    max: usize,
) -> Result<Arc<str>, CodeError> {
    let size = (usize::from(layout.length) + 8).max(usize::from(layout.state) + 4);
    let mut header = vec![0; size];
    read(memory, what, address, &mut header)?;
    let length = field_u64(&header, usize::from(layout.length))? as i64;
    let state = field_u32(&header, usize::from(layout.state))?;
    let Ok(length) = usize::try_from(length) else {
        return Err(CodeError::BadLength {
            what,
            address,
            length,
        });
    };
    // PyASCIIObject.state: interned:2, kind:3, compact:1, ascii:1.
    let kind = (state >> 2) & 7;
    let compact = state & (1 << 5) != 0;
    let ascii = state & (1 << 6) != 0;
    let (data, width) = match (compact, ascii, kind) {
        (true, true, 1) => (layout.ascii_data, 1),
        (true, false, 1 | 2 | 4) => (layout.compact_data, kind as usize),
        _ => return Err(CodeError::BadString { what, address, state }),
    };
    let cut = length > max;
    let kept = if cut { max.saturating_sub(1) } else { length };
    // kept ≤ 4096 characters of ≤ 4 bytes: 16 KiB at most.
    let mut bytes = vec![0; kept * width];
    read(memory, what, address.wrapping_add(u64::from(data)), &mut bytes)?;
    let mut text = String::with_capacity(bytes.len() + 3);
    match (ascii, width) {
        (true, _) => text.extend(bytes.iter().map(|&byte| {
            if byte < 0x80 {
                char::from(byte)
            } else {
                char::REPLACEMENT_CHARACTER
            }
        })),
        (false, 1) => text.extend(bytes.iter().map(|&byte| char::from(byte))),
        (false, 2) => text.extend(
            bytes
                .as_chunks::<2>()
                .0
                .iter()
                .map(|&unit| decode(u32::from(u16::from_ne_bytes(unit)))),
        ),
        _ => text.extend(
            bytes
                .as_chunks::<4>()
                .0
                .iter()
                .map(|&unit| decode(u32::from_ne_bytes(unit))),
        ),
    }
    if cut {
        text.push('…');
    }
    Ok(Arc::from(text))
}

/// A code point, or U+FFFD for a surrogate or a value past U+10FFFF.
fn decode(point: u32) -> char {
    char::from_u32(point).unwrap_or(char::REPLACEMENT_CHARACTER)
}

#[cfg(test)]
pub(crate) mod tests;
