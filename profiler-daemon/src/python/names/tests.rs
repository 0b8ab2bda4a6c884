//! The cache over fake process memory: keys, negative entries, bounds.

use std::sync::{Arc, Mutex};

use profiler_common::python::{NO_INSTRUCTION, code_key, encode_frame};

use super::*;
use crate::python::code::tests::{Image, layout_3_11};
use crate::python::memory::{FakeMemory, MemoryError};

fn cache(image: Image, limits: Limits) -> PythonNames<Arc<FakeMemory>> {
    let memory = Arc::new(image.memory);
    PythonNames::with_memory(move |_pid| memory.clone(), limits)
}

/// An image with `count` code objects named f0, f1..., first lines 10, 11...
fn make(count: u32) -> (Image, Vec<u64>) {
    let mut image = Image::new(0x1000 + count as usize * 0x200 + 0x1000);
    let filename = image.text("/srv/app.py");
    // Two units on the first line, then one on the next.
    let table = image.bytes(&[0x81, 0x00, 0xd8, 0x01, 0x02], 5);
    let codes = (0..count)
        .map(|index| {
            let name = image.text(&format!("f{index}"));
            image.new_code(10 + index, name, filename, table)
        })
        .collect();
    (image, codes)
}

fn slot(code: u64, instruction: u64, first_line: u32) -> u64 {
    encode_frame(code, instruction, code_key(first_line))
}

#[test]
fn resolves_once_per_address() {
    let (image, codes) = make(1);
    let mut names = cache(image, Limits::default());
    let layout = layout_3_11();
    let frame = names.resolve(7, 1, &layout, slot(codes[0], 2, 10));
    assert_eq!(
        frame,
        PythonFrame {
            function: Arc::from("f0"),
            filename: Some(Arc::from("/srv/app.py")),
            line: 11,
            resolved: true,
        }
    );
    let again = names.resolve(7, 1, &layout, slot(codes[0], NO_INSTRUCTION, 10));
    assert_eq!((again.line, again.resolved), (10, true));
    let stats = names.stats();
    assert_eq!((stats.reads, stats.cached, stats.read_errors), (1, 1, 0));

    // Another instance of the pid is another process: read again.
    names.resolve(7, 2, &layout, slot(codes[0], 0, 10));
    assert_eq!(names.stats().reads, 2);
    names.exited(7, 1);
    names.exited(7, 2);
    assert_eq!(names.stats().cached, 0);

    // Not a Python frame: no read.
    let frame = names.resolve(7, 1, &layout, 0x7fff_0000_1000);
    assert!(!frame.resolved);
    assert_eq!(names.stats().reads, 2);
}

#[test]
fn key_mismatch_gives_a_placeholder_and_bounded_reads() {
    let (image, codes) = make(1);
    let mut names = cache(image, Limits::default());
    let layout = layout_3_11();
    let wrong = slot(codes[0], 0, 11);
    let frame = names.resolve(7, 1, &layout, wrong);
    assert!(!frame.resolved);
    assert_eq!(&*frame.function, format!("[unknown python code {:#x}]", codes[0]));
    assert_eq!((names.stats().reads, names.stats().key_mismatches), (1, 1));
    // The same key again: no read.
    names.resolve(7, 1, &layout, wrong);
    assert_eq!((names.stats().reads, names.stats().key_mismatches), (1, 2));
    // The right key: from the cache.
    assert!(names.resolve(7, 1, &layout, slot(codes[0], 0, 10)).resolved);
    // Another wrong key: read once more, remembered with the first.
    names.resolve(7, 1, &layout, slot(codes[0], 0, 12));
    names.resolve(7, 1, &layout, slot(codes[0], 0, 12));
    names.resolve(7, 1, &layout, wrong);
    assert_eq!((names.stats().reads, names.stats().key_mismatches), (2, 5));
}

/// Memory the test changes under the cache.
struct Shared(Arc<Mutex<FakeMemory>>);

impl Memory for Shared {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        self.0.lock().expect("test memory").read(address, buffer)
    }
}

#[test]
fn a_reused_address_is_read_again() {
    let (mut image, codes) = make(1);
    let layout = layout_3_11();
    let name = image.text("g");
    let memory = Arc::new(Mutex::new(image.memory));
    let shared = memory.clone();
    let mut names = PythonNames::with_memory(move |_pid| Shared(shared.clone()), Limits::default());
    assert!(names.resolve(7, 1, &layout, slot(codes[0], 0, 10)).resolved);
    // f0 freed, g (first line 40) made at its address.
    {
        let mut memory = memory.lock().expect("test memory");
        let at = (codes[0] - memory.base) as usize;
        memory.bytes[at + 0x48..at + 0x4c].copy_from_slice(&40u32.to_ne_bytes());
        memory.bytes[at + 0x80..at + 0x88].copy_from_slice(&name.to_ne_bytes());
    }
    let frame = names.resolve(7, 1, &layout, slot(codes[0], 0, 40));
    assert_eq!((&*frame.function, frame.resolved), ("g", true));
    // A late sample of f0 now gets a placeholder.
    assert!(!names.resolve(7, 1, &layout, slot(codes[0], 0, 10)).resolved);
    let stats = names.stats();
    assert_eq!((stats.reads, stats.key_mismatches, stats.cached), (3, 1, 1));
}

#[test]
fn unreadable_addresses_cost_one_read() {
    let (image, _) = make(1);
    let mut names = cache(image, Limits::default());
    let layout = layout_3_11();
    for _ in 0..3 {
        for garbage in [0x10u64, 0xdead_beef_0000, 0x7fff_ffff_fff0] {
            let frame = names.resolve(7, 1, &layout, slot(garbage, 0, 1));
            assert!(!frame.resolved);
        }
    }
    let stats = names.stats();
    assert_eq!((stats.reads, stats.read_errors, stats.cached), (3, 3, 3));

    // With no time to live, each is tried again.
    let (image, _) = make(1);
    let limits = Limits {
        negative_ttl: Duration::ZERO,
        ..Limits::default()
    };
    let mut names = cache(image, limits);
    names.resolve(7, 1, &layout, slot(0x10, 0, 1));
    names.resolve(7, 1, &layout, slot(0x10, 0, 1));
    assert_eq!(names.stats().reads, 2);
}

#[test]
fn per_process_bound_evicts_the_least_recently_used() {
    let (image, codes) = make(40);
    let limits = Limits {
        per_process: 16,
        ..Limits::default()
    };
    let mut names = cache(image, limits);
    let layout = layout_3_11();
    for (index, &code) in codes.iter().enumerate() {
        assert!(
            names
                .resolve(7, 1, &layout, slot(code, 0, 10 + index as u32))
                .resolved
        );
        // f0 stays in use.
        assert!(names.resolve(7, 1, &layout, slot(codes[0], 0, 10)).resolved);
    }
    let stats = names.stats();
    assert!(stats.cached <= 16 && stats.evictions >= 24, "{stats:?}");
    assert_eq!(stats.reads, 40);
    // Another process is not bounded by this one's count.
    names.resolve(8, 1, &layout, slot(codes[1], 0, 11));
    assert_eq!(names.stats().cached, stats.cached + 1);
}

#[test]
fn global_and_byte_bounds() {
    let (image, codes) = make(40);
    let limits = Limits {
        total: 20,
        ..Limits::default()
    };
    let mut names = cache(image, limits);
    let layout = layout_3_11();
    for pid in 1..=4 {
        for (index, &code) in codes.iter().take(10).enumerate() {
            names.resolve(pid, 1, &layout, slot(code, 0, 10 + index as u32));
        }
    }
    let stats = names.stats();
    assert!(stats.cached <= 20 && stats.evictions >= 20, "{stats:?}");
    // The latest process kept all its entries, the first lost them.
    assert_eq!(names.processes[&(4, 1)].entries.len(), 10);
    assert!(names.processes[&(1, 1)].entries.is_empty());

    let (image, codes) = make(40);
    let limits = Limits {
        bytes_per_process: 2000,
        ..Limits::default()
    };
    let mut names = cache(image, limits);
    for (index, &code) in codes.iter().enumerate() {
        names.resolve(7, 1, &layout, slot(code, 0, 10 + index as u32));
    }
    assert!(names.bytes <= 2000 && names.stats().evictions > 0);
    let held: usize = names.processes.values().map(|process| process.bytes).sum();
    assert_eq!(held, names.bytes);
}
