//! Corrupted variants of an ELF file with DWARF, for the fuzz test: bytes
//! changed in the headers, the section table, the debug sections and the
//! symbol tables, never in one function's code, so the variant still runs.
//!
//! Deterministic: the same seed gives the same mutants, so a failure can be
//! replayed.

use std::ops::Range;

/// splitmix64: small, fast, and good enough to pick bytes.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in 0..bound (bound > 0); the modulo bias is irrelevant here.
    pub fn below(&mut self, bound: usize) -> usize {
        (self.next_u64() % bound as u64) as usize
    }
}

/// What a mutation targets; the weights say how often.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    ElfHeader,
    ProgramHeaders,
    SectionHeaders,
    /// A `.debug_*` section.
    Debug,
    /// `.symtab`, `.strtab`, `.dynsym`, `.dynstr`.
    Symbols,
    /// Notes (the build id), `.shstrtab`, dynamic tables.
    Other,
    /// Anywhere but the protected function.
    Anywhere,
}

const WEIGHTS: &[(Target, usize)] = &[
    (Target::Debug, 55),
    (Target::SectionHeaders, 10),
    (Target::Symbols, 10),
    (Target::ElfHeader, 5),
    (Target::ProgramHeaders, 5),
    (Target::Other, 5),
    (Target::Anywhere, 10),
];

/// Where things are in the original file.
#[derive(Clone, Debug)]
pub struct Layout {
    regions: Vec<(Target, Range<usize>)>,
    /// File offsets of the function whose bytes stay intact.
    pub protected: Range<usize>,
}

fn read<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    bytes
        .get(at..at + N)
        .and_then(|slice| slice.try_into().ok())
        .unwrap_or_else(|| panic!("ELF field at {at:#x} ({N} bytes) is past the end of the file"))
}

fn u16_at(bytes: &[u8], at: usize) -> usize {
    u16::from_le_bytes(read(bytes, at)).into()
}

fn u32_at(bytes: &[u8], at: usize) -> usize {
    u32::from_le_bytes(read(bytes, at)) as usize
}

fn u64_at(bytes: &[u8], at: usize) -> usize {
    usize::try_from(u64::from_le_bytes(read(bytes, at))).expect("a 64-bit host")
}

fn c_string(bytes: &[u8], at: usize) -> &str {
    let tail = bytes.get(at..).unwrap_or_default();
    let end = tail.iter().position(|&byte| byte == 0).unwrap_or(tail.len());
    std::str::from_utf8(&tail[..end]).unwrap_or("")
}

struct Section<'a> {
    name: &'a str,
    kind: usize,
    addr: usize,
    offset: usize,
    size: usize,
    link: usize,
}

const SHT_NOBITS: usize = 8;

impl Layout {
    /// Reads the layout of a little-endian ELF64 file (our own build, so
    /// malformed input panics) and protects `function`'s code.
    pub fn of(elf: &[u8], function: &str) -> Self {
        assert!(
            elf.starts_with(b"\x7fELF\x02\x01"),
            "not a little-endian ELF64 file"
        );
        let (phoff, shoff) = (u64_at(elf, 0x20), u64_at(elf, 0x28));
        let (phentsize, phnum) = (u16_at(elf, 0x36), u16_at(elf, 0x38));
        let (shentsize, shnum, shstrndx) = (u16_at(elf, 0x3a), u16_at(elf, 0x3c), u16_at(elf, 0x3e));
        let header = |index: usize| shoff + index * shentsize;
        let names = u64_at(elf, header(shstrndx) + 0x18);
        let sections: Vec<Section> = (0..shnum)
            .map(|index| {
                let at = header(index);
                Section {
                    name: c_string(elf, names + u32_at(elf, at)),
                    kind: u32_at(elf, at + 4),
                    addr: u64_at(elf, at + 0x10),
                    offset: u64_at(elf, at + 0x18),
                    size: u64_at(elf, at + 0x20),
                    link: u32_at(elf, at + 0x28),
                }
            })
            .collect();
        let mut regions = vec![
            (Target::ElfHeader, 0..0x40),
            (Target::ProgramHeaders, phoff..phoff + phnum * phentsize),
            (Target::SectionHeaders, shoff..shoff + shnum * shentsize),
            (Target::Anywhere, 0..elf.len()),
        ];
        for section in sections.iter().filter(|s| s.kind != SHT_NOBITS && s.size > 0) {
            let target = match section.name {
                name if name.starts_with(".debug_") => Target::Debug,
                ".symtab" | ".strtab" | ".dynsym" | ".dynstr" => Target::Symbols,
                ".shstrtab" | ".dynamic" | ".gnu.hash" => Target::Other,
                name if name.starts_with(".note") => Target::Other,
                _ => continue,
            };
            regions.push((target, section.offset..section.offset + section.size));
        }
        let protected = Self::function_range(elf, &sections, function);
        Self { regions, protected }
    }

    fn function_range(elf: &[u8], sections: &[Section], function: &str) -> Range<usize> {
        let symtab = sections
            .iter()
            .find(|s| s.name == ".symtab")
            .expect("the victim has a .symtab");
        let strings = &sections[symtab.link];
        for at in (symtab.offset..symtab.offset + symtab.size).step_by(24) {
            if c_string(elf, strings.offset + u32_at(elf, at)) != function {
                continue;
            }
            let section = &sections[u16_at(elf, at + 6)];
            let start = u64_at(elf, at + 8) - section.addr + section.offset;
            return start..start + u64_at(elf, at + 16);
        }
        panic!("no symbol {function} in the victim's .symtab");
    }

    /// Mutant number `index` of `original`, and what it targeted.
    pub fn mutant(&self, original: &[u8], seed: u64, index: u64) -> (Vec<u8>, Target) {
        let mut rng = Rng::new(seed ^ index.wrapping_mul(0x2545_f491_4f6c_dd1d));
        let total: usize = WEIGHTS.iter().map(|(_, weight)| weight).sum();
        let mut pick = rng.below(total);
        let target = WEIGHTS
            .iter()
            .find(|(_, weight)| {
                let found = pick < *weight;
                pick = pick.saturating_sub(*weight);
                found
            })
            .map_or(Target::Anywhere, |(target, _)| *target);
        let candidates: Vec<&Range<usize>> = self
            .regions
            .iter()
            .filter(|(kind, range)| *kind == target && !range.is_empty())
            .map(|(_, range)| range)
            .collect();
        let region = candidates[rng.below(candidates.len())].clone();
        let mut bytes = original.to_vec();
        // Mostly one or two edits: a small change is what slips past the
        // parser's first checks and into its deeper code.
        let edits = 1 + rng.below(4).min(rng.below(4));
        for _ in 0..edits {
            let at = region.start + rng.below(region.len());
            self.edit(&mut bytes, at, &mut rng);
        }
        (bytes, target)
    }

    fn edit(&self, bytes: &mut [u8], at: usize, rng: &mut Rng) {
        const WORDS: [u64; 8] = [0, 1, 0x7f, 0x80, 0xff, 0xffff, 0x7fff_ffff, u64::MAX];
        let value = match rng.below(4) {
            0 => u64::from(bytes[at] ^ (1 << rng.below(8))),
            1 => rng.next_u64(),
            _ => WORDS[rng.below(WORDS.len())],
        };
        let width = [1, 1, 2, 4, 8][rng.below(5)];
        for (offset, byte) in value.to_le_bytes().into_iter().take(width).enumerate() {
            let position = at + offset;
            if position < bytes.len() && !self.protected.contains(&position) {
                bytes[position] = byte;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn victim() -> Vec<u8> {
        std::fs::read(env!("WORKLOAD_FUZZ_VICTIM")).expect("the fuzz victim is built")
    }

    #[test]
    fn finds_the_function_and_the_debug_sections() {
        let elf = victim();
        let layout = Layout::of(&elf, "fuzz_hot");
        assert!(
            (8..256).contains(&layout.protected.len()),
            "fuzz_hot is a small loop: {:?}",
            layout.protected
        );
        let debug = layout
            .regions
            .iter()
            .filter(|(kind, _)| *kind == Target::Debug)
            .count();
        assert!(
            debug >= 4,
            "-g gives .debug_info, _abbrev, _line, _str...: {debug}"
        );
    }

    #[test]
    fn mutants_are_deterministic_differ_and_spare_the_function() {
        let elf = victim();
        let layout = Layout::of(&elf, "fuzz_hot");
        let mut changed = 0;
        for index in 0..500 {
            let (mutant, _) = layout.mutant(&elf, 7, index);
            assert_eq!(
                mutant,
                layout.mutant(&elf, 7, index).0,
                "mutant {index} differs between runs"
            );
            assert_eq!(mutant.len(), elf.len());
            assert_eq!(
                mutant[layout.protected.clone()],
                elf[layout.protected.clone()],
                "mutant {index} changed the protected function"
            );
            changed += usize::from(mutant != elf);
        }
        // An edit can write the byte that was there already, rarely.
        assert!(
            changed >= 450,
            "only {changed} of 500 mutants differ from the original"
        );
    }
}
