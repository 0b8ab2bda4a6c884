//! Which running processes a selection names: the pids, process names,
//! units, cgroups and containers that readers filter profiles by, turned
//! into the processes to probe now (allocations are traced per process).

use crate::{
    cgroup::{Cgroup, MAX_PATH_BYTES},
    filter::Filter,
    procfs::ProcRoot,
};

/// Processes traced while the daemon runs (`alloc_trace_pids`,
/// `alloc_trace_units`, `alloc_trace_comms`): a process is one when any
/// list names it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocTargets {
    pub pids: Vec<u32>,
    /// systemd units, exact (`nginx.service`).
    pub units: Vec<String>,
    /// Process names (comm).
    pub comms: Vec<String>,
}

impl AllocTargets {
    pub fn is_empty(&self) -> bool {
        self.pids.is_empty() && self.units.is_empty() && self.comms.is_empty()
    }

    /// One filter per list (filters AND their parts; the lists are OR'd).
    pub(super) fn filters(&self) -> Vec<Filter> {
        [
            Filter {
                pids: self.pids.clone(),
                ..Filter::default()
            },
            Filter {
                units: self.units.clone(),
                ..Filter::default()
            },
            Filter {
                comms: self.comms.clone(),
                ..Filter::default()
            },
        ]
        .into_iter()
        .filter(|filter| *filter != Filter::default())
        .collect()
    }
}

/// The processes running now that one of `filters` keeps, by their pid,
/// name and cgroup (thread ids are ignored: processes are selected), in
/// pid order. `skip` leaves out processes not worth reading again.
pub fn running(proc_root: &ProcRoot, filters: &[Filter], skip: impl Fn(u32) -> bool) -> Vec<u32> {
    if filters.is_empty() {
        return Vec::new();
    }
    let by_cgroup = filters.iter().any(Filter::by_cgroup);
    let mut pids = proc_root.pids();
    pids.sort_unstable();
    pids.retain(|&pid| {
        if skip(pid) {
            return false;
        }
        let Ok(comm) = proc_root.read(pid, "comm") else {
            return false;
        };
        let cgroup = if by_cgroup {
            cgroup_of(proc_root, pid)
        } else {
            None
        };
        filters
            .iter()
            .any(|filter| filter.matches(pid, pid, comm.trim_end_matches('\n'), cgroup.as_ref()))
    });
    pids
}

/// The cgroup v2 path of `pid`, named (unit, container), from /proc/PID/cgroup.
fn cgroup_of(proc_root: &ProcRoot, pid: u32) -> Option<Cgroup> {
    let text = proc_root.read(pid, "cgroup").ok()?;
    let path = text.lines().find_map(|line| line.strip_prefix("0::"))?;
    if !path.starts_with('/') || path.len() > MAX_PATH_BYTES {
        return None;
    }
    Some(Cgroup::from_path(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procfs::fixture::FixtureProc;

    fn fake_proc(processes: &[(u32, &str, &str)]) -> FixtureProc {
        let proc = FixtureProc::new("selection");
        for (pid, comm, cgroup) in processes {
            proc.write(*pid, "comm", &format!("{comm}\n"))
                .write(*pid, "cgroup", &format!("0::{cgroup}\n"));
        }
        std::fs::create_dir_all(proc.path().join("self")).unwrap();
        proc
    }

    #[test]
    fn targets_select_by_any_list_and_requests_by_every_part() {
        let fixture = fake_proc(&[
            (10, "nginx", "/system.slice/nginx.service"),
            (11, "nginx", "/system.slice/nginx.service"),
            (12, "nginx", "/user.slice/user-1000.slice/session-2.scope"),
            (20, "redis-server", "/system.slice/redis.service"),
            (30, "app", "/user.slice/user-1000.slice/session-2.scope"),
        ]);
        let proc = fixture.root();
        let targets = AllocTargets {
            pids: vec![30],
            units: vec!["redis.service".into()],
            comms: vec!["nope".into()],
        };
        assert_eq!(running(&proc, &targets.filters(), |_| false), [20, 30]);
        assert!(running(&proc, &AllocTargets::default().filters(), |_| false).is_empty());
        let nginx_service = Filter {
            comms: vec!["nginx".into()],
            units: vec!["nginx.service".into()],
            ..Filter::default()
        };
        assert_eq!(running(&proc, &[nginx_service], |_| false), [10, 11]);
        let session = Filter {
            cgroups: vec!["/user.slice".into()],
            ..Filter::default()
        };
        assert_eq!(
            running(&proc, std::slice::from_ref(&session), |_| false),
            [12, 30]
        );
        assert_eq!(running(&proc, &[session], |pid| pid == 12), [30]);
    }
}
