//! Where a file's CFI is: its own `.eh_frame` and `.debug_frame`, then the
//! same sections of the system debug file with its build id. All of them
//! contribute, earlier ones winning where FDEs overlap: a binary built
//! without unwind tables but with `-g` has the C runtime's FDEs in
//! `.eh_frame` and its own only in `.debug_frame`.
//!
//! Read through read(2) (a ReadCache), never mapped: a file truncated
//! meanwhile is an error, not a SIGBUS. Only headers and these sections are
//! read, so a large binary costs little more than its CFI.

use std::{
    borrow::Cow,
    io::Read as _,
    ops::Range,
    os::{fd::OwnedFd, unix::fs::OpenOptionsExt},
    time::Instant,
};

use gimli::{BaseAddresses, DebugFrame, EhFrame, LittleEndian};
use object::{
    LittleEndian as Le, ReadCache,
    elf::{self, FileHeader64},
    read::elf::{FileHeader as _, ProgramHeader as _, SectionHeader as _, SectionTable},
};

use super::{
    debug_file::system_debug_file,
    positional::PositionalFile,
    protocol::{LoadSegment, MAX_BUILD_ID_BYTES, MAX_LOAD_SEGMENTS, PythonSymbols, UnwindTable},
    python_elf,
    unwind_table::{Compiled, Compiler, Limits},
};

/// CFI sections larger than this (after decompression) are refused: real
/// ones are a few MB (libLLVM's `.eh_frame` is about 6 MB).
const MAX_CFI_SECTION_BYTES: u64 = 128 << 20;
/// Note segments larger than this are not searched for a build id.
const MAX_NOTE_SEGMENT_BYTES: u64 = 64 << 10;

type Cache = ReadCache<PositionalFile>;
type Header = FileHeader64<Le>;

/// The file's unwind table and load segments, and its build id.
pub(super) fn unwind_table(fd: &OwnedFd) -> Result<(UnwindTable, Vec<u8>), String> {
    let started = Instant::now();
    let file = PositionalFile::dup(fd).map_err(|err| format!("dup: {err}"))?;
    let cache = ReadCache::new(file);
    let header = Header::parse(&cache).map_err(|err| format!("not a 64-bit ELF file: {err}"))?;
    let endian = header
        .endian()
        .map_err(|err| format!("not a little-endian ELF file: {err}"))?;
    if header.e_machine(endian) != elf::EM_X86_64 {
        return Err("not an x86-64 file".into());
    }
    let (segments, code) = load_segments(header, &cache)?;
    let python = python_symbols(fd, &segments);
    let build_id = build_id(header, &cache);
    let mut compiler = Compiler::new(&code, Limits::FILE);
    add_sections(&mut compiler, header, &cache, Origin::File)?;
    // What was read of the file is no longer needed: the rows are copied.
    drop(cache);
    if let Some(path) = system_debug_file(&build_id) {
        let debug_file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|err| format!("debug file {}: {err}", path.display()))?;
        let debug_cache = ReadCache::new(PositionalFile::new(debug_file));
        let debug_header =
            Header::parse(&debug_cache).map_err(|err| format!("debug file {}: {err}", path.display()))?;
        add_sections(&mut compiler, debug_header, &debug_cache, Origin::DebugFile)?;
    }
    let Compiled {
        rows,
        fdes,
        fdes_skipped,
        rows_before_merge,
        unsupported_rows,
        sources,
    } = compiler.finish().map_err(|err| err.to_string())?;
    let table = UnwindTable {
        rows: UnwindTable::encode_rows(&rows),
        fdes,
        fdes_skipped,
        rows_before_merge,
        unsupported_rows,
        source: sources.join("+"),
        compile_ns: u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX),
        segments,
        python,
    };
    Ok((table, build_id))
}

/// Whether the file is a CPython interpreter, read through a cache of its
/// own, dropped before the table is compiled: a file without a usable
/// `.gnu.hash` has every dynamic symbol's name read (node's 74,000 cached
/// are 9.6 MB), which is not held through the compile. A failure here costs
/// the file its Python frames, never its table.
fn python_symbols(fd: &OwnedFd, segments: &[LoadSegment]) -> Option<PythonSymbols> {
    let cache = ReadCache::new(PositionalFile::dup(fd).ok()?);
    let header = Header::parse(&cache).ok()?;
    python_elf::python_symbols(header, &cache, segments)
}

/// The PT_LOAD segments (for the daemon's bias), and the address ranges of
/// the executable ones (the only code an FDE may describe).
pub(super) fn load_segments(
    header: &Header,
    cache: &Cache,
) -> Result<(Vec<LoadSegment>, Vec<Range<u64>>), String> {
    let endian = Le;
    let headers = header
        .program_headers(endian, cache)
        .map_err(|err| format!("program headers: {err}"))?;
    let mut segments = Vec::new();
    let mut code = Vec::new();
    for segment in headers
        .iter()
        .filter(|segment| segment.p_type(endian) == elf::PT_LOAD)
    {
        if segments.len() == MAX_LOAD_SEGMENTS {
            return Err(format!("more than {MAX_LOAD_SEGMENTS} load segments"));
        }
        let vaddr = segment.p_vaddr(endian);
        segments.push(LoadSegment {
            file_offset: segment.p_offset(endian),
            vaddr,
            file_size: segment.p_filesz(endian),
        });
        if segment.p_flags(endian).contains(elf::PF_X) {
            code.push(vaddr..vaddr.saturating_add(segment.p_memsz(endian)));
        }
    }
    Ok((segments, code))
}

/// The GNU build id, from the note segments; empty if none.
fn build_id(header: &Header, cache: &Cache) -> Vec<u8> {
    let endian = Le;
    let Ok(headers) = header.program_headers(endian, cache) else {
        return Vec::new();
    };
    for segment in headers {
        if segment.p_type(endian) != elf::PT_NOTE || segment.p_filesz(endian) > MAX_NOTE_SEGMENT_BYTES {
            continue;
        }
        let Ok(Some(mut notes)) = segment.notes(endian, cache) else {
            continue;
        };
        while let Ok(Some(note)) = notes.next() {
            if note.name() == elf::ELF_NOTE_GNU
                && note.n_type(endian) == elf::NT_GNU_BUILD_ID
                && note.desc().len() <= MAX_BUILD_ID_BYTES
            {
                return note.desc().to_vec();
            }
        }
    }
    Vec::new()
}

#[derive(Clone, Copy)]
enum Origin {
    File,
    DebugFile,
}

fn add_sections(
    compiler: &mut Compiler<'_>,
    header: &Header,
    cache: &Cache,
    origin: Origin,
) -> Result<(), String> {
    let endian = Le;
    let sections = header
        .sections(endian, cache)
        .map_err(|err| format!("section headers: {err}"))?;
    let address_of = |name: &[u8]| {
        sections
            .section_by_name(endian, name)
            .map(|(_, section)| section.sh_addr(endian))
    };
    let (eh_frame, debug_frame) = match origin {
        Origin::File => (".eh_frame", ".debug_frame"),
        Origin::DebugFile => ("debug file .eh_frame", "debug file .debug_frame"),
    };
    if let Some((address, data)) = section_data(&sections, cache, ".eh_frame")? {
        let mut section = EhFrame::new(&data, LittleEndian);
        section.set_address_size(8);
        let mut bases = BaseAddresses::default().set_eh_frame(address);
        if let Some(text) = address_of(b".text") {
            bases = bases.set_text(text);
        }
        if let Some(got) = address_of(b".got") {
            bases = bases.set_got(got);
        }
        compiler
            .add(&section, &bases, eh_frame)
            .map_err(|err| err.to_string())?;
    }
    if let Some((_, data)) = section_data(&sections, cache, ".debug_frame")? {
        let mut section = DebugFrame::new(&data, LittleEndian);
        section.set_address_size(8);
        compiler
            .add(&section, &BaseAddresses::default(), debug_frame)
            .map_err(|err| err.to_string())?;
    }
    Ok(())
}

/// A section's address and contents (decompressed).
type SectionData<'d> = (u64, Cow<'d, [u8]>);

/// A section's address and contents, if it has any.
fn section_data<'d>(
    sections: &SectionTable<'d, Header, &'d Cache>,
    cache: &'d Cache,
    name: &str,
) -> Result<Option<SectionData<'d>>, String> {
    let endian = Le;
    let Some((_, section)) = sections.section_by_name(endian, name.as_bytes()) else {
        return Ok(None);
    };
    if section.sh_type(endian) == elf::SHT_NOBITS || section.sh_size(endian) == 0 {
        return Ok(None); // A debug file's copy of an allocated section.
    }
    if section.sh_size(endian) > MAX_CFI_SECTION_BYTES {
        return Err(format!("{name} is larger than {MAX_CFI_SECTION_BYTES} bytes"));
    }
    let address = section.sh_addr(endian);
    let compression = section
        .compression(endian, cache)
        .map_err(|err| format!("{name}: {err}"))?;
    let Some((compression, offset, size)) = compression else {
        let data = section
            .data(endian, cache)
            .map_err(|err| format!("{name}: {err}"))?;
        return Ok(Some((address, Cow::Borrowed(data))));
    };
    if compression.ch_type.get(endian) != elf::ELFCOMPRESS_ZLIB {
        return Err(format!("{name} is compressed in a format other than zlib"));
    }
    let expected = compression.ch_size.get(endian);
    if expected > MAX_CFI_SECTION_BYTES {
        return Err(format!(
            "{name} decompresses to more than {MAX_CFI_SECTION_BYTES} bytes"
        ));
    }
    let compressed = object::ReadRef::read_bytes_at(cache, offset, size)
        .map_err(|()| format!("{name}: compressed data out of the file"))?;
    let mut data = Vec::new();
    // One byte more than announced reveals a lie without reading it all.
    flate2::read::ZlibDecoder::new(compressed)
        .take(expected + 1)
        .read_to_end(&mut data)
        .map_err(|err| format!("{name}: {err}"))?;
    if data.len() as u64 != expected {
        return Err(format!("{name} does not decompress to its announced size"));
    }
    Ok(Some((address, Cow::Owned(data))))
}
