//! One process's memory as the symbolizer reads it: through the reader's
//! thread, each read bounded in time, and never again once one stalled.

use std::sync::atomic::{AtomicBool, Ordering};

use super::Reader;
use crate::python::memory::{Memory, MemoryError, check_read};

/// One process instance's memory, read through a [`Reader`].
pub struct ReaderMemory {
    pid: u32,
    reader: Reader,
    /// A read of it timed out: never read again.
    stalled: AtomicBool,
}

impl ReaderMemory {
    pub(super) fn new(pid: u32, reader: Reader) -> Self {
        Self {
            pid,
            reader,
            stalled: AtomicBool::new(false),
        }
    }

    pub fn stalled(&self) -> bool {
        self.stalled.load(Ordering::Relaxed)
    }
}

impl Memory for ReaderMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        let inner = &*self.reader.inner;
        if self.stalled() {
            inner.refused_stalled.fetch_add(1, Ordering::Relaxed);
            return Err(MemoryError::Stalled { pid: self.pid });
        }
        // Refused here, a bad read costs no trip to the thread.
        check_read(address, buffer.len())?;
        if buffer.is_empty() {
            return Ok(());
        }
        let outcome = inner.read(self.pid, address, buffer);
        if matches!(outcome, Err(MemoryError::TimedOut { .. })) && !self.stalled.swap(true, Ordering::Relaxed)
        {
            inner.stalled_processes.fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }
}

impl Drop for ReaderMemory {
    /// The process exited (or its cache was dropped): one fewer stalled.
    fn drop(&mut self) {
        if self.stalled() {
            self.reader
                .inner
                .stalled_processes
                .fetch_sub(1, Ordering::Relaxed);
        }
    }
}
