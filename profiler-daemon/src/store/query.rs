//! What a reader asks the store for: a time window, filters and a profile type.

use crate::{cgroup::Cgroup, collect::ReadableBy, kind::ProfileType};

/// Which samples a query keeps: OR within a filter, AND across filters; an
/// empty filter keeps everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Filter {
    pub pids: Vec<u32>,
    pub tids: Vec<u32>,
    pub comms: Vec<String>,
    /// Unit names, exact (see [`crate::cgroup::unit_of`]).
    pub units: Vec<String>,
    /// Cgroup path prefixes, normalized (see [`Cgroup::is_under`]).
    pub cgroups: Vec<String>,
    /// Whole container ids (the server expands the prefixes readers give).
    pub containers: Vec<String>,
}

impl Filter {
    /// `cgroup`: the sample's, if it could be named; a sample without one
    /// matches no cgroup, unit or container filter.
    pub fn matches(&self, pid: u32, tid: u32, comm: &str, cgroup: Option<&Cgroup>) -> bool {
        (self.pids.is_empty() || self.pids.contains(&pid))
            && (self.tids.is_empty() || self.tids.contains(&tid))
            && (self.comms.is_empty() || self.comms.iter().any(|wanted| wanted == comm))
            && (self.units.is_empty()
                || any_equal(&self.units, cgroup.and_then(|cgroup| cgroup.unit.as_deref())))
            && (self.cgroups.is_empty()
                || cgroup.is_some_and(|cgroup| self.cgroups.iter().any(|prefix| cgroup.is_under(prefix))))
            && (self.containers.is_empty()
                || any_equal(
                    &self.containers,
                    cgroup.and_then(|cgroup| cgroup.container_id.as_deref()),
                ))
    }

    /// True when a cgroup, unit or container filter is given.
    pub fn by_cgroup(&self) -> bool {
        !(self.units.is_empty() && self.cgroups.is_empty() && self.containers.is_empty())
    }

    /// The same filter with each list sorted and without repeats: filters
    /// that keep the same samples compare equal (`pid=2,1` and `pid=1&pid=2`).
    pub fn normalized(mut self) -> Self {
        for ids in [&mut self.pids, &mut self.tids] {
            ids.sort_unstable();
            ids.dedup();
        }
        for names in [
            &mut self.comms,
            &mut self.units,
            &mut self.cgroups,
            &mut self.containers,
        ] {
            names.sort_unstable();
            names.dedup();
        }
        self
    }
}

fn any_equal(wanted: &[String], value: Option<&str>) -> bool {
    value.is_some_and(|value| wanted.iter().any(|wanted| wanted == value))
}

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

/// A time range in milliseconds since the Unix epoch, inclusive start,
/// exclusive end, matched against the time of each drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    pub start_ms: u64,
    pub end_ms: u64,
}

impl Window {
    pub const ALL: Window = Window {
        start_ms: 0,
        end_ms: u64::MAX,
    };

    /// The `seconds` seconds up to and including millisecond `now_ms`: a
    /// drain exactly `seconds` before `now_ms` belongs to the window before.
    pub fn last(seconds: u64, now_ms: u64) -> Self {
        Window {
            start_ms: now_ms
                .saturating_sub(seconds.saturating_mul(1000))
                .saturating_add(1),
            end_ms: now_ms.saturating_add(1),
        }
    }

    /// Samples drained after the drain at `after_ms`, up to and including the
    /// drain at `until_ms`: exactly what was sampled between two drains.
    pub fn between_drains(after_ms: u64, until_ms: u64) -> Self {
        Window {
            start_ms: after_ms.saturating_add(1),
            end_ms: until_ms.saturating_add(1),
        }
    }

    pub fn contains(&self, time_ms: u64) -> bool {
        self.start_ms <= time_ms && time_ms < self.end_ms
    }

    pub fn duration_ms(&self) -> u64 {
        self.end_ms.saturating_sub(self.start_ms)
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
