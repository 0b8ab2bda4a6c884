use std::{io::Write as _, num::NonZeroUsize};

use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};

use super::*;

fn header(p_type: u32, p_flags: u32, p_vaddr: u64, p_memsz: u64) -> libc::Elf64_Phdr {
    libc::Elf64_Phdr {
        p_type,
        p_flags,
        p_offset: 0,
        p_vaddr,
        p_paddr: p_vaddr,
        p_filesz: p_memsz,
        p_memsz,
        p_align: 0x1000,
    }
}

#[test]
fn the_read_only_segments_are_found_at_the_load_bias_rounded_inwards() {
    // The daemon's own layout (lld): headers, read-only data, code, then the
    // writable segment holding RELRO.
    let headers = [
        header(libc::PT_PHDR, libc::PF_R, 0x40, 0x2a0),
        header(libc::PT_LOAD, libc::PF_R, 0, 0x2e_3474),
        header(libc::PT_LOAD, libc::PF_R | libc::PF_X, 0x2e_4480, 0x6f_6080),
        header(libc::PT_LOAD, libc::PF_R | libc::PF_W, 0x9d_b500, 0x2_fb00),
        header(libc::PT_GNU_RELRO, libc::PF_R, 0x9d_b500, 0x2_fb00),
    ];
    let bias = 0x5555_5555_4000;
    assert_eq!(
        segments_of(&headers, bias + 0x40),
        Some(vec![
            (bias, bias + 0x2e_3000),
            (bias + 0x2e_5000, bias + 0x9d_a000),
        ])
    );
    // Without PT_PHDR there is no telling where the executable is.
    assert_eq!(segments_of(&headers[1..], bias + 0x40), None);
    // Headers claimed below address 0 are not believed.
    assert_eq!(segments_of(&headers, 0x10), None);
}

#[test]
fn private_copies_split_the_runs_and_absent_pages_join_them() {
    let file = PRESENT | FILE_PAGE;
    let private = PRESENT;
    assert_eq!(file_page_runs(&[]), Vec::<std::ops::Range<usize>>::new());
    assert_eq!(file_page_runs(&[file, 0, file]), vec![0..3]);
    assert_eq!(
        file_page_runs(&[private, file, file, private, 0, private]),
        vec![1..3, 4..5]
    );
    assert_eq!(
        file_page_runs(&[private, private]),
        Vec::<std::ops::Range<usize>>::new()
    );
    // A private copy swapped out (or in migration) is still one; a file
    // page in migration is still the file's.
    assert_eq!(file_page_runs(&[file, SWAPPED, file]), vec![0..1, 2..3]);
    assert_eq!(file_page_runs(&[file, SWAPPED | FILE_PAGE, file]), vec![0..3]);
}

/// The kernel's own pagemap tells a private copy from the file's page: a
/// private file mapping with one page written keeps that page (and what was
/// written) and hands back the others.
#[test]
fn a_written_page_is_kept_and_the_files_pages_are_released() {
    const PAGES: usize = 8;
    let mut backing = tempfile_with(PAGES);
    backing.flush().unwrap();
    // SAFETY: a fresh private mapping of a file this test owns, unmapped
    // below; nothing else refers to it.
    let map = unsafe {
        mmap(
            None,
            NonZeroUsize::new(PAGES * PAGE).unwrap(),
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_PRIVATE,
            &backing,
            0,
        )
    }
    .unwrap();
    let start = map.as_ptr() as usize;
    let bytes = map.as_ptr().cast::<u8>();
    // SAFETY: within the mapping, which lives until the munmap below.
    let read = |page: usize| unsafe { bytes.add(page * PAGE + 1).read_volatile() };
    let touched: Vec<u8> = (0..PAGES).map(read).collect();
    assert_eq!(touched, (0..PAGES as u8).collect::<Vec<_>>());
    // SAFETY: as above; the write makes page 3 a private copy.
    unsafe { bytes.add(3 * PAGE + 1).write_volatile(0xee) };

    let pagemap = File::open("/proc/self/pagemap").unwrap();
    let present = || -> Vec<bool> {
        let mut entries = vec![0u8; PAGES * 8];
        pagemap
            .read_exact_at(&mut entries, (start / PAGE * 8) as u64)
            .unwrap();
        entries
            .as_chunks::<8>()
            .0
            .iter()
            .map(|entry| u64::from_ne_bytes(*entry) & PRESENT != 0)
            .collect()
    };
    assert_eq!(present(), vec![true; PAGES]);

    // SAFETY: the private file mapping made above, written only by this
    // test, before this call.
    let released = unsafe { release_file_pages(&pagemap, start, start + PAGES * PAGE) }.unwrap();
    assert_eq!(
        released,
        Released {
            bytes: (PAGES - 1) * PAGE,
            private_pages: 1
        }
    );
    let mut expected = vec![false; PAGES];
    expected[3] = true;
    assert_eq!(present(), expected, "only the written page is still resident");
    let read_back: Vec<u8> = (0..PAGES).map(read).collect();
    let mut wanted: Vec<u8> = (0..PAGES as u8).collect();
    wanted[3] = 0xee;
    assert_eq!(
        read_back, wanted,
        "the file's bytes came back, the written one stayed"
    );
    // SAFETY: the mapping made above; nothing refers to it any more.
    unsafe { munmap(map, PAGES * PAGE) }.unwrap();
}

#[test]
fn this_executables_read_only_segments_are_found_and_no_writable_page() {
    let segments = read_only_segments().unwrap();
    assert!(!segments.is_empty());
    // SAFETY: as in read_only_segments: the kernel's program headers.
    let (at, headers) = unsafe {
        let at = libc::getauxval(libc::AT_PHDR) as usize;
        let count = libc::getauxval(libc::AT_PHNUM) as usize;
        (
            at,
            std::slice::from_raw_parts(at as *const libc::Elf64_Phdr, count),
        )
    };
    let phdr = headers
        .iter()
        .find(|header| header.p_type == libc::PT_PHDR)
        .unwrap();
    let bias = at - phdr.p_vaddr as usize;
    let writable: Vec<(usize, usize)> = headers
        .iter()
        .filter(|header| {
            header.p_type == libc::PT_GNU_RELRO
                || (header.p_type == libc::PT_LOAD && header.p_flags & libc::PF_W != 0)
        })
        .map(|header| {
            (
                bias + header.p_vaddr as usize,
                bias + (header.p_vaddr + header.p_memsz) as usize,
            )
        })
        .collect();
    assert!(!writable.is_empty());
    for &(start, end) in &segments {
        for &(w_start, w_end) in &writable {
            assert!(
                end <= w_start || w_end <= start,
                "{start:#x}..{end:#x} overlaps {w_start:#x}..{w_end:#x}"
            );
        }
    }
    // This very function's code lies in one of them.
    let here = this_executables_read_only_segments_are_found_and_no_writable_page as *const () as usize;
    assert!(
        segments.iter().any(|&(start, end)| (start..end).contains(&here)),
        "{here:#x} outside {segments:x?}"
    );
}

/// A file of `pages` pages, page `n` filled with byte `n`.
fn tempfile_with(pages: usize) -> File {
    let path = std::env::temp_dir().join(format!("profilerd-own-pages-{}", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    for page in 0..pages {
        file.write_all(&[page as u8; PAGE]).unwrap();
    }
    file
}
