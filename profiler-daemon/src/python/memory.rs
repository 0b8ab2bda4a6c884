//! Reading another process's memory, a bounded piece at a time.
//!
//! Everything read this way is hostile input: the target's owner controls
//! every byte, and the bytes may change between two reads. Callers copy
//! what they need into their own buffers once and decode from there.

use std::{io::IoSliceMut, time::Duration};

use nix::{
    sys::uio::{RemoteIoVec, process_vm_readv},
    unistd::Pid,
};
use thiserror::Error;

/// The largest single read: no structure the reader follows is bigger
/// (line tables and strings are capped below it), so a forged length
/// never turns into a large allocation.
pub const MAX_READ: usize = 64 * 1024;

/// Addresses below this are never mapped (Linux's default `mmap_min_addr`
/// is 64 KiB; one page is the least it can be): refused without a syscall,
/// as a null or small forged pointer is common.
const MIN_ADDRESS: u64 = 4096;

#[derive(Debug, Error)]
pub enum MemoryError {
    #[error("a read of {len} bytes is over the limit ({MAX_READ})")]
    TooLarge { len: usize },
    #[error("{address:#x} (+{len} bytes) is not a user address")]
    BadAddress { address: u64, len: usize },
    #[error("reading {len} bytes at {address:#x} of process {pid}: {source}")]
    Os {
        pid: u32,
        address: u64,
        len: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("reading {wanted} bytes at {address:#x}: only {got} read")]
    Short { address: u64, wanted: usize, got: usize },
    // The errors of the reader that bounds each read's time (`python::reader`).
    #[error(
        "reading {len} bytes at {address:#x} of process {pid} did not end within {deadline:?}: \
         the process is not read again"
    )]
    TimedOut {
        pid: u32,
        address: u64,
        len: usize,
        deadline: Duration,
    },
    #[error("process {pid} blocked a read of its memory before: not read again")]
    Stalled { pid: u32 },
    #[error("{abandoned} reads of processes' memory are still blocked: no reads until one returns")]
    Saturated { abandoned: usize },
    #[error("the reader thread did not start reading process {pid} within {deadline:?}")]
    NotStarted { pid: u32, deadline: Duration },
    #[error("starting a memory reader thread: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("the memory reader thread ended without an answer")]
    ReaderLost,
}

impl MemoryError {
    /// Whether the same read may well succeed soon: the failure was the
    /// reader's state, not the address (so the address is not to be
    /// remembered as unreadable).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Saturated { .. } | Self::NotStarted { .. } | Self::Spawn(_) | Self::ReaderLost
        )
    }
}

/// Memory of some process (or, in tests, a buffer standing for it).
pub trait Memory {
    /// Fills `buffer` with the bytes at `address`, all of them or an error.
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError>;

    fn read_u64(&self, address: u64) -> Result<u64, MemoryError> {
        let mut bytes = [0; 8];
        self.read(address, &mut bytes)?;
        Ok(u64::from_ne_bytes(bytes))
    }
}

/// One process's memory shared by several readers.
impl<T: Memory + ?Sized> Memory for std::sync::Arc<T> {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        (**self).read(address, buffer)
    }
}

/// Checks done before any read: size bound and address range.
pub fn check_read(address: u64, len: usize) -> Result<(), MemoryError> {
    if len > MAX_READ {
        return Err(MemoryError::TooLarge { len });
    }
    // `len` ≤ 64 KiB fits a u64; the end must not wrap.
    let fits = address
        .checked_add(len as u64)
        .is_some_and(|end| end <= i64::MAX as u64);
    if address < MIN_ADDRESS || !fits {
        return Err(MemoryError::BadAddress { address, len });
    }
    Ok(())
}

/// A live process, read with `process_vm_readv(2)` (no ptrace stop; needs
/// the same permission as ptrace-reading it, which the daemon has as root).
/// A process that exited, or an unmapped address, gives an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessMemory {
    pub pid: u32,
}

impl ProcessMemory {
    pub fn new(pid: u32) -> Self {
        Self { pid }
    }
}

impl Memory for ProcessMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        let len = buffer.len();
        check_read(address, len)?;
        if len == 0 {
            return Ok(());
        }
        // The remote address is only a number to this process: the kernel
        // checks it against the target's mappings. On the stack, both
        // vectors: this runs per sample, with no allocation.
        let remote = [RemoteIoVec {
            base: address as usize,
            len,
        }];
        // `pid` beyond i32 is no process (the kernel answers ESRCH).
        let pid = Pid::from_raw(self.pid as i32);
        let got = process_vm_readv(pid, &mut [IoSliceMut::new(buffer)], &remote).map_err(|errno| {
            MemoryError::Os {
                pid: self.pid,
                address,
                len,
                source: std::io::Error::from(errno),
            }
        })?;
        // A partial read (the range runs into an unmapped page) is an error:
        // every structure read is needed whole.
        if got != len {
            return Err(MemoryError::Short {
                address,
                wanted: len,
                got,
            });
        }
        Ok(())
    }
}

/// A buffer standing for a process's memory, at `base` (tests and fuzzing).
#[cfg(test)]
pub struct FakeMemory {
    pub base: u64,
    pub bytes: Vec<u8>,
}

#[cfg(test)]
impl Memory for FakeMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        let len = buffer.len();
        check_read(address, len)?;
        let bad = || MemoryError::BadAddress { address, len };
        let start = address
            .checked_sub(self.base)
            .and_then(|offset| usize::try_from(offset).ok())
            .ok_or_else(bad)?;
        let end = start.checked_add(len).ok_or_else(bad)?;
        let source = self.bytes.get(start..end).ok_or_else(bad)?;
        buffer.copy_from_slice(source);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_memory_and_refuses_bad_reads() {
        let value: u64 = 0x1234_5678_9abc_def0;
        let memory = ProcessMemory::new(std::process::id());
        let address = &value as *const u64 as u64;
        assert_eq!(memory.read_u64(address).unwrap(), value);

        let mut big = vec![0; MAX_READ + 1];
        assert!(matches!(
            memory.read(address, &mut big),
            Err(MemoryError::TooLarge { .. })
        ));
        let mut small = [0; 8];
        assert!(matches!(
            memory.read(0, &mut small),
            Err(MemoryError::BadAddress { .. })
        ));
        assert!(matches!(
            memory.read(u64::MAX - 4, &mut small),
            Err(MemoryError::BadAddress { .. })
        ));
        // Mapped nowhere (a kernel-half-looking user address).
        assert!(memory.read(0x7fff_ffff_0000_0000 >> 8, &mut small).is_err());
    }

    #[test]
    fn short_read_is_an_error() {
        // The last 4 bytes of a mapping followed by a guard page: a read of
        // 8 bytes there gets 4.
        let page = 4096;
        // SAFETY: a fresh anonymous mapping of two pages, owned here and
        // unmapped below; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        // SAFETY: the second page of the mapping made above.
        let protected = unsafe { libc::mprotect(base.cast::<u8>().add(page).cast(), page, libc::PROT_NONE) };
        assert_eq!(protected, 0);
        let memory = ProcessMemory::new(std::process::id());
        let mut buffer = [0; 8];
        let result = memory.read(base as u64 + page as u64 - 4, &mut buffer);
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(base, 2 * page) };
        assert!(
            matches!(result, Err(MemoryError::Short { got: 4, .. })),
            "{result:?}"
        );
    }
}
