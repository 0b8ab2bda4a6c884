//! The interning tables behind [`super::build`]. Each table's ids are its
//! 1-based positions, so they run 1..N in table order by construction.
//!
//! Entries are deduplicated by value, but looked up by pointer first: the
//! symbolizer and store share `Arc`s (stacks, lines, functions, mappings), and
//! hashing names and paths for every frame dominated the cost of large profiles.

use std::{
    borrow::Cow,
    collections::HashMap,
    hash::{BuildHasherDefault, Hasher},
};

use super::{proto, to_i64};
use crate::symbolize::{FrameKind, Function, Line, Location, Mapping, SymbolizedStack};

pub(super) struct Builder<'a> {
    pub strings: Vec<String>,
    string_ids: HashMap<Cow<'a, str>, i64>,
    /// Decimal pids and tids, as label values.
    numbers: WordMap<u32, i64>,
    pub mappings: Vec<proto::Mapping>,
    mapping_ids: HashMap<&'a Mapping, u64>,
    mapping_ptrs: WordMap<*const Mapping, u64>,
    pub functions: Vec<proto::Function>,
    function_ids: HashMap<&'a Function, u64>,
    function_ptrs: WordMap<*const Function, u64>,
    pub locations: Vec<proto::Location>,
    location_ids: WordMap<LocationKey, u64>,
    location_ptrs: WordMap<(u64, FrameKind, u64, *const Line), u64>,
    /// The store interns stacks, so many samples share one: convert each once.
    stacks: WordMap<*const SymbolizedStack, Vec<u64>>,
}

/// For keys made of pointers, ids and addresses only: nothing outside the
/// daemon picks them, so SipHash's resistance to crafted collisions buys
/// nothing there, and its cost was most of the encoding time. Keys holding
/// names or paths keep the standard hasher.
type WordMap<K, V> = HashMap<K, V, BuildHasherDefault<WordHasher>>;

/// Multiply-rotate hashing of machine words.
#[derive(Default)]
struct WordHasher(u64);

impl WordHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(26) ^ word).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

impl Hasher for WordHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.add(word);
    }

    fn write_usize(&mut self, word: usize) {
        self.add(word as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A location by value: its mapping, address and (function, line) pairs.
#[derive(PartialEq, Eq, Hash)]
struct LocationKey {
    mapping_id: u64,
    kind: FrameKind,
    address: u64,
    lines: Vec<(u64, u32)>,
}

impl Default for Builder<'_> {
    fn default() -> Self {
        Self {
            strings: vec![String::new()],
            string_ids: HashMap::from([(Cow::Borrowed(""), 0)]),
            numbers: WordMap::default(),
            mappings: Vec::new(),
            mapping_ids: HashMap::new(),
            mapping_ptrs: WordMap::default(),
            functions: Vec::new(),
            function_ids: HashMap::new(),
            function_ptrs: WordMap::default(),
            locations: Vec::new(),
            location_ids: WordMap::default(),
            location_ptrs: WordMap::default(),
            stacks: WordMap::default(),
        }
    }
}

impl<'a> Builder<'a> {
    /// Interns a string that lives as long as the profile (no key copy).
    pub fn string(&mut self, value: &'a str) -> i64 {
        self.intern(Cow::Borrowed(value))
    }

    fn intern(&mut self, value: Cow<'a, str>) -> i64 {
        if let Some(&id) = self.string_ids.get(&*value) {
            return id;
        }
        let id = to_i64(self.strings.len() as u64);
        self.strings.push(value.clone().into_owned());
        self.string_ids.insert(value, id);
        id
    }

    fn optional_string(&mut self, value: Option<&'a str>) -> i64 {
        value.map_or(0, |value| self.string(value))
    }

    pub fn label(&mut self, key: i64, value: &'a str) -> proto::Label {
        proto::Label {
            key,
            str: self.string(value),
            ..proto::Label::default()
        }
    }

    pub fn number_label(&mut self, key: i64, value: u32) -> proto::Label {
        let str = match self.numbers.get(&value) {
            Some(&id) => id,
            None => {
                let id = self.intern(Cow::Owned(value.to_string()));
                self.numbers.insert(value, id);
                id
            }
        };
        proto::Label {
            key,
            str,
            ..proto::Label::default()
        }
    }

    /// Location ids of a stack, leaf first.
    pub fn stack(&mut self, stack: &'a SymbolizedStack) -> Vec<u64> {
        let pointer: *const SymbolizedStack = stack;
        if let Some(ids) = self.stacks.get(&pointer) {
            return ids.clone();
        }
        let ids: Vec<u64> = stack
            .locations
            .iter()
            .map(|location| self.location(location))
            .collect();
        self.stacks.insert(pointer, ids.clone());
        ids
    }

    fn location(&mut self, location: &'a Location) -> u64 {
        let mapping_id = location
            .mapping
            .as_deref()
            .map_or(0, |mapping| self.mapping(mapping));
        let pointer = (
            mapping_id,
            location.kind,
            location.address,
            location.lines.as_ptr(),
        );
        if let Some(&id) = self.location_ptrs.get(&pointer) {
            return id;
        }
        let lines: Vec<(u64, u32)> = location
            .lines
            .iter()
            .map(|line| (self.function(&line.function), line.line))
            .collect();
        let key = LocationKey {
            mapping_id,
            kind: location.kind,
            address: location.address,
            lines,
        };
        if let Some(&id) = self.location_ids.get(&key) {
            self.location_ptrs.insert(pointer, id);
            return id;
        }
        // The flags say what this profile already carries, so that consumers
        // symbolize only what is missing: has_functions stays false while
        // every location of the mapping is a placeholder.
        if let Some(flags) = mapping_id
            .checked_sub(1)
            .and_then(|index| self.mappings.get_mut(index as usize))
            && location.resolved
        {
            flags.has_functions = true;
            flags.has_filenames |= location.lines.iter().any(|line| line.function.filename.is_some());
            flags.has_line_numbers |= location.lines.iter().any(|line| line.line != 0);
            flags.has_inline_frames |= location.lines.len() > 1;
        }
        let id = self.locations.len() as u64 + 1;
        self.locations.push(proto::Location {
            id,
            mapping_id,
            address: location.address,
            line: key
                .lines
                .iter()
                .map(|&(function_id, line)| proto::Line {
                    function_id,
                    line: i64::from(line),
                    column: 0,
                })
                .collect(),
            is_folded: false,
        });
        self.location_ids.insert(key, id);
        self.location_ptrs.insert(pointer, id);
        id
    }

    pub fn mapping(&mut self, mapping: &'a Mapping) -> u64 {
        let pointer: *const Mapping = mapping;
        if let Some(&id) = self.mapping_ptrs.get(&pointer) {
            return id;
        }
        let id = match self.mapping_ids.get(mapping) {
            Some(&id) => id,
            None => {
                let id = self.mappings.len() as u64 + 1;
                let filename = self.string(&mapping.path);
                let build_id = self.optional_string(mapping.build_id.as_deref());
                self.mappings.push(proto::Mapping {
                    id,
                    memory_start: mapping.start,
                    memory_limit: mapping.limit,
                    file_offset: mapping.file_offset,
                    filename,
                    build_id,
                    ..proto::Mapping::default()
                });
                self.mapping_ids.insert(mapping, id);
                id
            }
        };
        self.mapping_ptrs.insert(pointer, id);
        id
    }

    fn function(&mut self, function: &'a Function) -> u64 {
        let pointer: *const Function = function;
        if let Some(&id) = self.function_ptrs.get(&pointer) {
            return id;
        }
        let id = match self.function_ids.get(function) {
            Some(&id) => id,
            None => {
                let id = self.functions.len() as u64 + 1;
                let name = self.string(&function.name);
                let system_name = self.string(&function.system_name);
                let filename = self.optional_string(function.filename.as_deref());
                self.functions.push(proto::Function {
                    id,
                    name,
                    system_name,
                    filename,
                    start_line: 0,
                });
                self.function_ids.insert(function, id);
                id
            }
        };
        self.function_ptrs.insert(pointer, id);
        id
    }
}
