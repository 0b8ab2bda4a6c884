//! The table of [`KNOWN`] layouts.
//!
//! Every number below was printed by a small C program (kept outside the
//! repository) that includes `Python.h` and, with `Py_BUILD_CORE` defined,
//! the internal headers (`pycore_runtime.h`, `pycore_interp.h`,
//! `pycore_frame.h`, `pycore_code.h`; `pycore_pystate.h` for 3.8), and prints
//! `offsetof()`/`sizeof()` of each field, compiled (gcc 12, x86_64) against
//! each version's own installed headers: pyenv's 3.8.18, 3.9.18, 3.10.13,
//! 3.11.7, 3.12.1 and 3.13.0, and Debian 12's 3.11.2 (`libpython3.11-dev`),
//! which gave the same numbers as 3.11.7. The program also asserts the
//! widths the sampler relies on: `thread_id` 8 bytes (a `pthread_t`),
//! `f_lasti` and `co_firstlineno` 4 (ints), `is_entry` and `owner` 1.
//! A minor version's entry stands for all its patch releases: CPython keeps
//! these structs' layout within a minor version (out-of-process tools such
//! as py-spy rely on it too), and 3.11.2 and 3.11.7 agree here.

use super::{CodeLayout, Layout, LineTableFormat, StringLayout, Version};
use profiler_common::python::{frame_model, instruction_model};

/// One entry per version, oldest first.
pub const KNOWN: &[Layout] = &[V3_8, V3_9, V3_10, V3_11, V3_12, V3_13];

/// 3.8 (the headers of 3.8.18).
const V3_8: Layout = Layout {
    version: Version { major: 3, minor: 8 },
    frame_model: frame_model::FRAME_OBJECTS,
    instruction_model: instruction_model::LASTI_BYTES,
    runtime_interpreters_head: 32,
    interpreter_threads_head: 8,
    thread_next: 8,
    thread_id: 176,
    thread_frame: 24,
    cframe_current_frame: None,
    frame_previous: 24,
    frame_code: 32,
    frame_instruction: 104,
    frame_entry: None,
    code: CodeLayout {
        argcount: 16,
        flags: 36,
        first_line: 40,
        filename: 104,
        name: 112,
        qualname: None,
        line_table: 120,
        line_table_format: LineTableFormat::Lnotab,
        instructions: None,
    },
    strings: StringLayout {
        length: 16,
        state: 32,
        ascii_data: 48,
        compact_data: 72,
        bytes_size: 16,
        bytes_data: 32,
    },
};

/// 3.9 (the headers of 3.9.18).
const V3_9: Layout = Layout {
    version: Version { major: 3, minor: 9 },
    frame_model: frame_model::FRAME_OBJECTS,
    instruction_model: instruction_model::LASTI_BYTES,
    runtime_interpreters_head: 32,
    interpreter_threads_head: 8,
    thread_next: 8,
    thread_id: 176,
    thread_frame: 24,
    cframe_current_frame: None,
    frame_previous: 24,
    frame_code: 32,
    frame_instruction: 104,
    frame_entry: None,
    code: CodeLayout {
        argcount: 16,
        flags: 36,
        first_line: 40,
        filename: 104,
        name: 112,
        qualname: None,
        line_table: 120,
        line_table_format: LineTableFormat::Lnotab,
        instructions: None,
    },
    strings: StringLayout {
        length: 16,
        state: 32,
        ascii_data: 48,
        compact_data: 72,
        bytes_size: 16,
        bytes_data: 32,
    },
};

/// 3.10 (the headers of 3.10.13).
const V3_10: Layout = Layout {
    version: Version { major: 3, minor: 10 },
    frame_model: frame_model::FRAME_OBJECTS,
    instruction_model: instruction_model::LASTI_UNITS,
    runtime_interpreters_head: 32,
    interpreter_threads_head: 8,
    thread_next: 8,
    thread_id: 176,
    thread_frame: 24,
    cframe_current_frame: None,
    frame_previous: 24,
    frame_code: 32,
    frame_instruction: 96,
    frame_entry: None,
    code: CodeLayout {
        argcount: 16,
        flags: 36,
        first_line: 40,
        filename: 104,
        name: 112,
        qualname: None,
        line_table: 120,
        line_table_format: LineTableFormat::Linetable310,
        instructions: None,
    },
    strings: StringLayout {
        length: 16,
        state: 32,
        ascii_data: 48,
        compact_data: 72,
        bytes_size: 16,
        bytes_data: 32,
    },
};

/// 3.11 (the headers of 3.11.7, and of Debian 12's 3.11.2: the same numbers;
/// a live walk of Debian's 3.11.2 agrees too, ../shared/notes/interpreters.md).
const V3_11: Layout = Layout {
    version: Version { major: 3, minor: 11 },
    frame_model: frame_model::ENTRY_FLAG,
    instruction_model: instruction_model::PREVIOUS_POINTER,
    runtime_interpreters_head: 40,
    interpreter_threads_head: 16,
    thread_next: 8,
    thread_id: 152,
    thread_frame: 56,
    cframe_current_frame: Some(8),
    frame_previous: 48,
    frame_code: 32,
    frame_instruction: 56,
    frame_entry: Some(68),
    code: CodeLayout {
        argcount: 56,
        flags: 48,
        first_line: 72,
        filename: 112,
        name: 120,
        qualname: Some(128),
        line_table: 136,
        line_table_format: LineTableFormat::Locations,
        instructions: Some(184),
    },
    strings: StringLayout {
        length: 16,
        state: 32,
        ascii_data: 48,
        compact_data: 72,
        bytes_size: 16,
        bytes_data: 32,
    },
};

/// 3.12 (the headers of 3.12.1).
const V3_12: Layout = Layout {
    version: Version { major: 3, minor: 12 },
    frame_model: frame_model::C_STACK_OWNER,
    instruction_model: instruction_model::PREVIOUS_POINTER,
    runtime_interpreters_head: 40,
    interpreter_threads_head: 72,
    thread_next: 8,
    thread_id: 136,
    thread_frame: 56,
    cframe_current_frame: Some(0),
    frame_previous: 8,
    frame_code: 0,
    frame_instruction: 56,
    frame_entry: Some(70),
    code: CodeLayout {
        argcount: 52,
        flags: 48,
        first_line: 68,
        filename: 112,
        name: 120,
        qualname: Some(128),
        line_table: 136,
        line_table_format: LineTableFormat::Locations,
        instructions: Some(192),
    },
    strings: StringLayout {
        length: 16,
        state: 32,
        ascii_data: 40,
        compact_data: 56,
        bytes_size: 16,
        bytes_data: 32,
    },
};

/// 3.13 (the headers of 3.13.0). A live 3.13.0 publishes the same offsets in its
/// `_Py_DebugOffsets` (layout.rs's live test); what that struct does not say is
/// taken from here ([`super::from_debug_offsets`]).
pub(super) const V3_13: Layout = Layout {
    version: Version { major: 3, minor: 13 },
    frame_model: frame_model::C_STACK_OWNER,
    instruction_model: instruction_model::CURRENT_POINTER,
    runtime_interpreters_head: 632,
    interpreter_threads_head: 7344,
    thread_next: 8,
    thread_id: 152,
    thread_frame: 72,
    cframe_current_frame: None,
    frame_previous: 8,
    frame_code: 0,
    frame_instruction: 56,
    frame_entry: Some(70),
    code: CodeLayout {
        argcount: 52,
        flags: 48,
        first_line: 68,
        filename: 112,
        name: 120,
        qualname: Some(128),
        line_table: 136,
        line_table_format: LineTableFormat::Locations,
        instructions: Some(200),
    },
    strings: StringLayout {
        length: 16,
        state: 32,
        ascii_data: 40,
        compact_data: 56,
        bytes_size: 16,
        bytes_data: 32,
    },
};
