//! Handing back the pages of the files the worker has parsed.
//!
//! blazesym maps each file it reads (shared, read-only) and keeps it mapped
//! while the file is cached, so every page a parse touched stays in the
//! worker's resident set. A parse touches far more than it reads: the kernel
//! maps a cached file's pages 64 KiB around each fault (fault-around, which
//! `MADV_RANDOM` does not turn off), and reading one unit header every few
//! dozen KiB of `.debug_info` makes all of it resident. Symbolizing one
//! Python process (libpython, 9 MiB of `.debug_info`) left 10 MiB of
//! libpython in the worker, and its peak RSS went from 7 to 18-25 MB as more
//! files were parsed: what `top` and a memory limit see, though it is the
//! page cache.
//!
//! After a request that left more than [`RELEASE_ABOVE_BYTES`] of new
//! file pages, [`Release`] unmaps the pages of the parsed files from the
//! worker (`MADV_DONTNEED`). The mappings stay; the page cache keeps the
//! data; the next read of a released file faults its pages back in, 2.6 us
//! per 64 KiB on the 2-CPU VM (0.9 ms for all of libpython's 22 MB, and
//! 0.7 ms to release them). So a request that touched little keeps its
//! pages: releasing after every request would make every later lookup in a
//! large file pay for its pages again. The resident set then holds about one
//! large parse at a time, not every file ever parsed.

use std::{ffi::c_void, fs::File, io::Read as _, os::unix::fs::FileExt as _, ptr::NonNull};

use nix::sys::mman::{MmapAdvise, madvise};

/// New file-backed pages that make a release worth its cost (and the most
/// that parsed files may add to the worker's resident set beyond the
/// request in progress).
const RELEASE_ABOVE_BYTES: u64 = 1 << 20;

/// When to release: once the worker's file-backed resident pages
/// (`/proc/self/statm`'s third field) have grown enough since the last
/// release.
pub struct Release {
    /// Held open: a read at offset 0 is generated afresh.
    statm: Option<File>,
    page_bytes: u64,
    /// File-backed resident pages right after the last release.
    after_last: Option<u64>,
}

impl Release {
    pub fn new() -> Self {
        let page_bytes = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|bytes| u64::try_from(bytes).ok())
            .filter(|&bytes| bytes > 0)
            .unwrap_or(4096);
        Self {
            statm: File::open("/proc/self/statm").ok(),
            page_bytes,
            after_last: None,
        }
    }

    /// After a request in which blazesym read files: releases their pages if
    /// they grew past the threshold (always, if statm cannot be read).
    ///
    /// # Safety
    /// As [`release_parsed_files`]: no other thread of this process maps or
    /// unmaps memory meanwhile.
    pub unsafe fn after_parse(&mut self) {
        if !due(self.file_pages(), self.after_last, self.page_bytes) {
            return;
        }
        // SAFETY: the caller's contract.
        unsafe { release_parsed_files() };
        self.after_last = self.file_pages();
    }

    fn file_pages(&self) -> Option<u64> {
        let mut bytes = [0u8; 128];
        let read = self.statm.as_ref()?.read_at(&mut bytes, 0).ok()?;
        std::str::from_utf8(&bytes[..read])
            .ok()?
            .split_whitespace()
            .nth(2)?
            .parse()
            .ok()
    }
}

/// Whether file-backed pages (`now`, and `last` after the last release, in
/// pages of `page_bytes`) grew enough for a release; unknown: release.
fn due(now: Option<u64>, last: Option<u64>, page_bytes: u64) -> bool {
    match (now, last) {
        (Some(now), Some(last)) => now.saturating_sub(last).saturating_mul(page_bytes) > RELEASE_ABOVE_BYTES,
        _ => true,
    }
}

/// /proc/self/maps of the worker: its libraries, at most 32 cached files and
/// blazesym's debug files. Bounded all the same.
const MAX_MAPS_BYTES: u64 = 1 << 20;

/// Drops the resident pages of every shared read-only file mapping of this
/// process: only the files blazesym maps to parse are mapped so here (code
/// and data of the worker itself are private mappings). Failures leave pages
/// resident, as before: they cost memory, never a symbol.
///
/// # Safety
/// No other thread of this process may map or unmap memory while it runs:
/// the ranges are read from /proc/self/maps before the calls, and a range
/// unmapped and reused for private memory meanwhile would lose its bytes.
/// The worker process is single-threaded.
unsafe fn release_parsed_files() {
    let mut maps = Vec::new();
    let read =
        File::open("/proc/self/maps").and_then(|file| file.take(MAX_MAPS_BYTES).read_to_end(&mut maps));
    if read.is_err() {
        return;
    }
    // Paths are any bytes (the kernel escapes only newlines); a last line
    // cut by the bound is not trusted.
    let whole = maps
        .iter()
        .rposition(|&byte| byte == b'\n')
        .map_or(0, |end| end + 1);
    for (start, len) in String::from_utf8_lossy(&maps[..whole])
        .lines()
        .filter_map(parsed_file_mapping)
    {
        // SAFETY: a shared mapping of a file, as the kernel listed it, and
        // (the caller's contract) still the same mapping.
        unsafe { release(start, len) };
    }
}

/// (start, length) of a `/proc/self/maps` line naming a shared, read-only
/// mapping of a file (its path starts with `/`, a memfd's with `/memfd:`).
fn parsed_file_mapping(line: &str) -> Option<(usize, usize)> {
    let mut fields = line.split_whitespace();
    let (range, perms) = (fields.next()?, fields.next()?);
    let path = fields.nth(3)?;
    if !matches!(perms.as_bytes(), [b'r', b'-', _, b's']) || !path.starts_with('/') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    Some((start, end.checked_sub(start).filter(|&len| len > 0)?))
}

/// Unmaps the pages of `start..start + len` from this process.
///
/// # Safety
/// The range must be a shared mapping of a file (or memfd) of this process.
unsafe fn release(start: usize, len: usize) {
    let Some(addr) = NonNull::new(start as *mut c_void) else {
        return;
    };
    // SAFETY: the caller's shared file mapping. On a shared mapping,
    // MADV_DONTNEED never discards data: there are no private copies, the
    // bytes live in the file's page cache (a memfd's in its shmem), and a
    // later read of any address in it faults the page back in, as the
    // mapping's first read did. Views into it (blazesym's cached slices of
    // the file) stay valid; they read the file as it is, as before.
    let _ = unsafe { madvise(addr, len, MmapAdvise::MADV_DONTNEED) };
}

#[cfg(test)]
mod tests {
    use std::{fs::OpenOptions, io::Write as _, os::fd::AsFd as _};

    use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};

    use super::*;

    #[test]
    fn only_shared_read_only_file_mappings_are_released() {
        let line =
            |perms: &str, path: &str| format!("7f0000000000-7f0000003000 {perms} 00000000 fe:00 42 {path}");
        assert_eq!(
            parsed_file_mapping(&line("r--s", "/usr/lib/libpython3.11.so.1.0")),
            Some((0x7f00_0000_0000, 0x3000))
        );
        assert!(parsed_file_mapping(&line("r--s", "/memfd:sealed-1 (deleted)")).is_some());
        for (perms, path) in [
            ("r--p", "/usr/lib/libc.so.6"),
            ("r-xp", "/usr/bin/profilerd"),
            ("rw-s", "/dev/shm/x"),
            ("r--s", "anon_inode:bpf-map"),
        ] {
            assert_eq!(parsed_file_mapping(&line(perms, path)), None, "{perms} {path}");
        }
        assert_eq!(
            parsed_file_mapping("7f00-7f00 r--s 0 fe:00 42 /a"),
            None,
            "empty range"
        );
        assert_eq!(parsed_file_mapping("7f00-7f10 r--s 0 fe:00 42"), None, "no path");
        assert_eq!(parsed_file_mapping("garbage"), None);
    }

    #[test]
    fn releases_once_file_pages_grew_past_the_threshold() {
        let page = 4096;
        let threshold = RELEASE_ABOVE_BYTES / page;
        assert!(due(Some(100), None, page), "the first parse");
        assert!(due(None, Some(100), page), "statm unreadable");
        assert!(!due(Some(100 + threshold), Some(100), page));
        assert!(due(Some(101 + threshold), Some(100), page));
        assert!(
            !due(Some(90), Some(100), page),
            "fewer pages than after the last release"
        );
        assert!(
            Release::new().file_pages().is_some_and(|pages| pages > 0),
            "statm read"
        );
    }

    /// The real kernel: a touched shared mapping is resident, released it is
    /// not, and it still reads the file's bytes.
    #[test]
    fn released_pages_leave_the_resident_set_and_read_back_the_same() {
        const LEN: usize = 1 << 20;
        let path = std::env::temp_dir().join(format!("profilerd-resident-{}", std::process::id()));
        let mut file = OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(&path)
            .expect("a temporary file");
        std::fs::remove_file(&path).expect("unlinked: the mapping keeps it");
        let bytes: Vec<u8> = (0..LEN).map(|i| (i * 7 % 251) as u8).collect();
        file.write_all(&bytes).expect("written");
        // SAFETY: a fresh mapping of a file only this test holds; unmapped below.
        let map = unsafe {
            mmap(
                None,
                LEN.try_into().expect("non-zero"),
                ProtFlags::PROT_READ,
                MapFlags::MAP_SHARED,
                file.as_fd(),
                0,
            )
        }
        .expect("mapped");
        // SAFETY: LEN readable bytes, mapped above, never written.
        let view = unsafe { std::slice::from_raw_parts(map.as_ptr() as *const u8, LEN) };
        let resident = || {
            let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
            let start = format!("{:x}-", map.as_ptr() as usize);
            let mut lines = smaps.lines().skip_while(|line| !line.starts_with(&start));
            lines
                .find_map(|line| line.strip_prefix("Rss:"))
                .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .expect("the mapping's Rss")
        };
        assert_eq!(view, &bytes[..]);
        assert!(resident() >= 1024, "touched: {} KiB resident", resident());
        // The kernel lists it as the worker would find it.
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let listed = maps
            .lines()
            .filter_map(parsed_file_mapping)
            .find(|&(start, _)| start == map.as_ptr() as usize);
        assert_eq!(listed, Some((map.as_ptr() as usize, LEN)));
        // Only this test's mapping: the test harness runs other tests on
        // other threads, so the whole-process release would break its contract.
        // SAFETY: the shared file mapping made above, unmapped only below.
        unsafe { release(map.as_ptr() as usize, LEN) };
        assert_eq!(resident(), 0, "released");
        assert_eq!(view, &bytes[..], "read back from the page cache");
        // SAFETY: mapped above; `view` is not used after this.
        unsafe { munmap(map, LEN) }.expect("unmapped");
    }
}
