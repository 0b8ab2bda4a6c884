//! Code objects built by hand in a fake process memory: every string kind,
//! the caps, and forgeries (random bytes included).

use std::cell::Cell;

use profiler_common::python::{frame_model, instruction_model};

use super::*;
use crate::python::layout::{CodeLayout, LineTableFormat, Version};
use crate::python::memory::{FakeMemory, MAX_READ};

/// 3.11 (x86_64), from ../shared/notes/interpreters.md: what the tests use
/// where the version does not matter.
pub(crate) fn layout_3_11() -> Layout {
    Layout {
        version: Version { major: 3, minor: 11 },
        frame_model: frame_model::ENTRY_FLAG,
        instruction_model: instruction_model::PREVIOUS_POINTER,
        runtime_interpreters_head: 0x28,
        interpreter_threads_head: 0x10,
        thread_next: 8,
        thread_id: 0x98,
        thread_frame: 0x38,
        cframe_current_frame: Some(8),
        frame_previous: 0x30,
        frame_code: 0x20,
        frame_instruction: 0x38,
        frame_entry: Some(0x44),
        code: CodeLayout {
            argcount: 0x38,
            flags: 0x30,
            first_line: 0x48,
            filename: 0x70,
            name: 0x78,
            qualname: Some(0x80),
            line_table: 0x88,
            line_table_format: LineTableFormat::Locations,
            instructions: Some(0xb8),
        },
        strings: StringLayout {
            length: 0x10,
            state: 0x20,
            ascii_data: 0x30,
            compact_data: 0x48,
            bytes_size: 0x10,
            bytes_data: 0x20,
        },
    }
}

pub(crate) const BASE: u64 = 0x10_0000;
const TYPE: u64 = BASE + 0x100;
const CODE: u64 = BASE + 0x400;

/// A process image with a code type at TYPE and a code object at CODE
/// whose strings and line table are placed by the setters.
pub(crate) struct Image {
    pub memory: FakeMemory,
    next: u64,
}

impl Image {
    pub fn new(size: usize) -> Self {
        let mut image = Self {
            memory: FakeMemory {
                base: BASE,
                bytes: vec![0; size],
            },
            next: BASE + 0x1000,
        };
        image.put(TYPE + TYPE_NAME, &(BASE + 0x200).to_ne_bytes());
        image.put(BASE + 0x200, b"code\0");
        image.put(CODE + OBJECT_TYPE, &TYPE.to_ne_bytes());
        image
    }

    pub fn put(&mut self, address: u64, bytes: &[u8]) {
        let at = (address - BASE) as usize;
        self.memory.bytes[at..at + bytes.len()].copy_from_slice(bytes);
    }

    fn allocate(&mut self, size: usize) -> u64 {
        let address = self.next;
        self.next += (size as u64).next_multiple_of(16);
        address
    }

    /// A str of `length` (as claimed) with these code points.
    pub fn str(&mut self, points: &[u32], kind: u32, ascii: bool, length: i64) -> u64 {
        let data = if ascii { 0x30 } else { 0x48 };
        let address = self.allocate(data + points.len() * kind as usize);
        self.put(address + 0x10, &length.to_ne_bytes());
        let state = (kind << 2) | (1 << 5) | (u32::from(ascii) << 6);
        self.put(address + 0x20, &state.to_ne_bytes());
        for (index, &point) in points.iter().enumerate() {
            let at = address + data as u64 + (index * kind as usize) as u64;
            match kind {
                1 => self.put(at, &[point as u8]),
                2 => self.put(at, &(point as u16).to_ne_bytes()),
                _ => self.put(at, &point.to_ne_bytes()),
            }
        }
        address
    }

    pub fn text(&mut self, text: &str) -> u64 {
        let points: Vec<u32> = text.chars().map(u32::from).collect();
        let widest = points.iter().max().copied().unwrap_or(0);
        let (kind, ascii) = match widest {
            0..0x80 => (1, true),
            0x80..0x100 => (1, false),
            0x100..0x10000 => (2, false),
            _ => (4, false),
        };
        self.str(&points, kind, ascii, points.len() as i64)
    }

    pub fn bytes(&mut self, bytes: &[u8], length: i64) -> u64 {
        let address = self.allocate(0x20 + bytes.len());
        self.put(address + 0x10, &length.to_ne_bytes());
        self.put(address + 0x20, bytes);
        address
    }

    /// Sets the fields of the code object at CODE (3.11 layout).
    pub fn code(&mut self, first_line: u32, qualname: u64, filename: u64, table: u64) -> u64 {
        self.code_at(CODE, first_line, qualname, filename, table)
    }

    /// A new code object.
    pub fn new_code(&mut self, first_line: u32, qualname: u64, filename: u64, table: u64) -> u64 {
        let address = self.allocate(0xc0);
        self.put(address + OBJECT_TYPE, &TYPE.to_ne_bytes());
        self.code_at(address, first_line, qualname, filename, table)
    }

    pub fn code_at(
        &mut self,
        address: u64,
        first_line: u32,
        qualname: u64,
        filename: u64,
        table: u64,
    ) -> u64 {
        self.put(address + 0x48, &first_line.to_ne_bytes());
        self.put(address + 0x70, &filename.to_ne_bytes());
        self.put(address + 0x78, &qualname.to_ne_bytes());
        self.put(address + 0x80, &qualname.to_ne_bytes());
        self.put(address + 0x88, &table.to_ne_bytes());
        address
    }
}

/// Counts what is read through it.
struct Counting<'a> {
    inner: &'a FakeMemory,
    reads: Cell<usize>,
    bytes: Cell<usize>,
    largest: Cell<usize>,
}

impl<'a> Counting<'a> {
    fn new(inner: &'a FakeMemory) -> Self {
        Self {
            inner,
            reads: Cell::new(0),
            bytes: Cell::new(0),
            largest: Cell::new(0),
        }
    }
}

impl Memory for Counting<'_> {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        self.reads.set(self.reads.get() + 1);
        self.bytes.set(self.bytes.get() + buffer.len());
        self.largest.set(self.largest.get().max(buffer.len()));
        self.inner.read(address, buffer)
    }
}

fn simple(image: &mut Image, qualname: &str, filename: &str) -> u64 {
    let qualname = image.text(qualname);
    let filename = image.text(filename);
    // Two units on the first line, one on the next.
    let table = image.bytes(&[0x81, 0x00, 0xd8, 0x01, 0x02], 5);
    image.code(7, qualname, filename, table)
}

#[test]
fn reads_every_string_kind() {
    let layout = layout_3_11();
    for (qualname, filename) in [
        ("Ledger.settle.<locals>.one_round", "/srv/app/ledger.py"),
        ("café", "/srv/naïve/x.py"),
        ("名前", "/srv/名前.py"),
        ("𠀀.f", "/srv/𠀀.py"),
    ] {
        let mut image = Image::new(0x4000);
        let address = simple(&mut image, qualname, filename);
        let code = read_code(&image.memory, &layout, address).expect("code object");
        assert_eq!(&*code.qualname, qualname);
        assert_eq!(&*code.filename, filename);
        assert_eq!(code.first_line, 7);
        assert_eq!(
            (code.line(0), code.line(1), code.line(2), code.line(3)),
            (7, 7, 8, 0)
        );
        assert_eq!(code.line(NO_INSTRUCTION), 7);
    }
}

#[test]
fn replaces_what_is_no_character() {
    let layout = layout_3_11();
    let mut image = Image::new(0x4000);
    // A lone surrogate (Python allows it), a value past U+10FFFF, a byte
    // over 0x7f in an "ASCII" string.
    let ucs2 = image.str(&[u32::from('a'), 0xdc80], 2, false, 2);
    let ucs4 = image.str(&[0x11_0000, u32::from('b')], 4, false, 2);
    let ascii = image.str(&[0xff, u32::from('c')], 1, true, 2);
    let table = image.bytes(&[], 0);
    let address = image.code(1, ucs2, ucs4, table);
    let code = read_code(&image.memory, &layout, address).expect("code object");
    assert_eq!((&*code.qualname, &*code.filename), ("a\u{fffd}", "\u{fffd}b"));
    let address = image.code(1, ascii, ascii, table);
    let code = read_code(&image.memory, &layout, address).expect("code object");
    assert_eq!(&*code.qualname, "\u{fffd}c");
}

#[test]
fn cuts_long_strings() {
    let layout = layout_3_11();
    let mut image = Image::new(0x10_000);
    let name: Vec<u32> = (0..2000).map(|at| u32::from(b'a') + at % 26).collect();
    let qualname = image.str(&name, 1, true, 2000);
    let path: Vec<u32> = std::iter::repeat_n(0x540d, 5000).collect();
    let filename = image.str(&path, 2, false, 5000);
    let table = image.bytes(&[], 0);
    let address = image.code(1, qualname, filename, table);
    let code = read_code(&image.memory, &layout, address).expect("code object");
    assert_eq!(code.qualname.chars().count(), MAX_NAME);
    assert!(code.qualname.ends_with("…"));
    assert!(code.qualname.starts_with("abcdefghijklmnopqrstuvwxyzabc"));
    assert_eq!(code.filename.chars().count(), MAX_FILENAME);
    assert!(code.filename.starts_with("名名名"));
}

#[test]
fn forged_lengths_cost_bounded_reads() {
    let layout = layout_3_11();
    let mut image = Image::new(0x20_000);
    // Claims of 2^31 characters (UCS-4: 8 GiB) and 2^40 bytes of line table.
    let qualname = image.str(&[u32::from('x'); 1100], 1, true, 1 << 31);
    let filename = image.str(&[u32::from('y'); 4100], 4, false, 1 << 31);
    let table = image.bytes(&[0x80; MAX_TABLE], 1 << 40);
    let address = image.code(1, qualname, filename, table);
    let counting = Counting::new(&image.memory);
    let code = read_code(&counting, &layout, address).expect("code object");
    assert_eq!(code.qualname.chars().count(), MAX_NAME);
    assert_eq!(code.filename.chars().count(), MAX_FILENAME);
    assert_eq!(counting.largest.get(), MAX_TABLE);
    assert!(counting.bytes.get() < 100 * 1024, "{}", counting.bytes.get());

    // Negative lengths, not compact, no kind: refused.
    let negative = image.str(&[], 1, true, -1);
    let address = image.code(1, negative, filename, table);
    let result = read_code(&image.memory, &layout, address);
    assert!(
        matches!(result, Err(CodeError::BadLength { length: -1, .. })),
        "{result:?}"
    );
    let negative = image.bytes(&[], i64::MIN);
    let address = image.code(1, qualname, filename, negative);
    assert!(matches!(
        read_code(&image.memory, &layout, address),
        Err(CodeError::BadLength { .. })
    ));
    for state in [0u32, 1 << 2, (1 << 5) | (3 << 2), (1 << 5) | (1 << 6) | (2 << 2)] {
        let odd = image.str(&[], 1, true, 0);
        image.put(odd + 0x20, &state.to_ne_bytes());
        let address = image.code(1, odd, filename, table);
        let result = read_code(&image.memory, &layout, address);
        assert!(
            matches!(result, Err(CodeError::BadString { .. })),
            "{state:#x}: {result:?}"
        );
    }
    // Garbage pointers.
    let address = image.code(1, 0xdead_beef_0000, 8, u64::MAX);
    assert!(matches!(
        read_code(&image.memory, &layout, address),
        Err(CodeError::Read { .. })
    ));
}

#[test]
fn checks_the_type_by_name_once() {
    let layout = layout_3_11();
    let mut image = Image::new(0x4000);
    let address = simple(&mut image, "f", "f.py");
    let mut code_type = None;
    let counting = Counting::new(&image.memory);
    read_code_with(&counting, &layout, address, &mut code_type).expect("code object");
    assert_eq!(code_type, Some(TYPE));
    let first = counting.reads.get();
    read_code_with(&counting, &layout, address, &mut code_type).expect("code object");
    assert_eq!(counting.reads.get() - first, first - 2);

    image.put(BASE + 0x200, b"cod\0\0");
    let result = read_code(&image.memory, &layout, address);
    assert!(matches!(result, Err(CodeError::NotCode { .. })), "{result:?}");
}

/// xorshift64*: deterministic, no crate.
pub(crate) struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn random_memory_never_panics() {
    let layout = layout_3_11();
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let size = 0x4000;
    for _ in 0..3000 {
        let mut image = Image::new(size);
        // Random words, half of them pointers into the image, and states
        // that look compact, so that the reader gets past the first checks.
        for at in (0x1000..size as u64).step_by(8) {
            let word = match rng.next() % 4 {
                0 => BASE + rng.next() % size as u64,
                1 => rng.next() % 5000,
                2 => ((rng.next() % 8) << 2) | (1 << 5) | ((rng.next() % 2) << 6),
                _ => rng.next(),
            };
            image.put(BASE + at, &word.to_ne_bytes());
        }
        for field in [0x48, 0x70, 0x78, 0x80, 0x88] {
            let word = BASE + 0x1000 + rng.next() % (size as u64 - 0x1000);
            image.put(CODE + field, &word.to_ne_bytes());
        }
        let counting = Counting::new(&image.memory);
        let _ = read_code(&counting, &layout, CODE);
        assert!(counting.largest.get() <= MAX_READ);
        assert!(counting.reads.get() <= 9);
    }
}
