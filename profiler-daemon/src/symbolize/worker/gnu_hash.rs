//! Looking a few exported names up in a file's `.gnu.hash`, reading only
//! what the lookup touches: the header, one bloom word, one bucket, one
//! chain and the symbols it names. The whole `.dynsym` and `.dynstr` of a
//! large program are megabytes (node's: 7 MB) that a search for three
//! names would otherwise copy into the worker; object's `GnuHashTable`
//! wants both tables whole in memory, so the walk is done here, over the
//! lazily read file.
//!
//! The file is hostile: every offset is checked against its section, and
//! a chain longer than `MAX_CHAIN` is given up as unusable (real chains
//! hold a few entries), as is any table that does not parse; the caller
//! then searches the symbol table as it would without a hash.

use object::{
    LittleEndian as Le, ReadRef, StringTable,
    elf::{self, GnuHashHeader, Sym64},
    read::elf::Sym as _,
};

/// Chain entries followed before the table is taken for garbage.
const MAX_CHAIN: u32 = 4096;

/// Where the hash and the symbols it indexes lie in the file.
#[derive(Clone, Copy)]
pub(super) struct HashedSymbols {
    /// File offset and size of `.gnu.hash`.
    pub hash: (u64, u64),
    /// File offset and size of the `.dynsym` it indexes.
    pub symbols: (u64, u64),
}

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Lookup {
    /// The defined symbol's value and size.
    Found {
        value: u64,
        size: u64,
    },
    Absent,
    /// The table does not hold together: search without it.
    Unusable,
}

impl HashedSymbols {
    /// Looks `name` up, reading its name from `strings` (the `.dynstr`
    /// the symbol table links to).
    pub fn find<'d, R: ReadRef<'d>>(&self, data: R, strings: StringTable<'d, R>, name: &[u8]) -> Lookup {
        self.find_hashed(data, strings, name).unwrap_or(Lookup::Unusable)
    }

    fn find_hashed<'d, R: ReadRef<'d>>(
        &self,
        data: R,
        strings: StringTable<'d, R>,
        name: &[u8],
    ) -> Option<Lookup> {
        let endian = Le;
        let header = read_within::<GnuHashHeader<Le>, R>(data, self.hash, 0)?;
        let header_size = size_of::<GnuHashHeader<Le>>() as u64;
        let bucket_count = u64::from(header.bucket_count.get(endian));
        let symbol_base = header.symbol_base.get(endian);
        let bloom_count = u64::from(header.bloom_count.get(endian));
        let bloom_shift = header.bloom_shift.get(endian);
        if bucket_count == 0 || bloom_count == 0 || !bloom_count.is_power_of_two() {
            return None;
        }
        let buckets_at = header_size.checked_add(bloom_count.checked_mul(8)?)?;
        let chains_at = buckets_at.checked_add(bucket_count.checked_mul(4)?)?;
        let read_u64 = |at| Some(read_within::<object::U64<Le>, R>(data, self.hash, at)?.get(endian));
        let read_u32 = |at| Some(read_within::<object::U32<Le>, R>(data, self.hash, at)?.get(endian));

        let hash = elf::gnu_hash(name);
        // Two bits of one 64-bit bloom word: a name not exported almost
        // always stops here, before any symbol is read.
        let word = read_u64(header_size + (u64::from(hash / 64) & (bloom_count - 1)) * 8)?;
        let bits = (1u64 << (hash % 64)) | (1u64 << (hash.checked_shr(bloom_shift)? % 64));
        if word & bits != bits {
            return Some(Lookup::Absent);
        }
        let mut index = read_u32(buckets_at + u64::from(hash) % bucket_count * 4)?;
        if index == 0 {
            return Some(Lookup::Absent);
        }
        let symbol_size = size_of::<Sym64<Le>>() as u64;
        for _ in 0..MAX_CHAIN {
            let chain = read_u32(chains_at + u64::from(index.checked_sub(symbol_base)?) * 4)?;
            if chain | 1 == hash | 1 {
                let symbol = read_within::<Sym64<Le>, R>(data, self.symbols, u64::from(index) * symbol_size)?;
                if symbol.st_shndx(endian) != elf::SHN_UNDEF
                    && symbol.name(endian, strings).ok() == Some(name)
                {
                    return Some(Lookup::Found {
                        value: symbol.st_value(endian),
                        size: symbol.st_size(endian),
                    });
                }
            }
            if chain & 1 != 0 {
                return Some(Lookup::Absent);
            }
            index = index.checked_add(1)?;
        }
        None
    }
}

/// The `T` at `at` in the section at `(offset, size)` of the file, if it
/// lies wholly inside the section.
fn read_within<'d, T: object::Pod, R: ReadRef<'d>>(
    data: R,
    (offset, size): (u64, u64),
    at: u64,
) -> Option<&'d T> {
    (at.checked_add(size_of::<T>() as u64)? <= size).then_some(())?;
    data.read_at::<T>(offset.checked_add(at)?).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use object::{
        Object as _, ObjectSection as _, ObjectSymbol as _, ObjectSymbolTable as _, read::elf::ElfFile64,
    };

    use super::*;

    /// This process's libc: a real `.gnu.hash` of a few thousand names.
    fn libc() -> Vec<u8> {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let path = maps
            .lines()
            .filter_map(|line| line.split_whitespace().nth(5))
            .find(|path| path.contains("/libc.so") || path.contains("/libc-"))
            .expect("the test links libc");
        std::fs::read(path).unwrap()
    }

    fn tables(bytes: &[u8]) -> (HashedSymbols, StringTable<'_, &[u8]>) {
        let file = ElfFile64::<Le>::parse(bytes).unwrap();
        let range = |name: &str| {
            let section = file.section_by_name(name).unwrap();
            section.file_range().unwrap()
        };
        let (strings_at, strings_size) = range(".dynstr");
        let table = HashedSymbols {
            hash: range(".gnu.hash"),
            symbols: range(".dynsym"),
        };
        (
            table,
            StringTable::new(bytes, strings_at, strings_at + strings_size),
        )
    }

    #[test]
    fn every_exported_name_of_libc_is_found_with_its_value() {
        let bytes = libc();
        let file = ElfFile64::<Le>::parse(&*bytes).unwrap();
        let mut values: HashMap<Vec<u8>, Vec<u64>> = HashMap::new();
        for symbol in file.dynamic_symbol_table().unwrap().symbols() {
            if !symbol.is_undefined() && !symbol.name_bytes().unwrap().is_empty() {
                let name = symbol.name_bytes().unwrap().to_vec();
                values.entry(name).or_default().push(symbol.address());
            }
        }
        assert!(values.len() > 1000, "{} names", values.len());
        let (table, strings) = tables(&bytes);
        for (name, addresses) in &values {
            match table.find(&*bytes, strings, name) {
                Lookup::Found { value, .. } => {
                    assert!(addresses.contains(&value), "{}", String::from_utf8_lossy(name))
                }
                other => panic!("{}: {other:?}", String::from_utf8_lossy(name)),
            }
        }
        for absent in [&b"_PyRuntime"[..], b"_PyEval_EvalFrameDefault", b"mallocx", b""] {
            assert_eq!(table.find(&*bytes, strings, absent), Lookup::Absent);
        }
    }

    /// A file of a hash section with one bucket, the symbols after it and
    /// the strings "name" (at 1) and "other" (at 6) last.
    struct Synthetic {
        bloom: Vec<u64>,
        shift: u32,
        bucket: u32,
        base: u32,
        chain: Vec<u32>,
        /// (name offset, section index, value) of each symbol.
        symbols: Vec<(u32, u16, u64)>,
    }

    impl Synthetic {
        /// `base` unhashed symbols, then one per chain entry: all undefined.
        fn new(bucket: u32, base: u32, chain: Vec<u32>) -> Self {
            let symbols = vec![(0, 0, 0); base as usize + chain.len()];
            Synthetic {
                bloom: vec![u64::MAX],
                shift: 6,
                bucket,
                base,
                chain,
                symbols,
            }
        }

        fn find(&self, name: &[u8]) -> Lookup {
            let mut bytes = Vec::new();
            let bloom_count = self.bloom.len() as u32;
            for word in [1, self.base, bloom_count, self.shift] {
                bytes.extend_from_slice(&u32::to_le_bytes(word));
            }
            for word in &self.bloom {
                bytes.extend_from_slice(&word.to_le_bytes());
            }
            bytes.extend_from_slice(&self.bucket.to_le_bytes());
            for entry in &self.chain {
                bytes.extend_from_slice(&entry.to_le_bytes());
            }
            let hash_size = bytes.len() as u64;
            for &(name, section, value) in &self.symbols {
                let symbol = Sym64::<Le> {
                    st_name: object::U32::new(Le, name),
                    st_info: elf::SymbolInfo(0),
                    st_other: elf::SymbolOther(0),
                    st_shndx: object::U16::new(Le, elf::SymbolSection(section)),
                    st_value: object::U64::new(Le, value),
                    st_size: object::U64::new(Le, 8),
                };
                bytes.extend_from_slice(object::pod::bytes_of(&symbol));
            }
            let symbols_size = bytes.len() as u64 - hash_size;
            let strings_at = bytes.len() as u64;
            bytes.extend_from_slice(b"\0name\0other\0");
            let table = HashedSymbols {
                hash: (0, hash_size),
                symbols: (hash_size, symbols_size),
            };
            let strings = StringTable::new(&bytes[..], strings_at, bytes.len() as u64);
            table.find(&bytes[..], strings, name)
        }
    }

    /// What a synthetic symbol of that value is found as (all are 8 bytes).
    fn found(value: u64) -> Lookup {
        Lookup::Found { value, size: 8 }
    }

    #[test]
    fn a_chain_finds_the_defined_symbol_of_the_name_and_only_it() {
        let hash = elf::gnu_hash(b"name");
        let mut file = Synthetic::new(1, 1, vec![hash | 1]);
        file.symbols[1] = (1, 0, 0x1234);
        assert_eq!(file.find(b"name"), Lookup::Absent, "undefined");
        file.symbols[1] = (6, 1, 0x1234);
        assert_eq!(file.find(b"name"), Lookup::Absent, "another name");
        file.symbols[1] = (1, 1, 0x1234);
        assert_eq!(file.find(b"name"), found(0x1234));
        // Not in the bloom filter: never looked for in the chain.
        file.bloom = vec![0];
        assert_eq!(file.find(b"name"), Lookup::Absent);
        // Further down a chain, past entries of other hashes.
        let mut file = Synthetic::new(1, 1, vec![hash ^ 2, hash & !1, hash | 1]);
        file.symbols[3] = (1, 1, 0x5678);
        assert_eq!(file.find(b"name"), found(0x5678));
    }

    #[test]
    fn hostile_tables_are_unusable_not_followed() {
        let hash = elf::gnu_hash(b"name");
        // A chain longer than MAX_CHAIN: given up before the name at its end.
        let mut chain = vec![hash & !1; MAX_CHAIN as usize + 5];
        chain.push(hash | 1);
        let mut file = Synthetic::new(1, 1, chain);
        let last = file.symbols.len() - 1;
        file.symbols[last] = (1, 1, 0x1234);
        assert_eq!(file.find(b"name"), Lookup::Unusable);
        // A bucket below the hashed symbols.
        let mut file = Synthetic::new(1, 5, vec![hash | 1]);
        file.symbols[1] = (1, 1, 0x1234);
        assert_eq!(file.find(b"name"), Lookup::Unusable);
        // A bloom filter whose size is not a power of two.
        let mut file = Synthetic::new(1, 1, vec![hash | 1]);
        file.symbols[1] = (1, 1, 0x1234);
        file.bloom = vec![u64::MAX; 3];
        assert_eq!(file.find(b"name"), Lookup::Unusable);
        // A bloom shift of 32 or more.
        let mut file = Synthetic::new(1, 1, vec![hash | 1]);
        file.symbols[1] = (1, 1, 0x1234);
        file.shift = 40;
        assert_eq!(file.find(b"name"), Lookup::Unusable);
        // A chain running past its section.
        let mut file = Synthetic::new(1, 1, vec![hash & !1]);
        file.symbols.push((1, 1, 0x1234));
        assert_eq!(file.find(b"name"), Lookup::Unusable);
        // A chain naming a symbol past the symbol table.
        let mut file = Synthetic::new(4, 1, vec![0, 0, 0, hash | 1]);
        file.symbols.truncate(3);
        assert_eq!(file.find(b"name"), Lookup::Unusable);
    }
}
