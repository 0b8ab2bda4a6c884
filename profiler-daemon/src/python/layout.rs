//! Where each CPython version keeps what the walk and the reader need.
//!
//! 3.8–3.12: a table, every offset checked with `offsetof()` against that
//! version's own headers (internal ones included) and, for 3.11, against a
//! live walk of Debian's `/usr/bin/python3.11` (../shared/notes/interpreters.md).
//! 3.13+: the process says itself, in the `_Py_DebugOffsets` that starts
//! `_PyRuntime` (cookie "xdebugpy"); [`Layout::from_debug_offsets`] reads it.

use profiler_common::python::{PythonProcess, frame_model, instruction_model};

/// A CPython version, major and minor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Version {
    pub major: u8,
    pub minor: u8,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// How a code object maps instruction offsets to lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineTableFormat {
    /// 3.8, 3.9: `co_lnotab`, (byte offset delta, line delta) pairs.
    Lnotab,
    /// 3.10: `co_linetable`, PEP 626 (byte offset delta, line delta) pairs.
    Linetable310,
    /// 3.11+: `co_linetable`, the location table (Objects/locations.md).
    Locations,
}

/// Offsets (bytes) into a code object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeLayout {
    pub argcount: u16,
    pub flags: u16,
    pub first_line: u16,
    /// `co_filename` (a str).
    pub filename: u16,
    /// `co_name` (a str).
    pub name: u16,
    /// `co_qualname` (a str, 3.11+).
    pub qualname: Option<u16>,
    /// `co_linetable` or `co_lnotab` (a bytes object).
    pub line_table: u16,
    pub line_table_format: LineTableFormat,
    /// Where the bytecode starts inside the code object (3.11+:
    /// `co_code_adaptive`); None before 3.11 (bytecode in `co_code`).
    pub instructions: Option<u16>,
}

/// Offsets (bytes) into str (PyASCIIObject / PyCompactUnicodeObject) and bytes objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StringLayout {
    /// `PyASCIIObject.length` (characters).
    pub length: u16,
    /// `PyASCIIObject.state` (a u32 of bit fields: interned:2, kind:3, compact:1, ascii:1, ...).
    pub state: u16,
    /// Data of a compact ASCII string.
    pub ascii_data: u16,
    /// Data of a compact non-ASCII string (`kind` bytes per character).
    pub compact_data: u16,
    /// `PyBytesObject.ob_size` / `.ob_sval`.
    pub bytes_size: u16,
    pub bytes_data: u16,
}

/// Everything the walk and the reader need of one version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub version: Version,
    /// One of [`frame_model`].
    pub frame_model: u8,
    /// One of [`instruction_model`].
    pub instruction_model: u8,
    pub runtime_interpreters_head: u16,
    pub interpreter_threads_head: u16,
    pub thread_next: u16,
    pub thread_id: u16,
    pub thread_frame: u16,
    pub cframe_current_frame: Option<u16>,
    pub frame_previous: u16,
    pub frame_code: u16,
    pub frame_instruction: u16,
    /// `is_entry` (3.11) or `owner` (3.12+).
    pub frame_entry: Option<u16>,
    pub code: CodeLayout,
    pub strings: StringLayout,
}

impl Layout {
    /// The sampler's entry for a process with `_PyRuntime` at `runtime`
    /// and the eval loop at [eval_start, eval_end) (runtime addresses).
    pub fn to_bpf(&self, runtime: u64, eval_start: u64, eval_end: u64) -> PythonProcess {
        PythonProcess {
            runtime,
            eval_start,
            eval_end,
            version: (u16::from(self.version.major) << 8) | u16::from(self.version.minor),
            frame_model: self.frame_model,
            instruction_model: self.instruction_model,
            runtime_interpreters_head: self.runtime_interpreters_head,
            interpreter_threads_head: self.interpreter_threads_head,
            thread_next: self.thread_next,
            thread_id: self.thread_id,
            thread_frame: self.thread_frame,
            cframe_current_frame: self.cframe_current_frame.unwrap_or(u16::MAX),
            frame_previous: self.frame_previous,
            frame_code: self.frame_code,
            frame_instruction: self.frame_instruction,
            frame_entry: self.frame_entry.unwrap_or(u16::MAX),
            code_first_line: self.code.first_line,
            code_instructions: self.code.instructions.unwrap_or(0),
            reserved: [0; 2],
        }
    }
}

// TODO(helper): KNOWN table for 3.8–3.12 (and 3.13 as a fallback),
// `for_version`, `from_debug_offsets`.
#[allow(unused_imports)]
use {frame_model as _, instruction_model as _};
