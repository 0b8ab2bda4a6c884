//! The reader over fake memory whose reads of some processes block until
//! the test lets them go (never, as far as the reader can tell).

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};

use profiler_common::python::{code_key, encode_frame};

use super::*;
use crate::python::code::tests::{Image, layout_3_11};
use crate::python::memory::FakeMemory;
use crate::python::names::{Limits, PythonNames};

/// Reads of pids from this one on block.
const BLOCKING: u32 = 1000;

/// Fake processes: a blocking pid waits for the gate, then answers 0xee
/// bytes; any other pid answers from `memory` if there is one, or bytes
/// all equal to its pid's low byte.
#[derive(Default)]
struct Fake {
    open: Mutex<bool>,
    opened: Condvar,
    /// Reads begun, by pid.
    reads: Mutex<HashMap<u32, usize>>,
    /// Blocked reads that returned.
    released: AtomicUsize,
    memory: Option<FakeMemory>,
}

impl Fake {
    fn read(&self, pid: u32, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        *self.reads.lock().expect("test").entry(pid).or_default() += 1;
        if pid >= BLOCKING {
            let mut open = self.open.lock().expect("test");
            while !*open {
                open = self.opened.wait(open).expect("test");
            }
            buffer.fill(0xee);
            self.released.fetch_add(1, Ordering::SeqCst);
            return Ok(());
        }
        match &self.memory {
            Some(memory) => memory.read(address, buffer),
            None => {
                buffer.fill(pid as u8);
                Ok(())
            }
        }
    }

    fn reads(&self, pid: u32) -> usize {
        self.reads.lock().expect("test").get(&pid).copied().unwrap_or(0)
    }

    fn release(&self) {
        *self.open.lock().expect("test") = true;
        self.opened.notify_all();
    }
}

const DEADLINE: Duration = Duration::from_millis(100);

fn reader(fake: &Arc<Fake>, max_abandoned: usize) -> Reader {
    let fake = fake.clone();
    let limits = ReaderLimits {
        deadline: DEADLINE,
        max_abandoned,
    };
    Reader::with_backend(limits, move |pid, address, buffer| {
        fake.read(pid, address, buffer)
    })
}

/// Runs `read`, with how long it took.
fn timed<T>(read: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let outcome = read();
    (outcome, start.elapsed())
}

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "still not {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

const ADDRESS: u64 = 0x10_0000;

#[test]
fn a_blocked_read_times_out_and_stalls_its_process() {
    let fake = Arc::new(Fake::default());
    let reader = reader(&fake, MAX_ABANDONED);
    let stalled = reader.open(BLOCKING);
    let mut buffer = [0; 16];
    let (outcome, took) = timed(|| stalled.read(ADDRESS, &mut buffer));
    assert!(
        matches!(outcome, Err(MemoryError::TimedOut { pid: BLOCKING, .. })),
        "{outcome:?}"
    );
    // It did wait for the read, and not much longer than the deadline.
    assert!(took >= DEADLINE && took < 2 * DEADLINE, "{took:?}");
    assert!(stalled.stalled());
    assert_eq!(fake.reads(BLOCKING), 1);

    // Again: refused at once, no read.
    let (outcome, took) = timed(|| stalled.read(ADDRESS, &mut buffer));
    assert!(
        matches!(outcome, Err(MemoryError::Stalled { pid: BLOCKING })),
        "{outcome:?}"
    );
    assert!(took < DEADLINE / 4, "{took:?}");
    assert_eq!(fake.reads(BLOCKING), 1);

    // Another process is read, by a fresh thread.
    let other = reader.open(7);
    other.read(ADDRESS, &mut buffer).expect("another process");
    assert_eq!(buffer, [7; 16]);
    let stats = reader.stats();
    assert_eq!(
        stats,
        ReaderStats {
            timeouts: 1,
            stalled_processes: 1,
            refused_stalled: 1,
            refused_saturated: 0,
            not_started: 0,
            abandoned_threads: 1,
            threads_started: 2,
        }
    );

    // Another instance of the pid is another process: read (and stalled) anew.
    let next = reader.open(BLOCKING);
    assert!(matches!(
        next.read(ADDRESS, &mut buffer),
        Err(MemoryError::TimedOut { .. })
    ));
    assert_eq!(fake.reads(BLOCKING), 2);
    assert_eq!(reader.stats().stalled_processes, 2);
    // They exit.
    drop((stalled, next));
    assert_eq!(reader.stats().stalled_processes, 0);

    // The blocked threads end once their reads return.
    fake.release();
    wait_until("returned", || reader.stats().abandoned_threads == 0);
    assert_eq!(fake.released.load(Ordering::SeqCst), 2);
}

#[test]
fn a_late_answer_goes_to_nobody() {
    let fake = Arc::new(Fake::default());
    let reader = reader(&fake, MAX_ABANDONED);
    let mut buffer = [0; 16];
    let blocked = reader.open(BLOCKING);
    assert!(blocked.read(ADDRESS, &mut buffer).is_err());
    let (seven, eight) = (reader.open(7), reader.open(8));
    seven.read(ADDRESS, &mut buffer).expect("7");
    assert_eq!(buffer, [7; 16]);
    // The blocked read returns (0xee bytes) and its thread ends.
    fake.release();
    wait_until("returned", || reader.stats().abandoned_threads == 0);
    assert_eq!(fake.released.load(Ordering::SeqCst), 1);
    for (memory, byte) in [(&eight, 8), (&seven, 7), (&eight, 8)] {
        memory.read(ADDRESS, &mut buffer).expect("a live process");
        assert_eq!(buffer, [byte; 16]);
    }
    // The stalled process stays so although its read returned.
    assert!(matches!(
        blocked.read(ADDRESS, &mut buffer),
        Err(MemoryError::Stalled { .. })
    ));
}

#[test]
fn abandoned_threads_are_bounded() {
    let fake = Arc::new(Fake::default());
    let max = 3;
    let reader = reader(&fake, max);
    let mut buffer = [0; 8];
    let blocked: Vec<ReaderMemory> = (0..max as u32).map(|n| reader.open(BLOCKING + n)).collect();
    for memory in &blocked {
        assert!(matches!(
            memory.read(ADDRESS, &mut buffer),
            Err(MemoryError::TimedOut { .. })
        ));
    }
    assert_eq!(reader.stats().abandoned_threads, max as u64);
    assert_eq!(reader.stats().threads_started, max as u64);

    // No thread more: every read fails at once, stalling no one.
    for pid in [7, BLOCKING + 10] {
        let memory = reader.open(pid);
        let (outcome, took) = timed(|| memory.read(ADDRESS, &mut buffer));
        assert!(
            matches!(outcome, Err(MemoryError::Saturated { abandoned: 3 })),
            "{outcome:?}"
        );
        assert!(took < DEADLINE / 4, "{took:?}");
        assert!(!memory.stalled());
    }
    let stats = reader.stats();
    assert_eq!((stats.refused_saturated, stats.threads_started), (2, max as u64));
    assert_eq!(fake.reads(7), 0);

    // One returns: reads go on, on a fresh thread.
    fake.release();
    wait_until("returned", || reader.stats().abandoned_threads == 0);
    reader.open(7).read(ADDRESS, &mut buffer).expect("7");
    assert_eq!(buffer, [7; 8]);
    assert_eq!(reader.stats().threads_started, max as u64 + 1);
}

#[test]
fn a_read_queued_behind_a_blocked_one_stalls_nobody() {
    let fake = Arc::new(Fake::default());
    let reader = reader(&fake, MAX_ABANDONED);
    let blocked = reader.open(BLOCKING);
    let first = std::thread::spawn(move || {
        let mut buffer = [0; 8];
        blocked.read(ADDRESS, &mut buffer).map(|()| buffer)
    });
    wait_until("blocked", || fake.reads(BLOCKING) == 1);
    let seven = reader.open(7);
    let mut buffer = [0; 8];
    let outcome = seven.read(ADDRESS, &mut buffer);
    assert!(
        matches!(outcome, Err(MemoryError::NotStarted { pid: 7, .. })),
        "{outcome:?}"
    );
    assert!(!seven.stalled());
    let outcome = first.join().expect("first reader");
    assert!(
        matches!(outcome, Err(MemoryError::TimedOut { .. })),
        "{outcome:?}"
    );
    // Read by a fresh thread; the old one skips the read given up.
    seven.read(ADDRESS, &mut buffer).expect("7");
    assert_eq!(buffer, [7; 8]);
    fake.release();
    wait_until("returned", || reader.stats().abandoned_threads == 0);
    assert_eq!(fake.reads(7), 1);
    let stats = reader.stats();
    assert_eq!(
        (stats.timeouts, stats.not_started, stats.stalled_processes),
        (1, 1, 0)
    );
}

#[test]
fn bad_reads_are_refused_before_the_thread() {
    let fake = Arc::new(Fake::default());
    let reader = reader(&fake, MAX_ABANDONED);
    let memory = reader.open(7);
    let mut big = vec![0; crate::python::memory::MAX_READ + 1];
    assert!(matches!(
        memory.read(ADDRESS, &mut big),
        Err(MemoryError::TooLarge { .. })
    ));
    assert!(matches!(
        memory.read(0, &mut [0; 8]),
        Err(MemoryError::BadAddress { .. })
    ));
    memory.read(ADDRESS, &mut []).expect("nothing to read");
    assert_eq!(fake.reads(7), 0);
    assert_eq!(reader.stats().threads_started, 0);
}

#[test]
fn reads_live_memory() {
    let reader = Reader::new(ReaderLimits::default());
    let value: u64 = 0x0123_4567_89ab_cdef;
    let memory = reader.open(std::process::id());
    assert_eq!(
        memory.read_u64(&value as *const u64 as u64).expect("own memory"),
        value
    );
    assert!(matches!(
        memory.read_u64(0x7fff_ffff_0000_0000 >> 8),
        Err(MemoryError::Os { .. })
    ));
}

/// Code objects f0, f1 (first lines 10, 11) in fake memory.
fn image() -> (FakeMemory, [u64; 2]) {
    let mut image = Image::new(0x3000);
    let filename = image.text("/srv/app.py");
    let table = image.bytes(&[0x81, 0x00, 0xd8, 0x01, 0x02], 5);
    let mut code = |index: u32| {
        let name = image.text(&format!("f{index}"));
        image.new_code(10 + index, name, filename, table)
    };
    let codes = [code(0), code(1)];
    (image.memory, codes)
}

fn slot(code: u64, first_line: u32) -> u64 {
    encode_frame(code, 0, code_key(first_line))
}

#[test]
fn names_answer_within_the_deadline() {
    let (memory, codes) = image();
    let fake = Arc::new(Fake {
        memory: Some(memory),
        ..Fake::default()
    });
    let reader = reader(&fake, MAX_ABANDONED);
    let open = {
        let reader = reader.clone();
        move |pid| reader.open(pid)
    };
    let mut names = PythonNames::with_memory(open, Limits::default());
    let layout = layout_3_11();

    let (frame, took) = timed(|| names.resolve(BLOCKING, 1, &layout, slot(codes[0], 10)));
    assert!(!frame.resolved);
    assert!(took >= DEADLINE && took < 2 * DEADLINE, "{took:?}");
    // Another code object of the process: refused at once.
    let (frame, took) = timed(|| names.resolve(BLOCKING, 1, &layout, slot(codes[1], 11)));
    assert!(!frame.resolved);
    assert!(took < DEADLINE / 4, "{took:?}");
    assert_eq!(fake.reads(BLOCKING), 1);
    assert_eq!(reader.stats().refused_stalled, 1);
    // Other processes are named.
    let frame = names.resolve(7, 1, &layout, slot(codes[1], 11));
    assert_eq!((&*frame.function, frame.resolved), ("f1", true));
    let stats = names.stats();
    assert_eq!((stats.reads, stats.read_errors), (3, 2));

    // It exits.
    assert_eq!(reader.stats().stalled_processes, 1);
    names.exited(BLOCKING, 1);
    assert_eq!(reader.stats().stalled_processes, 0);
    fake.release();
    wait_until("returned", || reader.stats().abandoned_threads == 0);
}

#[test]
fn names_forget_reads_refused_while_saturated() {
    let (memory, codes) = image();
    let fake = Arc::new(Fake {
        memory: Some(memory),
        ..Fake::default()
    });
    let reader = reader(&fake, 1);
    let open = {
        let reader = reader.clone();
        move |pid| reader.open(pid)
    };
    let mut names = PythonNames::with_memory(open, Limits::default());
    let layout = layout_3_11();
    assert!(!names.resolve(BLOCKING, 1, &layout, slot(codes[0], 10)).resolved);
    // Saturated: a placeholder, and the address is not remembered as unreadable.
    assert!(!names.resolve(7, 1, &layout, slot(codes[0], 10)).resolved);
    assert_eq!(reader.stats().refused_saturated, 1);
    assert_eq!(names.stats().cached, 1);
    fake.release();
    wait_until("returned", || reader.stats().abandoned_threads == 0);
    let frame = names.resolve(7, 1, &layout, slot(codes[0], 10));
    assert_eq!((&*frame.function, frame.resolved), ("f0", true));
}
