//! `_Py_DebugOffsets`: what a CPython 3.13+ process says of its own layout.
//!
//! The struct starts `_PyRuntime` (and ELF section `.PyRuntime`): the cookie
//! "xdebugpy", `version` (`PY_VERSION_HEX`), `free_threaded`, then tables of
//! u64s, each led by the `sizeof()` of the struct it describes, then its
//! fields' `offsetof()`s. Versions add tables and fields, in the middle too
//! (3.14 added `threads_main` after `threads_head`), so a version's layout
//! is known only from its header:
//! - 3.13 from `Include/internal/pycore_runtime.h` of 3.13.0: the positions
//!   below match that header's `offsetof(_Py_DebugOffsets, ...)` (tests), and
//!   a live 3.13.0 is read right (layout.rs's live test).
//! - 3.14 from `Include/internal/pycore_debug_offsets.h` of 3.14.7 (the
//!   Go module proxy's copy of github.com/python/cpython), field for
//!   field; a 3.14.7 built from that source is walked and named right
//!   (tests/python.rs and tests/python_depth.rs run it where pyenv has it).
//!
//! Other versions are refused.
//!
//! The owner of the process writes these bytes: every offset is checked
//! (below [`MAX_OFFSET`], and inside the struct its table says it is in).

use super::{CodeLayout, Layout, LineTableFormat, StringLayout, Version, known};
use profiler_common::python::{frame_model, instruction_model};

/// Why a process's `_Py_DebugOffsets` gave no [`Layout`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DebugOffsetsError {
    #[error("_Py_DebugOffsets cut short: {have} bytes, {need} needed")]
    Truncated { have: usize, need: usize },
    #[error("_PyRuntime does not start with the _Py_DebugOffsets cookie \"xdebugpy\"")]
    BadCookie,
    #[error("_Py_DebugOffsets of version {0:#010x}: no known layout (3.13 and 3.14 are known)")]
    UnsupportedVersion(u64),
    #[error("CPython {0} is a free-threaded build: not supported")]
    FreeThreaded(Version),
    #[error(
        "_Py_DebugOffsets of CPython {version}: {table}.{field} = {value} (struct size {size}) is no plausible offset"
    )]
    Absurd {
        version: Version,
        table: &'static str,
        field: &'static str,
        value: u64,
        size: u64,
    },
}

/// The largest offset believed. The largest real one is 3.13's
/// `PyInterpreterState.threads.head`, 7344 (the interpreter embeds large
/// state before it), so 4 KiB would be too little; 16 KiB leaves room and
/// keeps every offset far from `u16::MAX`, the sampler's "none".
pub const MAX_OFFSET: u64 = 16 * 1024;

/// `cookie[8]`, `version`, `free_threaded`.
const HEADER: usize = 24;
const COOKIE: &[u8; 8] = b"xdebugpy";

/// A version's tables, in the header's order: (table, its u64 fields).
type Tables = &'static [(&'static str, &'static [&'static str])];

#[rustfmt::skip]
const TABLES_3_13: Tables = &[
    ("runtime_state", &["size", "finalizing", "interpreters_head"]),
    ("interpreter_state", &["size", "id", "next", "threads_head", "gc", "imports_modules", "sysdict",
        "builtins", "ceval_gil", "gil_runtime_state", "gil_runtime_state_enabled",
        "gil_runtime_state_locked", "gil_runtime_state_holder"]),
    ("thread_state", &["size", "prev", "next", "interp", "current_frame", "thread_id",
        "native_thread_id", "datastack_chunk", "status"]),
    ("interpreter_frame", &["size", "previous", "executable", "instr_ptr", "localsplus", "owner"]),
    ("code_object", &["size", "filename", "name", "qualname", "linetable", "firstlineno", "argcount",
        "localsplusnames", "localspluskinds", "co_code_adaptive"]),
    ("pyobject", &["size", "ob_type"]),
    ("type_object", &["size", "tp_name", "tp_repr", "tp_flags"]),
    ("tuple_object", &["size", "ob_item", "ob_size"]),
    ("list_object", &["size", "ob_item", "ob_size"]),
    ("dict_object", &["size", "ma_keys", "ma_values"]),
    ("float_object", &["size", "ob_fval"]),
    ("long_object", &["size", "lv_tag", "ob_digit"]),
    ("bytes_object", &["size", "ob_size", "ob_sval"]),
    ("unicode_object", &["size", "state", "length", "asciiobject_size"]),
    ("gc", &["size", "collecting"]),
];

#[rustfmt::skip]
const TABLES_3_14: Tables = &[
    ("runtime_state", &["size", "finalizing", "interpreters_head"]),
    ("interpreter_state", &["size", "id", "next", "threads_head", "threads_main", "gc",
        "imports_modules", "sysdict", "builtins", "ceval_gil", "gil_runtime_state",
        "gil_runtime_state_enabled", "gil_runtime_state_locked", "gil_runtime_state_holder",
        "code_object_generation", "tlbc_generation"]),
    ("thread_state", &["size", "prev", "next", "interp", "current_frame", "thread_id",
        "native_thread_id", "datastack_chunk", "status"]),
    ("interpreter_frame", &["size", "previous", "executable", "instr_ptr", "localsplus", "owner",
        "stackpointer", "tlbc_index"]),
    ("code_object", &["size", "filename", "name", "qualname", "linetable", "firstlineno", "argcount",
        "localsplusnames", "localspluskinds", "co_code_adaptive", "co_tlbc"]),
    ("pyobject", &["size", "ob_type"]),
    ("type_object", &["size", "tp_name", "tp_repr", "tp_flags"]),
    ("tuple_object", &["size", "ob_item", "ob_size"]),
    ("list_object", &["size", "ob_item", "ob_size"]),
    ("set_object", &["size", "used", "table", "mask"]),
    ("dict_object", &["size", "ma_keys", "ma_values"]),
    ("float_object", &["size", "ob_fval"]),
    ("long_object", &["size", "lv_tag", "ob_digit"]),
    ("bytes_object", &["size", "ob_size", "ob_sval"]),
    ("unicode_object", &["size", "state", "length", "asciiobject_size"]),
    ("gc", &["size", "collecting"]),
    ("gen_object", &["size", "gi_name", "gi_iframe", "gi_frame_state"]),
    ("llist_node", &["next", "prev"]),
    ("debugger_support", &["eval_breaker", "remote_debugger_support", "remote_debugging_enabled",
        "debugger_pending_call", "debugger_script_path", "debugger_script_path_size"]),
];

/// Bytes to read at `_PyRuntime` for any version parsed here.
pub const MAX_LEN: usize = max(struct_len(TABLES_3_13), struct_len(TABLES_3_14));

/// Where one field is in the struct, and where its table's `size` is.
#[derive(Clone, Copy, Debug)]
struct Field {
    table: &'static str,
    name: &'static str,
    at: usize,
    size_at: usize,
}

/// The fields read, found by name at compile time (a name missing from a
/// version's tables fails the build).
#[derive(Clone, Copy, Debug)]
struct Fields {
    len: usize,
    interpreters_head: Field,
    threads_head: Field,
    thread_next: Field,
    thread_current_frame: Field,
    thread_id: Field,
    frame_previous: Field,
    frame_executable: Field,
    frame_instr_ptr: Field,
    frame_owner: Field,
    code_filename: Field,
    code_name: Field,
    code_qualname: Field,
    code_linetable: Field,
    code_firstlineno: Field,
    code_argcount: Field,
    code_co_code_adaptive: Field,
    bytes_ob_size: Field,
    bytes_ob_sval: Field,
    unicode_state: Field,
    unicode_length: Field,
    unicode_asciiobject_size: Field,
}

const FIELDS_3_13: Fields = fields(TABLES_3_13);
const FIELDS_3_14: Fields = fields(TABLES_3_14);

const fn fields(tables: Tables) -> Fields {
    Fields {
        len: struct_len(tables),
        interpreters_head: field(tables, "runtime_state", "interpreters_head"),
        threads_head: field(tables, "interpreter_state", "threads_head"),
        thread_next: field(tables, "thread_state", "next"),
        thread_current_frame: field(tables, "thread_state", "current_frame"),
        thread_id: field(tables, "thread_state", "thread_id"),
        frame_previous: field(tables, "interpreter_frame", "previous"),
        frame_executable: field(tables, "interpreter_frame", "executable"),
        frame_instr_ptr: field(tables, "interpreter_frame", "instr_ptr"),
        frame_owner: field(tables, "interpreter_frame", "owner"),
        code_filename: field(tables, "code_object", "filename"),
        code_name: field(tables, "code_object", "name"),
        code_qualname: field(tables, "code_object", "qualname"),
        code_linetable: field(tables, "code_object", "linetable"),
        code_firstlineno: field(tables, "code_object", "firstlineno"),
        code_argcount: field(tables, "code_object", "argcount"),
        code_co_code_adaptive: field(tables, "code_object", "co_code_adaptive"),
        bytes_ob_size: field(tables, "bytes_object", "ob_size"),
        bytes_ob_sval: field(tables, "bytes_object", "ob_sval"),
        unicode_state: field(tables, "unicode_object", "state"),
        unicode_length: field(tables, "unicode_object", "length"),
        unicode_asciiobject_size: field(tables, "unicode_object", "asciiobject_size"),
    }
}

const fn struct_len(tables: Tables) -> usize {
    let mut len = HEADER;
    let mut i = 0;
    while i < tables.len() {
        len += 8 * tables[i].1.len();
        i += 1;
    }
    len
}

const fn field(tables: Tables, table: &'static str, name: &'static str) -> Field {
    let mut at = HEADER;
    let mut i = 0;
    while i < tables.len() {
        let (t, names) = tables[i];
        if same(t, table) {
            let mut j = 0;
            while j < names.len() {
                if same(names[j], name) {
                    // Every table that holds a field read here leads with its size.
                    assert!(same(names[0], "size"));
                    return Field {
                        table,
                        name,
                        at: at + 8 * j,
                        size_at: at,
                    };
                }
                j += 1;
            }
        }
        at += 8 * names.len();
        i += 1;
    }
    panic!("a field read is missing from a version's tables")
}

const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

const fn max(a: usize, b: usize) -> usize {
    if a > b { a } else { b }
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    let word = bytes.get(at..at.checked_add(8)?)?;
    Some(u64::from_ne_bytes(word.try_into().ok()?))
}

/// The layout a CPython 3.13+ process describes in the `_Py_DebugOffsets`
/// at the start of its `_PyRuntime` (`bytes`: at least the struct, up to
/// [`MAX_LEN`]). What the struct does not say (`co_flags`, the data of a
/// non-ASCII str) is taken from the 3.13 table entry.
pub fn from_debug_offsets(bytes: &[u8]) -> Result<Layout, DebugOffsetsError> {
    if bytes.len() < HEADER {
        return Err(DebugOffsetsError::Truncated {
            have: bytes.len(),
            need: HEADER,
        });
    }
    if !bytes.starts_with(COOKIE) {
        return Err(DebugOffsetsError::BadCookie);
    }
    let hex = u64_at(bytes, 8).unwrap_or_default();
    let version = Version {
        major: (hex >> 24) as u8,
        minor: (hex >> 16) as u8,
    };
    let fields = match (hex >> 32, version.major, version.minor) {
        (0, 3, 13) => FIELDS_3_13,
        (0, 3, 14) => FIELDS_3_14,
        _ => return Err(DebugOffsetsError::UnsupportedVersion(hex)),
    };
    // A free-threaded build has a larger object header (so other string
    // and code offsets) and runs thread-local copies of the bytecode, which
    // `instr_ptr` points into: nothing here would read it right.
    if u64_at(bytes, 16) != Some(0) {
        return Err(DebugOffsetsError::FreeThreaded(version));
    }
    if bytes.len() < fields.len {
        return Err(DebugOffsetsError::Truncated {
            have: bytes.len(),
            need: fields.len,
        });
    }
    // An offset of a field `width` bytes wide: below MAX_OFFSET, and the
    // field inside the struct its table gives the size of.
    let offset = |field: Field, width: u64| -> Result<u16, DebugOffsetsError> {
        // Both in range: bytes.len() >= fields.len, checked above.
        let value = u64_at(bytes, field.at).unwrap_or(u64::MAX);
        let size = u64_at(bytes, field.size_at).unwrap_or(0);
        let inside = value.checked_add(width).is_some_and(|end| end <= size);
        match u16::try_from(value) {
            Ok(offset) if value < MAX_OFFSET && inside => Ok(offset),
            _ => Err(DebugOffsetsError::Absurd {
                version,
                table: field.table,
                field: field.name,
                value,
                size,
            }),
        }
    };
    let base = known::V3_13;
    let ascii_data = offset(fields.unicode_asciiobject_size, 0)?;
    Ok(Layout {
        version,
        frame_model: frame_model::C_STACK_OWNER,
        instruction_model: instruction_model::CURRENT_POINTER,
        runtime_interpreters_head: offset(fields.interpreters_head, 8)?,
        interpreter_threads_head: offset(fields.threads_head, 8)?,
        thread_next: offset(fields.thread_next, 8)?,
        thread_id: offset(fields.thread_id, 8)?,
        thread_frame: offset(fields.thread_current_frame, 8)?,
        cframe_current_frame: None,
        frame_previous: offset(fields.frame_previous, 8)?,
        frame_code: offset(fields.frame_executable, 8)?,
        frame_instruction: offset(fields.frame_instr_ptr, 8)?,
        frame_entry: Some(offset(fields.frame_owner, 1)?),
        code: CodeLayout {
            argcount: offset(fields.code_argcount, 4)?,
            // Not published: 3.13's (48 in 3.11 to 3.13, after the object
            // header and three pointers), assumed unchanged in 3.14.
            flags: base.code.flags,
            first_line: offset(fields.code_firstlineno, 4)?,
            filename: offset(fields.code_filename, 8)?,
            name: offset(fields.code_name, 8)?,
            qualname: Some(offset(fields.code_qualname, 8)?),
            line_table: offset(fields.code_linetable, 8)?,
            line_table_format: LineTableFormat::Locations,
            instructions: Some(offset(fields.code_co_code_adaptive, 1)?),
        },
        strings: StringLayout {
            length: offset(fields.unicode_length, 8)?,
            state: offset(fields.unicode_state, 4)?,
            ascii_data,
            // PyCompactUnicodeObject is PyASCIIObject and two more words
            // (utf8_length, utf8) since 3.12: the same gap as in 3.13.
            compact_data: ascii_data + (base.strings.compact_data - base.strings.ascii_data),
            bytes_size: offset(fields.bytes_ob_size, 8)?,
            bytes_data: offset(fields.bytes_ob_sval, 1)?,
        },
    })
}

#[cfg(test)]
mod tests;
