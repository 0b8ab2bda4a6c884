//! Just enough ELF64 (little-endian) reading to build hostile files from the
//! test workloads: find a section, a symbol's file offset, and break a DWARF 5
//! line table in a precise way. Panics on anything else: the inputs are our
//! own compiler's output.

/// One section header, the fields the tests use.
#[derive(Clone, Debug)]
pub struct Section {
    pub name: String,
    pub kind: u32,
    pub flags: u64,
    pub addr: u64,
    pub offset: usize,
    pub size: usize,
    pub link: u32,
}

const SHF_ALLOC: u64 = 2;
const SHT_SYMTAB: u32 = 2;
const SHT_DYNSYM: u32 = 11;

fn u16_at(data: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(data[at..at + 2].try_into().expect("2 bytes"))
}

fn u32_at(data: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(data: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(data[at..at + 8].try_into().expect("8 bytes"))
}

fn c_string(data: &[u8], at: usize) -> String {
    let end = data[at..]
        .iter()
        .position(|&b| b == 0)
        .map_or(data.len(), |n| at + n);
    String::from_utf8_lossy(&data[at..end]).into_owned()
}

/// The section header table of an ELF64 little-endian image.
pub fn sections(image: &[u8]) -> Vec<Section> {
    assert!(
        image.len() > 64 && image.starts_with(b"\x7fELF\x02\x01"),
        "not an ELF64 little-endian image"
    );
    let table = u64_at(image, 0x28) as usize;
    let entry_size = u16_at(image, 0x3a) as usize;
    let count = u16_at(image, 0x3c) as usize;
    let names_index = u16_at(image, 0x3e) as usize;
    let header = |index: usize| table + index * entry_size;
    let names = u64_at(image, header(names_index) + 0x18) as usize;
    (0..count)
        .map(|index| {
            let at = header(index);
            Section {
                name: c_string(image, names + u32_at(image, at) as usize),
                kind: u32_at(image, at + 4),
                flags: u64_at(image, at + 8),
                addr: u64_at(image, at + 0x10),
                offset: u64_at(image, at + 0x18) as usize,
                size: u64_at(image, at + 0x20) as usize,
                link: u32_at(image, at + 0x28),
            }
        })
        .collect()
}

pub fn section<'a>(sections: &'a [Section], name: &str) -> &'a Section {
    sections
        .iter()
        .find(|section| section.name == name)
        .unwrap_or_else(|| panic!("no section {name}"))
}

/// The file offset of the code of function `name` (from .symtab).
pub fn function_file_offset(image: &[u8], name: &str) -> u64 {
    let all = sections(image);
    let symtab = all
        .iter()
        .find(|section| section.kind == SHT_SYMTAB)
        .expect("a .symtab (the binary is not stripped)");
    symbol_file_offset(image, &all, symtab, name).unwrap_or_else(|| panic!("no symbol {name}"))
}

/// The file offset of the code of function `name` exported by a shared
/// library (from .dynsym, which stripping keeps), if it exports it.
pub fn dynamic_function_file_offset(image: &[u8], name: &str) -> Option<u64> {
    let all = sections(image);
    let dynsym = all
        .iter()
        .find(|section| section.kind == SHT_DYNSYM)
        .expect("a .dynsym (the file is a shared library)");
    symbol_file_offset(image, &all, dynsym, name)
}

/// `name`'s file offset, from the symbol table `table`: its value (a
/// defined symbol's) mapped through the allocated section that holds it.
fn symbol_file_offset(image: &[u8], all: &[Section], table: &Section, name: &str) -> Option<u64> {
    let strings = &all[table.link as usize];
    let value = (0..table.size / 24)
        .map(|index| table.offset + index * 24)
        // st_shndx 0: an undefined symbol (an import), not this file's code.
        .filter(|&at| u16_at(image, at + 6) != 0)
        .find(|&at| c_string(image, strings.offset + u32_at(image, at) as usize) == name)
        .map(|at| u64_at(image, at + 8))?;
    let holder = all
        .iter()
        .find(|s| s.flags & SHF_ALLOC != 0 && (s.addr..s.addr + s.size as u64).contains(&value))
        .unwrap_or_else(|| panic!("no section holds {name} at {value:#x}"));
    Some(value - holder.addr + holder.offset as u64)
}

fn uleb(data: &[u8], at: &mut usize) -> u64 {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = data[*at];
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
    }
    value
}

/// A line-table entry format: (content type, form) pairs; the forms.
fn entry_forms(data: &[u8], at: &mut usize) -> Vec<u64> {
    let count = data[*at];
    *at += 1;
    (0..count)
        .map(|_| {
            uleb(data, at);
            uleb(data, at)
        })
        .collect()
}

/// Skips one attribute value of a DWARF 5 line-table entry of form `form`.
fn skip_form(data: &[u8], at: &mut usize, form: u64) {
    match form {
        // DW_FORM_string
        0x08 => *at += data[*at..].iter().position(|&b| b == 0).expect("NUL-terminated") + 1,
        // DW_FORM_line_strp, DW_FORM_strp, DW_FORM_data4 (32-bit DWARF)
        0x1f | 0x0e | 0x06 => *at += 4,
        // DW_FORM_udata
        0x0f => {
            uleb(data, at);
        }
        0x0b => *at += 1,
        0x05 => *at += 2,
        0x07 => *at += 8,
        0x1e => *at += 16,
        other => panic!("unexpected DWARF form {other:#x} in a line table header"),
    }
}

/// Cuts the file table of every DWARF 5 line program down to its entry 0,
/// one byte per program: the rows keep referring to files 1, 2, ..., which
/// no longer exist (the crash of issue 14: a reader that trusts a row's file
/// index). The program itself still runs. Returns how many were cut.
pub fn truncate_line_file_tables(image: &mut [u8]) -> usize {
    let debug_line = section(&sections(image), ".debug_line").clone();
    let mut unit = debug_line.offset;
    let end = debug_line.offset + debug_line.size;
    let mut cut = 0;
    while unit + 4 <= end {
        let length = u32_at(image, unit) as usize;
        assert!(length < 0xffff_fff0, "64-bit DWARF is not expected here");
        let next = unit + 4 + length;
        if u16_at(image, unit + 4) == 5 {
            // unit_length, version, address_size, segment_selector_size,
            // header_length, minimum_instruction_length,
            // maximum_operations_per_instruction, default_is_stmt,
            // line_base, line_range: 4 + 2 + 1 + 1 + 4 + 5 bytes.
            let mut at = unit + 17;
            let opcode_base = image[at] as usize;
            at += opcode_base; // opcode_base and its standard_opcode_lengths
            let directory_forms = entry_forms(image, &mut at);
            for _ in 0..uleb(image, &mut at) {
                for &form in &directory_forms {
                    skip_form(image, &mut at, form);
                }
            }
            entry_forms(image, &mut at);
            let count_at = at;
            let files = uleb(image, &mut at);
            // Only a one-byte count is rewritten: the header keeps its length.
            if files > 1 && at == count_at + 1 {
                image[count_at] = 1;
                cut += 1;
            }
        }
        unit = next;
    }
    cut
}

/// The GNU build id, lowercase hex, if the image has one.
pub fn build_id(image: &[u8]) -> Option<String> {
    let all = sections(image);
    let note = all.iter().find(|section| section.name == ".note.gnu.build-id")?;
    // namesz, descsz, type, then "GNU\0" and the id.
    let size = u32_at(image, note.offset + 4) as usize;
    let id = image.get(note.offset + 16..note.offset + 16 + size)?;
    Some(id.iter().map(|byte| format!("{byte:02x}")).collect())
}
