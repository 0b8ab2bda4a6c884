//! Where a file's allocator entry points are (malloc, free and their
//! family, jemalloc's prefixed and extended ones), for the allocation
//! probes: file offsets of the symbols, from `.dynsym` and `.symtab`, and
//! whether the file is a Go program (its heap does not go through them).
//! Read in the worker: the file is the traced process's owner's.

use std::os::fd::OwnedFd;

use object::{
    LittleEndian as Le, ReadCache, ReadRef,
    elf::{self, FileHeader64},
    read::elf::{FileHeader as _, SectionHeader as _, SectionTable, Sym as _},
};

use super::{
    positional::PositionalFile,
    protocol::{AllocatorSymbol, AllocatorSymbols, LoadSegment},
    python_elf::file_offset,
    unwind_elf::load_segments,
};
use crate::collect::allocations::is_allocator_name;

/// Symbol tables larger than this are not searched (libc's `.dynsym` is
/// about 60 KiB; a large program's `.symtab` some MiB).
const MAX_SYMBOL_TABLE_BYTES: u64 = 64 << 20;

/// The file's allocator symbols (defined functions only, each name once).
pub(super) fn allocator_symbols(fd: &OwnedFd) -> Result<AllocatorSymbols, String> {
    let file = PositionalFile::dup(fd).map_err(|err| format!("dup: {err}"))?;
    let cache = ReadCache::new(file);
    let header = FileHeader64::<Le>::parse(&cache).map_err(|err| format!("not a 64-bit ELF file: {err}"))?;
    let endian = header
        .endian()
        .map_err(|err| format!("not a little-endian ELF file: {err}"))?;
    if header.e_machine(endian) != elf::EM_X86_64 {
        return Err("not an x86-64 file".into());
    }
    let (segments, _) = load_segments(header, &cache)?;
    let sections = header
        .sections(endian, &cache)
        .map_err(|err| format!("section headers: {err}"))?;
    let mut found = AllocatorSymbols {
        go: is_go(&sections),
        symbols: Vec::new(),
    };
    for kind in [elf::SHT_DYNSYM, elf::SHT_SYMTAB] {
        collect(&sections, &cache, kind, &segments, &mut found.symbols);
    }
    Ok(found)
}

/// Adds the allocator functions of the symbol table of type `kind`.
fn collect<'d, R: ReadRef<'d>>(
    sections: &SectionTable<'d, FileHeader64<Le>, R>,
    data: R,
    kind: elf::SectionType,
    segments: &[LoadSegment],
    found: &mut Vec<AllocatorSymbol>,
) {
    let endian = Le;
    let Some((_, table)) = sections
        .iter()
        .enumerate()
        .find(|(_, section)| section.sh_type(endian) == kind)
    else {
        return;
    };
    if table.sh_size(endian) > MAX_SYMBOL_TABLE_BYTES {
        return;
    }
    let Ok(symbols) = sections.symbols(endian, data, kind) else {
        return;
    };
    let strings = symbols.strings();
    for symbol in symbols.iter() {
        if symbol.st_shndx(endian) == elf::SHN_UNDEF || symbol.st_type() != elf::STT_FUNC {
            continue;
        }
        let Ok(name) = symbol.name(endian, strings) else {
            continue;
        };
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        if !is_allocator_name(name) || found.iter().any(|known| known.name == name) {
            continue;
        }
        if let Some(offset) = file_offset(symbol.st_value(endian), segments) {
            found.push(AllocatorSymbol {
                name: name.to_owned(),
                file_offset: offset,
            });
        }
    }
}

/// A Go program: it has Go's build information section.
fn is_go<'d, R: ReadRef<'d>>(sections: &SectionTable<'d, FileHeader64<Le>, R>) -> bool {
    sections.iter().any(|section| {
        sections
            .section_name(Le, section)
            .is_ok_and(|name| name == b".go.buildinfo" || name == b".gopclntab")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_has_no_go_and_libc_has_malloc() {
        let libc = std::fs::read_to_string("/proc/self/maps")
            .expect("own maps")
            .lines()
            .filter_map(|line| line.split_whitespace().nth(5).map(str::to_owned))
            .find(|path| path.contains("/libc.so"))
            .expect("libc is mapped");
        let fd = OwnedFd::from(std::fs::File::open(&libc).expect("libc opens"));
        let found = allocator_symbols(&fd).expect("libc parses");
        assert!(!found.go);
        let names: Vec<&str> = found.symbols.iter().map(|symbol| symbol.name.as_str()).collect();
        for name in [
            "malloc",
            "calloc",
            "realloc",
            "free",
            "posix_memalign",
            "memalign",
            "aligned_alloc",
        ] {
            assert!(names.contains(&name), "{name} not among {names:?}");
        }
    }
}
