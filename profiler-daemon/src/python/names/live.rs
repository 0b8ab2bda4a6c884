//! Code objects of live CPython processes, every version: names, files,
//! first lines and the line of every instruction, as the interpreter itself
//! reports them (live.py); and fake code objects made with ctypes.
//! Run as root (process_vm_readv of a child needs no more, but the suite does).

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use profiler_common::python::{NO_INSTRUCTION, code_key, encode_frame};
use serde_json::Value;

use super::*;
use crate::python::code::tests::layout_3_11;
use crate::python::code::{MAX_FILENAME, MAX_NAME, read_code};
use crate::python::layout::Version;
use crate::python::memory::{MAX_READ, MemoryError};

/// Every interpreter the machine has, with its version.
const PYTHONS: &[(&str, u8)] = &[
    ("/root/.pyenv/versions/3.8.18/bin/python3.8", 8),
    ("/root/.pyenv/versions/3.9.18/bin/python3.9", 9),
    ("/root/.pyenv/versions/3.10.13/bin/python3.10", 10),
    ("/root/.pyenv/versions/3.11.7/bin/python3.11", 11),
    ("/usr/bin/python3.11", 11),
    ("/root/.pyenv/versions/3.12.1/bin/python3.12", 12),
    ("/root/.pyenv/versions/3.13.0/bin/python3.13", 13),
];

fn layout_for(version: Version) -> Option<Layout> {
    crate::python::layout::for_version(version)
}

#[test]
fn the_table_agrees_with_the_notes() {
    assert_eq!(layout_for(Version { major: 3, minor: 11 }), Some(layout_3_11()));
}

/// A running live.py; killed when dropped.
struct Script {
    child: std::process::Child,
    codes: Vec<Value>,
    forged: Value,
}

impl Drop for Script {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(python: &str, layout: &Layout) -> Script {
    assert!(
        std::path::Path::new(python).exists(),
        "{python} is missing: the test needs every CPython version listed in PYTHONS"
    );
    static RUN: AtomicUsize = AtomicUsize::new(0);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let dir: PathBuf = std::env::temp_dir().join(format!("profilerd-py-names-{}-{run}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let script = dir.join("live.py");
    std::fs::write(&script, include_str!("live.py")).expect("script");
    let code = &layout.code;
    let strings = &layout.strings;
    let offsets = serde_json::json!({
        "first_line": code.first_line, "filename": code.filename,
        "name": code.qualname.unwrap_or(code.name), "line_table": code.line_table,
        "length": strings.length, "state": strings.state,
        "ascii_data": strings.ascii_data, "compact_data": strings.compact_data,
    });
    let child = Command::new(python)
        .arg(&script)
        .arg(offsets.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("{python}: {error}"));
    let mut script = Script {
        child,
        codes: Vec::new(),
        forged: Value::Null,
    };
    let stdout = script.child.stdout.take().expect("piped stdout");
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("script output");
        let (kind, rest) = line.split_once(' ').unwrap_or((&line, ""));
        match kind {
            "code" => script.codes.push(serde_json::from_str(rest).expect("code line")),
            "forged" => script.forged = serde_json::from_str(rest).expect("forged line"),
            "ready" => {
                let _ = std::fs::remove_dir_all(&dir);
                return script;
            }
            _ => panic!("{python}: unexpected output {line:?}"),
        }
    }
    let mut errors = String::new();
    if let Some(mut stderr) = script.child.stderr.take() {
        let _ = stderr.read_to_string(&mut errors);
    }
    panic!("{python} ended before it was ready: {errors}");
}

/// What the reader should make of these code points.
fn expected(points: &Value, max: usize) -> String {
    let text: Vec<char> = points
        .as_array()
        .expect("code points")
        .iter()
        .map(|point| {
            let point = point.as_u64().expect("code point") as u32;
            char::from_u32(point).unwrap_or(char::REPLACEMENT_CHARACTER)
        })
        .collect();
    if text.len() > max {
        text[..max - 1].iter().chain(['…'].iter()).collect()
    } else {
        text.into_iter().collect()
    }
}

fn number(value: &Value, field: &str) -> u64 {
    value[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {value}"))
}

#[test]
fn code_objects_of_every_version() {
    for &(python, minor) in PYTHONS {
        let version = Version { major: 3, minor };
        let layout = layout_for(version).unwrap_or_else(|| panic!("no layout for {version}"));
        let script = start(python, &layout);
        let pid = script.child.id();
        let memory = ProcessMemory::new(pid);
        let mut names = PythonNames::new();
        assert_eq!(script.codes.len(), 10, "{python}");
        for code in &script.codes {
            let address = number(code, "id");
            let name = expected(&code["name"], MAX_NAME);
            let filename = expected(&code["filename"], MAX_FILENAME);
            let first = number(code, "first") as u32;
            let read = read_code(&memory, &layout, address)
                .unwrap_or_else(|error| panic!("{python}: {name}: {error}"));
            assert_eq!(
                (&*read.qualname, &*read.filename),
                (name.as_str(), filename.as_str()),
                "{python}"
            );
            assert_eq!(read.first_line, first, "{python}: {name}");
            let lines: Vec<u32> = code["lines"]
                .as_array()
                .expect("lines")
                .iter()
                .map(|line| line.as_u64().expect("line") as u32)
                .collect();
            assert!(!lines.is_empty(), "{python}: {name}");
            let read_lines: Vec<u32> = (0..lines.len() as u64).map(|at| read.line(at)).collect();
            assert_eq!(read_lines, lines, "{python}: lines of {name}");

            for (instruction, line) in [
                (NO_INSTRUCTION, first),
                (lines.len() as u64 - 1, lines[lines.len() - 1]),
            ] {
                let slot = encode_frame(address, instruction, code_key(first));
                let frame = names.resolve(pid, 1, &layout, slot);
                let expected = PythonFrame {
                    function: Arc::from(name.as_str()),
                    filename: Some(Arc::from(filename.as_str())),
                    line,
                    resolved: true,
                };
                assert_eq!(frame, expected, "{python}");
            }
            let wrong = encode_frame(address, 0, code_key(first) ^ 1);
            assert!(
                !names.resolve(pid, 1, &layout, wrong).resolved,
                "{python}: {name}"
            );
        }
        let stats = names.stats();
        assert_eq!(
            (stats.reads, stats.read_errors, stats.key_mismatches),
            (20, 0, 10),
            "{python}"
        );
        eprintln!("{python}: {} code objects read and matched", script.codes.len());
    }
}

/// Counts what is read through it, across the threads of the cache's owner.
#[derive(Clone, Default)]
struct Counters {
    largest: Arc<AtomicUsize>,
    bytes: Arc<AtomicUsize>,
}

struct Counting(ProcessMemory, Counters);

impl Memory for Counting {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        self.1.largest.fetch_max(buffer.len(), Ordering::Relaxed);
        self.1.bytes.fetch_add(buffer.len(), Ordering::Relaxed);
        self.0.read(address, buffer)
    }
}

#[test]
fn forged_code_objects_of_every_version() {
    for &(python, minor) in PYTHONS {
        let version = Version { major: 3, minor };
        let layout = layout_for(version).unwrap_or_else(|| panic!("no layout for {version}"));
        let script = start(python, &layout);
        let pid = script.child.id();
        let counters = Counters::default();
        let shared = counters.clone();
        let open = move |pid| Counting(ProcessMemory::new(pid), shared.clone());
        let mut names = PythonNames::with_memory(open, Limits::default());
        let forged = &script.forged;
        let key = code_key(number(forged, "first") as u32);
        let resolve = |names: &mut PythonNames<Counting>, field: &str| {
            let before = counters.bytes.load(Ordering::Relaxed);
            let started = Instant::now();
            let frame = names.resolve(pid, 1, &layout, encode_frame(number(forged, field), 0, key));
            let took = started.elapsed();
            let read = counters.bytes.load(Ordering::Relaxed) - before;
            // Names, filename and line table, each capped: under 100 KiB.
            assert!(read < 100 * 1024, "{python}: {field}: {read} bytes read");
            assert!(took < Duration::from_millis(200), "{python}: {field}: {took:?}");
            frame
        };

        // Strings claiming 2^31 characters, the rest real: cut names.
        let frame = resolve(&mut names, "truncated");
        assert!(frame.resolved, "{python}: {frame:?}");
        assert_eq!(frame.function.chars().count(), MAX_NAME);
        assert_eq!(frame.function.chars().filter(|&c| c == 'x').count(), MAX_NAME - 1);
        let filename = frame.filename.expect("filename");
        assert_eq!(filename.chars().count(), MAX_FILENAME);
        assert!(filename.starts_with("yyyy") && filename.ends_with('…'));
        // Garbage pointers, and a type that is no type: placeholders.
        for field in ["garbage", "not_code"] {
            let frame = resolve(&mut names, field);
            assert!(!frame.resolved && frame.filename.is_none(), "{python}: {frame:?}");
            assert!(frame.function.starts_with("[unknown python code 0x"));
        }
        assert!(counters.largest.load(Ordering::Relaxed) <= MAX_READ);
        assert_eq!(names.stats().read_errors, 2, "{python}");
    }
}
