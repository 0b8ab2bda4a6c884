//! Which samples a profile covers, and which processes an allocation
//! window traces: the filters a reader gave (pid, tid, comm, unit, cgroup,
//! container). Below the stages: `collect` selects processes by it, the
//! store and `profile` samples.

use crate::cgroup::Cgroup;

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
