//! Where each CPython version keeps what the walk and the reader need.
//!
//! - 3.8–3.13: a table ([`KNOWN`], [`for_version`]), every offset printed by
//!   `offsetof()`/`sizeof()` in a C program built against that version's own
//!   headers, internal ones included (pyenv's 3.8.18, 3.9.18, 3.10.13, 3.11.7,
//!   3.12.1, 3.13.0 and Debian 12's 3.11.2; details in `layout/known.rs`).
//!   3.11 also matches a live walk of Debian's `/usr/bin/python3.11`
//!   (../shared/notes/interpreters.md).
//! - 3.13+: the process says itself, in the `_Py_DebugOffsets` that starts
//!   `_PyRuntime` (cookie "xdebugpy"); [`from_debug_offsets`] reads it (3.13,
//!   3.14) and refuses what it cannot trust. The test `live_3_13_says_its_layout`
//!   reads it out of a running pyenv 3.13.0 and finds the table's entry.

mod debug_offsets;
mod known;

pub use debug_offsets::{DebugOffsetsError, MAX_LEN as DEBUG_OFFSETS_LEN, MAX_OFFSET, from_debug_offsets};
pub use known::KNOWN;

use profiler_common::python::PythonProcess;

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
    /// One of [`frame_model`](profiler_common::python::frame_model).
    pub frame_model: u8,
    /// One of [`instruction_model`](profiler_common::python::instruction_model).
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
            // 3.14's `_PyStackRef` (Include/internal/pycore_stackref.h,
            // Py_TAG_BITS of the GIL build).
            frame_code_tag: u16::from(self.version >= (Version { major: 3, minor: 14 })),
            reserved: 0,
        }
    }
}

/// The table's layout of a version (3.8–3.13); for 3.13+ prefer what the
/// process says ([`from_debug_offsets`]).
pub fn for_version(version: Version) -> Option<Layout> {
    KNOWN.iter().find(|layout| layout.version == version).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::python::{frame_model, instruction_model};
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::FileExt;
    use std::process::{Command, Stdio};

    fn v(minor: u8) -> Version {
        Version { major: 3, minor }
    }

    #[test]
    fn every_version_once_in_order() {
        let versions: Vec<Version> = KNOWN.iter().map(|layout| layout.version).collect();
        assert_eq!(versions, (8..=13).map(v).collect::<Vec<_>>());
        for minor in 8..=13 {
            assert_eq!(for_version(v(minor)).map(|layout| layout.version), Some(v(minor)));
        }
        for version in [v(7), v(14), Version { major: 2, minor: 7 }] {
            assert_eq!(for_version(version), None);
        }
    }

    #[test]
    fn models_follow_the_version() {
        use LineTableFormat::{Linetable310, Lnotab, Locations};
        use frame_model::{C_STACK_OWNER, ENTRY_FLAG, FRAME_OBJECTS};
        use instruction_model::{CURRENT_POINTER, LASTI_BYTES, LASTI_UNITS, PREVIOUS_POINTER};
        for layout in KNOWN {
            let minor = layout.version.minor;
            let (frames, instructions, format) = match minor {
                8 | 9 => (FRAME_OBJECTS, LASTI_BYTES, Lnotab),
                10 => (FRAME_OBJECTS, LASTI_UNITS, Linetable310),
                11 => (ENTRY_FLAG, PREVIOUS_POINTER, Locations),
                12 => (C_STACK_OWNER, PREVIOUS_POINTER, Locations),
                _ => (C_STACK_OWNER, CURRENT_POINTER, Locations),
            };
            assert_eq!(
                (layout.frame_model, layout.instruction_model),
                (frames, instructions),
                "{minor}"
            );
            assert_eq!(layout.code.line_table_format, format, "{minor}");
            // 3.11+ frames mark the eval loop's entry and run the code
            // object's own copy of the bytecode; only 3.11 and 3.12 reach
            // the frame through a _PyCFrame.
            assert_eq!(layout.frame_entry.is_some(), minor >= 11, "{minor}");
            assert_eq!(layout.code.instructions.is_some(), minor >= 11, "{minor}");
            assert_eq!(layout.code.qualname.is_some(), minor >= 11, "{minor}");
            assert_eq!(
                layout.cframe_current_frame.is_some(),
                minor == 11 || minor == 12,
                "{minor}"
            );
        }
    }

    #[test]
    fn offsets_are_plausible() {
        for layout in KNOWN {
            let (code, strings) = (layout.code, layout.strings);
            let pointers = [
                layout.interpreter_threads_head,
                layout.runtime_interpreters_head,
                layout.thread_next,
                layout.thread_id,
                layout.thread_frame,
                layout.cframe_current_frame.unwrap_or_default(),
                layout.frame_previous,
                layout.frame_code,
                code.filename,
                code.name,
                code.qualname.unwrap_or(code.name),
                code.line_table,
                strings.length,
                strings.bytes_size,
            ];
            let ints = [code.argcount, code.flags, code.first_line, strings.state];
            for offset in pointers.into_iter().chain(ints).chain(layout.frame_entry) {
                assert!(u64::from(offset) < MAX_OFFSET, "{}: {offset}", layout.version);
            }
            assert!(
                pointers.iter().all(|offset| offset.is_multiple_of(8)),
                "{}: {pointers:?}",
                layout.version
            );
            assert!(
                ints.iter().all(|offset| offset.is_multiple_of(4)),
                "{}: {ints:?}",
                layout.version
            );
            // The frame's instruction field: an int before 3.11, a pointer after.
            let instruction_alignment = if layout.version.minor < 11 { 4 } else { 8 };
            assert_eq!(
                layout.frame_instruction % instruction_alignment,
                0,
                "{}",
                layout.version
            );
            // Past the object header (refcount, type, size) in objects.
            for offset in [
                code.argcount,
                code.flags,
                code.first_line,
                code.filename,
                code.name,
                code.line_table,
            ] {
                assert!(offset >= 16, "{}: {offset}", layout.version);
            }
            let names = [
                code.filename,
                code.name,
                code.qualname.unwrap_or(0),
                code.line_table,
            ];
            assert!(
                names
                    .iter()
                    .enumerate()
                    .all(|(i, a)| names[i + 1..].iter().all(|b| a != b))
            );
            assert!(code.instructions.is_none_or(|start| start > code.line_table));
            assert_eq!(
                strings.compact_data - strings.ascii_data,
                if layout.version.minor < 12 { 24 } else { 16 }
            );
            assert!(strings.state > strings.length && strings.ascii_data > strings.state);
            assert_eq!((strings.bytes_size, strings.bytes_data), (16, 32));
        }
    }

    #[test]
    fn to_bpf_marks_what_a_version_lacks() {
        let bpf = for_version(v(10)).map(|layout| layout.to_bpf(0x1000, 0x2000, 0x3000));
        let bpf = bpf.expect("3.10 is in the table");
        assert_eq!(
            (bpf.runtime, bpf.eval_start, bpf.eval_end, bpf.version),
            (0x1000, 0x2000, 0x3000, 0x030a)
        );
        assert_eq!(
            (bpf.cframe_current_frame, bpf.frame_entry, bpf.code_instructions),
            (u16::MAX, u16::MAX, 0)
        );
        let bpf = for_version(v(11))
            .map(|layout| layout.to_bpf(0, 0, 0))
            .expect("3.11 is in the table");
        assert_eq!(
            (bpf.cframe_current_frame, bpf.frame_entry, bpf.code_instructions),
            (8, 68, 184)
        );
    }

    /// A python3.13 of pyenv's: $PYENV_ROOT (or /root/.pyenv)/versions/3.13.*.
    fn pyenv_python_3_13() -> std::path::PathBuf {
        let root =
            std::env::var_os("PYENV_ROOT").map_or_else(|| "/root/.pyenv".into(), std::path::PathBuf::from);
        let found = std::fs::read_dir(root.join("versions")).ok().and_then(|dir| {
            let mut pythons: Vec<_> = dir
                .flatten()
                .filter(|entry| entry.file_name().to_string_lossy().starts_with("3.13."))
                .map(|entry| entry.path().join("bin/python3.13"))
                .filter(|python| python.is_file())
                .collect();
            pythons.sort();
            pythons.pop()
        });
        found.unwrap_or_else(|| {
            panic!(
                "this test needs a pyenv CPython 3.13 ({}/versions/3.13.*/bin/python3.13): install it with \
                 `pyenv install 3.13` (PYENV_ROOT chooses another pyenv)",
                root.display()
            )
        })
    }

    /// The runtime address of `_PyRuntime` in `pid`: the mapped file that
    /// exports it (libpython, or the executable), through the mapping of
    /// the file bytes that hold it.
    fn runtime_address(pid: u32) -> u64 {
        use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("the child's maps");
        // (start, end, file offset, path) of each file mapping.
        let mappings: Vec<(u64, u64, u64, &str)> = maps
            .lines()
            .filter_map(|line| {
                let mut parts = line.split_whitespace();
                let (range, _, offset) = (parts.next()?, parts.next()?, parts.next()?);
                let path = parts.nth(2).filter(|path| path.starts_with('/'))?;
                let (start, end) = range.split_once('-')?;
                let hex = |text: &str| u64::from_str_radix(text, 16).ok();
                Some((hex(start)?, hex(end)?, hex(offset)?, path))
            })
            .collect();
        let mut paths: Vec<&str> = mappings.iter().map(|mapping| mapping.3).collect();
        paths.dedup();
        for path in paths {
            let Ok(data) = std::fs::read(path) else { continue };
            let Ok(file) = object::File::parse(&*data) else {
                continue;
            };
            let Some(symbol) = file
                .dynamic_symbols()
                .find(|symbol| symbol.name() == Ok("_PyRuntime"))
            else {
                continue;
            };
            let section = symbol
                .section_index()
                .and_then(|index| file.section_by_index(index).ok());
            let section = section.expect("_PyRuntime is in a section");
            let (file_start, _) = section.file_range().expect("_PyRuntime has file bytes");
            let file_offset = file_start + (symbol.address() - section.address());
            let mapping = mappings
                .iter()
                .find(|m| m.3 == path && m.2 <= file_offset && file_offset < m.2 + (m.1 - m.0))
                .expect("the bytes of _PyRuntime are mapped");
            return mapping.0 + (file_offset - mapping.2);
        }
        panic!("no file mapped in {pid} exports _PyRuntime");
    }

    #[test]
    fn live_3_13_says_its_layout() {
        let python = pyenv_python_3_13();
        let mut child = Command::new(&python)
            .args(["-c", "import sys; print('ready', flush=True); sys.stdin.read()"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("cannot run {}: {err}", python.display()));
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped");
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the child's first line");
        assert_eq!(line, "ready\n", "{} did not start", python.display());

        let address = runtime_address(child.id());
        let mut bytes = vec![0; DEBUG_OFFSETS_LEN];
        let mem =
            std::fs::File::open(format!("/proc/{}/mem", child.id())).expect("the child's memory (root)");
        mem.read_exact_at(&mut bytes, address)
            .expect("_PyRuntime's bytes");
        // The child ends when its stdin closes.
        drop(child.stdin.take());
        let _ = child.wait();

        assert_eq!(from_debug_offsets(&bytes), Ok(known::V3_13));
        assert_eq!(for_version(v(13)), Some(known::V3_13));
    }
}
