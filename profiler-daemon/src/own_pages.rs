//! Once started, the daemon (and each worker, before its first request)
//! unmaps the resident pages of its own executable's read-only segments.
//!
//! Start-up runs code the process never runs again (the BPF loader, flag
//! parsing, building the stages), and the kernel maps a file's pages 64 KiB
//! around each page fault (fault-around): start-up left 5-6 MB of the
//! daemon's 7 MB of code resident, for good. After [`release_startup_pages`]
//! the process faults back in what it runs from then on; the rest stays in
//! the page cache, reclaimable, no longer counted in the process's RSS.
//!
//! Only the executable's read-only segments (code, read-only data) are
//! released, never a writable one (RELRO lies in one), and in them only the
//! pages that are the file's: a page a debugger or a uprobe wrote a
//! breakpoint into is a private copy, which `MADV_DONTNEED` would discard,
//! so such pages (resident or swapped out) are told apart in
//! `/proc/self/pagemap` and kept. The file's own pages lose nothing: the
//! kernel drops them itself under memory pressure, and reads them back the
//! same way.
//!
//! The window: a breakpoint written into a page of the executable between
//! the pagemap read and `madvise` (microseconds, once per process) would be
//! dropped, and that breakpoint or uprobe would not fire in this process.
//! Nothing else breaks: the kernel checks the opcode when it removes a
//! uprobe, and a debugger finds its breakpoint gone. The kernel itself does
//! not guard its own release of file pages against that either.

use std::{fs::File, os::unix::fs::FileExt as _, ptr::NonNull};

use nix::sys::mman::{MmapAdvise, madvise};

#[derive(Debug, thiserror::Error)]
pub enum OwnPagesError {
    #[error(
        "unmapping the executable's read-only pages: the auxiliary vector gives no usable program headers"
    )]
    NoProgramHeaders,
    #[error("unmapping the executable's read-only pages: pages of {0} bytes, not 4096")]
    PageSize(libc::c_long),
    #[error("unmapping the executable's read-only pages: reading /proc/self/pagemap")]
    Pagemap(#[source] std::io::Error),
    #[error("unmapping the executable's read-only pages: madvise(MADV_DONTNEED) on {start:#x}+{len:#x}")]
    Madvise {
        start: usize,
        len: usize,
        #[source]
        source: nix::Error,
    },
}

/// What a release did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Released {
    /// Bytes of address space unmapped (whether resident or not).
    pub bytes: usize,
    /// Pages kept because they are private copies.
    pub private_pages: usize,
}

const PAGE: usize = 4096;
/// pagemap: the page is present.
const PRESENT: u64 = 1 << 63;
/// pagemap: the page is swapped out (or an anonymous page in migration).
const SWAPPED: u64 = 1 << 62;
/// pagemap: the page is the file's (or shared anonymous memory).
const FILE_PAGE: u64 = 1 << 61;

/// [`release_startup_pages`], its outcome logged: a failure only leaves the
/// pages resident.
pub fn release_startup_pages_logged() {
    match release_startup_pages() {
        Ok(released) => tracing::debug!(
            range_bytes = released.bytes,
            private_pages = released.private_pages,
            "unmapped the executable's read-only pages"
        ),
        Err(err) => tracing::warn!("{}", crate::error::Chain(&err)),
    }
}

/// Unmaps the executable's read-only pages that are the file's.
pub fn release_startup_pages() -> Result<Released, OwnPagesError> {
    // The ranges and pagemap's indices below are in 4 KiB pages.
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if page != PAGE as libc::c_long {
        return Err(OwnPagesError::PageSize(page));
    }
    let pagemap = File::open("/proc/self/pagemap").map_err(OwnPagesError::Pagemap)?;
    let mut released = Released::default();
    for (start, end) in read_only_segments()? {
        // SAFETY: a read-only segment of the executable: a private mapping
        // of its file, which no code of this process writes to.
        let segment = unsafe { release_file_pages(&pagemap, start, end) }?;
        released.bytes += segment.bytes;
        released.private_pages += segment.private_pages;
    }
    Ok(released)
}

/// Releases the pages of `start..end` (page-aligned) that are not private
/// copies: not present and not swapped, or present and the file's.
///
/// # Safety
/// `start..end` must be a private mapping of a file that this process does
/// not write to: its pages are then the file's, or copies that someone
/// else wrote (a debugger's or a uprobe's breakpoint), which are kept. A
/// copy made between the pagemap read and the release would be lost; see
/// the module's note on the window.
unsafe fn release_file_pages(pagemap: &File, start: usize, end: usize) -> Result<Released, OwnPagesError> {
    let mut entries = vec![0u8; (end - start) / PAGE * 8];
    pagemap
        .read_exact_at(&mut entries, (start / PAGE * 8) as u64)
        .map_err(OwnPagesError::Pagemap)?;
    let entries: Vec<u64> = entries
        .as_chunks::<8>()
        .0
        .iter()
        .map(|entry| u64::from_ne_bytes(*entry))
        .collect();
    let runs = file_page_runs(&entries);
    let mut released = Released {
        bytes: 0,
        private_pages: entries.len() - runs.iter().map(|run| run.len()).sum::<usize>(),
    };
    for run in runs {
        let (run_start, len) = (start + run.start * PAGE, run.len() * PAGE);
        // SAFETY: pages of the caller's file mapping, none of them a
        // private copy (checked above): dropping them loses nothing, and a
        // thread touching one faults the same bytes back in.
        unsafe { release(run_start, len) }?;
        released.bytes += len;
    }
    Ok(released)
}

/// # Safety
/// `start..start + len` must be mapped pages whose content the file backing
/// them gives back when they are faulted in again.
unsafe fn release(start: usize, len: usize) -> Result<(), OwnPagesError> {
    let Some(addr) = NonNull::new(start as *mut std::ffi::c_void) else {
        return Ok(());
    };
    // SAFETY: the caller's contract.
    unsafe { madvise(addr, len, MmapAdvise::MADV_DONTNEED) }.map_err(|source| OwnPagesError::Madvise {
        start,
        len,
        source,
    })
}

/// The executable's loaded segments that are not writable, as page ranges
/// of this process, rounded inwards (a page shared with a writable segment
/// is left alone).
fn read_only_segments() -> Result<Vec<(usize, usize)>, OwnPagesError> {
    // SAFETY: getauxval only reads the auxiliary vector the kernel gave.
    let (phdr, phnum, phent) = unsafe {
        (
            libc::getauxval(libc::AT_PHDR) as usize,
            libc::getauxval(libc::AT_PHNUM) as usize,
            libc::getauxval(libc::AT_PHENT) as usize,
        )
    };
    if phdr == 0 || phnum == 0 || phent != size_of::<libc::Elf64_Phdr>() {
        return Err(OwnPagesError::NoProgramHeaders);
    }
    // SAFETY: AT_PHDR is where the kernel mapped the executable's program
    // headers (AT_PHNUM of them, AT_PHENT bytes each, checked above); they
    // lie in its first loaded segment, mapped for the process's life and
    // never written.
    let headers = unsafe { std::slice::from_raw_parts(phdr as *const libc::Elf64_Phdr, phnum) };
    segments_of(headers, phdr).ok_or(OwnPagesError::NoProgramHeaders)
}

/// [`read_only_segments`] of `headers`, found in memory at `at`.
fn segments_of(headers: &[libc::Elf64_Phdr], at: usize) -> Option<Vec<(usize, usize)>> {
    // The load bias: where PT_PHDR says the headers are, against where they are.
    let own = headers.iter().find(|header| header.p_type == libc::PT_PHDR)?;
    let bias = at.checked_sub(usize::try_from(own.p_vaddr).ok()?)?;
    Some(
        headers
            .iter()
            .filter(|header| header.p_type == libc::PT_LOAD && header.p_flags & libc::PF_W == 0)
            .filter_map(|header| {
                let start = bias.checked_add(usize::try_from(header.p_vaddr).ok()?)?;
                let end = start.checked_add(usize::try_from(header.p_memsz).ok()?)?;
                let (start, end) = (start.next_multiple_of(PAGE), end / PAGE * PAGE);
                (start < end).then_some((start, end))
            })
            .collect(),
    )
}

/// The runs of pages (indices into `entries`, a pagemap entry per page) that
/// are not private copies: neither present nor swapped, or the file's.
fn file_page_runs(entries: &[u64]) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut run_start = None;
    for (index, &entry) in entries.iter().enumerate() {
        let private = entry & (PRESENT | SWAPPED) != 0 && entry & FILE_PAGE == 0;
        match (private, run_start) {
            (false, None) => run_start = Some(index),
            (true, Some(start)) => {
                runs.push(start..index);
                run_start = None;
            }
            _ => {}
        }
    }
    if let Some(start) = run_start {
        runs.push(start..entries.len());
    }
    runs
}

#[cfg(test)]
mod tests;
