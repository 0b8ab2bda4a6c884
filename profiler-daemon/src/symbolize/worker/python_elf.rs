//! Whether a file is a CPython interpreter (the `python3.x` executable,
//! `libpython3.x.so`, or a program embedding it): it exports `_PyRuntime`
//! and the eval loop. Read in the worker with the unwind table, from the
//! same hostile file: the few entries of `.gnu.hash` and `.dynsym` a lookup
//! of three names touches (the whole dynamic symbol table only when there
//! is no usable hash) and, for the version, 4 bytes of `Py_Version` or the
//! dynamic section's `DT_SONAME`.

use object::{
    LittleEndian as Le, ReadRef, SectionIndex, StringTable,
    elf::{self, FileHeader64},
    read::elf::{Dyn as _, FileHeader, SectionHeader as _, SectionTable, Sym as _},
};

use super::{
    gnu_hash::{HashedSymbols, Lookup},
    protocol::{LoadSegment, PythonSymbols},
};

/// Without a usable `.gnu.hash`, a dynamic symbol table larger than this is
/// not searched (libpython's is about 100 KiB).
const MAX_DYNSYM_BYTES: u64 = 16 << 20;
/// Dynamic entries read in search of DT_SONAME.
const MAX_DYNAMIC_ENTRIES: usize = 4096;

type Header = FileHeader64<Le>;

/// The file's CPython symbols, if it has `_PyRuntime` and the eval loop.
pub(super) fn python_symbols<'d, R: ReadRef<'d>>(
    header: &Header,
    data: R,
    segments: &[LoadSegment],
) -> Option<PythonSymbols> {
    let endian = Le;
    let sections: SectionTable<'d, Header, R> = header.sections(endian, data).ok()?;
    let (index, dynsym) = sections
        .iter()
        .enumerate()
        .find(|(_, section)| section.sh_type(endian) == elf::SHT_DYNSYM)?;
    let strings = sections
        .strings(endian, data, SectionIndex(dynsym.sh_link(endian) as usize))
        .ok()?;
    let exports = match hashed(&sections, index, dynsym) {
        // Unusable hash: search the table as if there were none.
        Some(table) => through_hash(&table, data, strings).or_else(|| scanned(&sections, dynsym, data))?,
        None => scanned(&sections, dynsym, data)?,
    };
    let mut found = exports.symbols;
    if found.runtime == 0 || found.eval_start == 0 || found.eval_size == 0 {
        return None;
    }
    found.version_hex = exports
        .version_at
        .and_then(|vaddr| file_offset(vaddr, segments))
        .and_then(|offset| data.read_bytes_at(offset, 4).ok())
        .and_then(|bytes| bytes.try_into().ok())
        .map_or(0, u32::from_le_bytes);
    if found.version_hex == 0 {
        found.version_hex = soname(&sections, data).as_deref().map_or(0, version_of_soname);
    }
    Some(found)
}

/// What the dynamic symbols say (zeros for what they lack).
#[derive(Default)]
struct Exports {
    symbols: PythonSymbols,
    /// Where `Py_Version` (3.11+) lies, when at least 4 bytes long.
    version_at: Option<u64>,
}

/// The `.gnu.hash` indexing the dynamic symbols at `dynsym_index`, if any.
fn hashed<'d, R: ReadRef<'d>>(
    sections: &SectionTable<'d, Header, R>,
    dynsym_index: usize,
    dynsym: &<Header as FileHeader>::SectionHeader,
) -> Option<HashedSymbols> {
    let endian = Le;
    let hash = sections.iter().find(|section| {
        section.sh_type(endian) == elf::SHT_GNU_HASH && section.sh_link(endian) as usize == dynsym_index
    })?;
    Some(HashedSymbols {
        hash: (hash.sh_offset(endian), hash.sh_size(endian)),
        symbols: (dynsym.sh_offset(endian), dynsym.sh_size(endian)),
    })
}

/// The three names looked up through the hash; None if it is unusable.
fn through_hash<'d, R: ReadRef<'d>>(
    table: &HashedSymbols,
    data: R,
    strings: StringTable<'d, R>,
) -> Option<Exports> {
    let mut exports = Exports::default();
    // Most files export no `_PyRuntime`: one bloom word says so.
    match table.find(data, strings, b"_PyRuntime") {
        Lookup::Found { value, .. } => exports.symbols.runtime = value,
        Lookup::Absent => return Some(exports),
        Lookup::Unusable => return None,
    }
    match table.find(data, strings, b"_PyEval_EvalFrameDefault") {
        Lookup::Found { value, size } => {
            exports.symbols.eval_start = value;
            exports.symbols.eval_size = size;
        }
        Lookup::Absent => return Some(exports),
        Lookup::Unusable => return None,
    }
    match table.find(data, strings, b"Py_Version") {
        Lookup::Found { value, size } if size >= 4 => exports.version_at = Some(value),
        Lookup::Found { .. } | Lookup::Absent => {}
        Lookup::Unusable => return None,
    }
    Some(exports)
}

/// The three names found by reading every dynamic symbol: for files
/// without a usable `.gnu.hash`.
fn scanned<'d, R: ReadRef<'d>>(
    sections: &SectionTable<'d, Header, R>,
    dynsym: &<Header as FileHeader>::SectionHeader,
    data: R,
) -> Option<Exports> {
    let endian = Le;
    if dynsym.sh_size(endian) > MAX_DYNSYM_BYTES {
        return None;
    }
    let symbols = sections.symbols(endian, data, elf::SHT_DYNSYM).ok()?;
    let strings = symbols.strings();
    let mut exports = Exports::default();
    for symbol in symbols.iter() {
        if symbol.st_shndx(endian) == elf::SHN_UNDEF {
            continue;
        }
        let Ok(name) = symbol.name(endian, strings) else {
            continue;
        };
        let (value, size) = (symbol.st_value(endian), symbol.st_size(endian));
        match name {
            b"_PyRuntime" => exports.symbols.runtime = value,
            b"_PyEval_EvalFrameDefault" => {
                exports.symbols.eval_start = value;
                exports.symbols.eval_size = size;
            }
            b"Py_Version" if size >= 4 => exports.version_at = Some(value),
            _ => {}
        }
    }
    Some(exports)
}

/// The file offset of a virtual address, through the segment holding it.
pub(super) fn file_offset(vaddr: u64, segments: &[LoadSegment]) -> Option<u64> {
    segments.iter().find_map(|segment| {
        let within = vaddr.checked_sub(segment.vaddr)?;
        (within.checked_add(4)? <= segment.file_size).then(|| segment.file_offset.checked_add(within))?
    })
}

fn soname<'d, R: ReadRef<'d>>(sections: &SectionTable<'d, Header, R>, data: R) -> Option<Vec<u8>> {
    let endian = Le;
    let (entries, link) = sections.dynamic(endian, data).ok()??;
    let strings = sections.strings(endian, data, link).ok()?;
    let entry = entries
        .iter()
        .take(MAX_DYNAMIC_ENTRIES)
        .find(|entry| entry.d_tag(endian) == elf::DT_SONAME)?;
    let name = strings.get(u32::try_from(entry.d_val(endian)).ok()?).ok()?;
    Some(name.iter().take(64).copied().collect())
}

/// `libpython3.9.so.1.0` -> 0x030900f0 (the release's serial unknown: a
/// final release is assumed, which no layout depends on).
fn version_of_soname(soname: &[u8]) -> u32 {
    let Some(rest) = soname.strip_prefix(b"libpython3.") else {
        return 0;
    };
    let digits: Vec<u8> = rest
        .iter()
        .copied()
        .take_while(u8::is_ascii_digit)
        .take(3)
        .collect();
    match std::str::from_utf8(&digits)
        .ok()
        .and_then(|text| text.parse::<u32>().ok())
    {
        Some(minor) if minor < 256 => (3 << 24) | (minor << 16) | 0xf0,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sonames_give_versions() {
        assert_eq!(version_of_soname(b"libpython3.9.so.1.0"), 0x0309_00f0);
        assert_eq!(version_of_soname(b"libpython3.10.so.1.0"), 0x030a_00f0);
        assert_eq!(version_of_soname(b"libpython3.so"), 0);
        assert_eq!(version_of_soname(b"libc.so.6"), 0);
        assert_eq!(version_of_soname(b"libpython3.999.so"), 0);
    }

    #[test]
    fn offsets_stay_inside_their_segment() {
        let segments = [LoadSegment {
            file_offset: 0x1000,
            vaddr: 0x40_1000,
            file_size: 0x100,
        }];
        assert_eq!(file_offset(0x40_1010, &segments), Some(0x1010));
        assert_eq!(file_offset(0x40_10fd, &segments), None);
        assert_eq!(file_offset(0x40_0fff, &segments), None);
    }
}
