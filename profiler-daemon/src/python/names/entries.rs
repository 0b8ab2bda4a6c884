//! The cache's entries: what is held of each code object address, and
//! what it says of a new slot there.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use crate::python::code::CodeObject;

pub(super) enum State {
    Code {
        code: Arc<CodeObject>,
        /// Bit k: a slot with key k did not match `code`, read again at
        /// `read`; such slots get a placeholder without a read until
        /// `negative_ttl` after it (the address may hold a new object).
        mismatched: u32,
        read: Instant,
    },
    Unreadable {
        since: Instant,
    },
}

pub(super) struct Entry {
    pub(super) state: State,
    /// The cache's clock when last used.
    pub(super) used: u64,
    pub(super) weight: usize,
}

pub(super) struct Process<M> {
    pub(super) memory: M,
    /// This process's code type, once checked by name.
    pub(super) code_type: Option<u64>,
    pub(super) entries: HashMap<u64, Entry>,
    pub(super) bytes: usize,
}

/// What the cache holds of an address, for a slot with `key`.
pub(super) enum Cached<'a> {
    /// Its code object, which the key matches.
    Code(&'a CodeObject),
    /// A code object this key did not match, read again recently.
    Mismatched,
    /// Unreadable, recently.
    Unreadable,
    /// Nothing, or nothing recent: read it; what was seen of it (its key
    /// and the keys that did not match), if anything.
    Stale(Option<(u64, u32)>),
}

pub(super) fn cached<'a, M>(
    process: &'a mut Process<M>,
    address: u64,
    key: u64,
    clock: u64,
    ttl: Duration,
) -> Cached<'a> {
    let Some(entry) = process.entries.get_mut(&address) else {
        return Cached::Stale(None);
    };
    entry.used = clock;
    match &entry.state {
        State::Code { code, .. } if code.key() == key => Cached::Code(code),
        State::Code {
            code,
            mismatched,
            read,
        } => {
            if mismatched & (1 << key) != 0 && read.elapsed() < ttl {
                Cached::Mismatched
            } else {
                Cached::Stale(Some((code.key(), *mismatched)))
            }
        }
        State::Unreadable { since } if since.elapsed() < ttl => Cached::Unreadable,
        State::Unreadable { .. } => Cached::Stale(None),
    }
}
