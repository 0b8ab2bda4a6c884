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
//! After a request, [`release_parsed_files`] unmaps those pages from the
//! worker (`MADV_DONTNEED`). The mapping stays; the page cache keeps the
//! data; the next read of the same file faults its pages back in (about a
//! microsecond per 64 KiB here). The resident set then holds one request's
//! files at a time, not every file ever parsed.

use std::{ffi::c_void, io::Read as _, ptr::NonNull};

use nix::sys::mman::{MmapAdvise, madvise};

/// /proc/self/maps of the worker: its libraries, at most 32 cached files and
/// blazesym's debug files. Bounded all the same.
const MAX_MAPS_BYTES: u64 = 1 << 20;

/// Drops the resident pages of every shared read-only file mapping of this
/// process: only the files blazesym maps to parse are mapped so here (code
/// and data of the worker itself are private mappings). Returns how many
/// mappings it released. Failures leave pages resident, as before: they cost
/// memory, never a symbol.
pub fn release_parsed_files() -> usize {
    let mut maps = String::new();
    let read = std::fs::File::open("/proc/self/maps")
        .and_then(|file| file.take(MAX_MAPS_BYTES).read_to_string(&mut maps));
    if read.is_err() {
        return 0;
    }
    maps.lines()
        .filter_map(parsed_file_mapping)
        .filter(|&(start, len)| release(start, len))
        .count()
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

fn release(start: usize, len: usize) -> bool {
    let Some(addr) = NonNull::new(start as *mut c_void) else {
        return false;
    };
    // SAFETY: a shared, read-only file mapping of this process, as the
    // kernel lists it. MADV_DONTNEED only unmaps its pages: on a shared file
    // mapping no data is lost (there are no private copies, and nothing can
    // have been written through a read-only mapping), and a later read of any
    // address in it faults the page cache's page back in. References into
    // it (blazesym's cached views of the file) stay valid and read the same
    // bytes. The worker is single-threaded, and no parse runs during this call.
    unsafe { madvise(addr, len, MmapAdvise::MADV_DONTNEED) }.is_ok()
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
        assert!(release_parsed_files() >= 1);
        assert_eq!(resident(), 0, "released");
        assert_eq!(view, &bytes[..], "read back from the page cache");
        // SAFETY: mapped above; `view` is not used after this.
        unsafe { munmap(map, LEN) }.expect("unmapped");
    }
}
