//! What a reader asks the store for: a time window, filters and a profile type.

use crate::{
    collect::ReadableBy,
    kind::ProfileType,
    profile::{Filter, Window},
};

/// Whose processes a reader may see: the kernel's rule for reading
/// others' processes. Root and the access group (and a bearer token) see
/// everything; any other user only the processes the kernel would let them
/// read (see [`ReadableBy`]): not set-uid programs they started, for one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Visible {
    All,
    User(u32),
}

impl Visible {
    /// Samples of privileged processes, and of those whose credentials
    /// could not be read, are shown only to those who see everything.
    pub fn allows(self, readable_by: ReadableBy) -> bool {
        match self {
            Visible::All => true,
            Visible::User(caller) => readable_by == ReadableBy::User(caller),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    pub window: Window,
    pub filter: Filter,
    pub visible: Visible,
    /// Only the samples whose kind this type includes.
    pub profile_type: ProfileType,
}
