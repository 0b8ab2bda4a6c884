//! `GET /threads`: CPU time per thread and per process over a window, as JSON.
//! Same filters, window and errors as `/pprof`.

use std::collections::BTreeMap;

use axum::{
    extract::{RawQuery, State},
    response::Response,
};
use serde::Serialize;

use super::{HttpError, ServeState, access::Viewer, handlers::recent, params, scrape::Format};
use crate::profile::Profile;

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct ThreadsReport {
    pub window: WindowReport,
    /// Sorted by CPU time, busiest first.
    pub processes: Vec<ProcessReport>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct WindowReport {
    pub start_ms: u64,
    pub end_ms: u64,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct ProcessReport {
    pub pid: u32,
    pub comm: String,
    /// The systemd unit most of the process's samples ran in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// Its cgroup, chosen the same way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// The process's pid in its own pid namespace, when that is another.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ns_pid: Option<u32>,
    /// Sums over the threads.
    pub cpu_ns: u64,
    pub samples: u64,
    /// Sorted by CPU time, busiest first.
    pub threads: Vec<ThreadReport>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct ThreadReport {
    pub tid: u32,
    pub thread_name: String,
    /// CPU time measured in the kernel (see the README), nanoseconds.
    pub cpu_ns: u64,
    pub samples: u64,
}

pub(super) async fn threads(
    State(state): State<ServeState>,
    Viewer(visible): Viewer,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    let params = params::parse_pprof(query.as_deref(), &state.limits())?;
    recent(&state, params, visible, Format::Threads).await
}

/// The JSON of `/threads`.
pub(super) fn render(profile: &Profile) -> std::io::Result<Vec<u8>> {
    Ok(serde_json::to_vec(&report(profile))?)
}

/// Groups a profile's samples by process and thread. A thread that renamed
/// itself (pthread_setname_np after it started) is named as most of its
/// samples name it, not as whichever sample came first.
pub fn report(profile: &Profile) -> ThreadsReport {
    // pid -> (comm, tid -> thread)
    let mut processes: BTreeMap<u32, (String, BTreeMap<u32, ThreadReport>)> = BTreeMap::new();
    // (pid, tid) -> name -> samples
    let mut names: BTreeMap<(u32, u32), BTreeMap<&str, u64>> = BTreeMap::new();
    // pid -> cgroup path -> samples; and each process's ns_pid.
    let mut cgroups: BTreeMap<u32, BTreeMap<&str, (u64, Option<&str>)>> = BTreeMap::new();
    let mut ns_pids: BTreeMap<u32, u32> = BTreeMap::new();
    for sample in &profile.samples {
        if let Some(cgroup) = &sample.cgroup {
            let entry = cgroups
                .entry(sample.pid)
                .or_default()
                .entry(&cgroup.path)
                .or_insert((0, cgroup.unit.as_deref()));
            entry.0 += sample.count;
        }
        if let Some(ns_pid) = sample.ns_pid {
            ns_pids.insert(sample.pid, ns_pid);
        }
        *names
            .entry((sample.pid, sample.tid))
            .or_default()
            .entry(&sample.thread_name)
            .or_default() += sample.count;
        let (_, threads) = processes
            .entry(sample.pid)
            .or_insert_with(|| (sample.comm.to_string(), BTreeMap::new()));
        let thread = threads.entry(sample.tid).or_insert_with(|| ThreadReport {
            tid: sample.tid,
            thread_name: sample.thread_name.to_string(),
            cpu_ns: 0,
            samples: 0,
        });
        thread.cpu_ns += sample.ns;
        thread.samples += sample.count;
    }
    for (&pid, (_, threads)) in processes.iter_mut() {
        for (&tid, thread) in threads.iter_mut() {
            if let Some((name, _)) = names
                .get(&(pid, tid))
                .and_then(|counts| counts.iter().max_by_key(|(_, count)| **count))
            {
                thread.thread_name = (*name).to_owned();
            }
        }
    }
    let mut processes: Vec<ProcessReport> = processes
        .into_iter()
        .map(|(pid, (comm, threads))| {
            let mut threads: Vec<ThreadReport> = threads.into_values().collect();
            threads.sort_by(|a, b| b.cpu_ns.cmp(&a.cpu_ns).then(a.tid.cmp(&b.tid)));
            let cgroup = cgroups
                .get(&pid)
                .and_then(|paths| paths.iter().max_by_key(|(_, (count, _))| *count));
            ProcessReport {
                pid,
                comm,
                unit: cgroup.and_then(|(_, (_, unit))| unit.map(str::to_owned)),
                cgroup: cgroup.map(|(path, _)| (*path).to_owned()),
                ns_pid: ns_pids.get(&pid).copied(),
                cpu_ns: threads.iter().map(|thread| thread.cpu_ns).sum(),
                samples: threads.iter().map(|thread| thread.samples).sum(),
                threads,
            }
        })
        .collect();
    processes.sort_by(|a, b| b.cpu_ns.cmp(&a.cpu_ns).then(a.pid.cmp(&b.pid)));
    ThreadsReport {
        window: WindowReport {
            start_ms: profile.window.start_ms,
            end_ms: profile.window.end_ms,
        },
        processes,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        store::Window,
        symbolize::{SymbolizedSample, SymbolizedStack},
    };

    #[test]
    fn sums_threads_into_processes_busiest_first() {
        let stack = Arc::new(SymbolizedStack {
            locations: Box::new([]),
        });
        let unit = Some(Arc::new(crate::cgroup::Cgroup::from_path(
            "/system.slice/a.service",
        )));
        let sample = |pid, tid, name: &str, count, cpu_ns| SymbolizedSample {
            pid,
            tid,
            comm: format!("proc{pid}").into(),
            uid: None,
            thread_name: name.into(),
            stack: stack.clone(),
            count,
            cpu_ns,
            cgroup: (pid == 2).then(|| unit.clone()).flatten(),
            ns_pid: (pid == 2).then_some(7),
        };
        let profile = Profile {
            window: Window {
                start_ms: 1_000,
                end_ms: 6_000,
            },
            frequency: 99,
            samples: vec![
                sample(1, 1, "main", 1, 10),
                sample(2, 20, "worker", 5, 500),
                sample(2, 21, "io", 1, 100),
                sample(2, 20, "worker", 2, 200),
            ],
        };
        let report = report(&profile);
        assert_eq!(
            report.window,
            WindowReport {
                start_ms: 1_000,
                end_ms: 6_000
            }
        );
        assert_eq!(report.processes.len(), 2);
        let busiest = &report.processes[0];
        assert_eq!((busiest.pid, busiest.cpu_ns, busiest.samples), (2, 800, 8));
        assert_eq!(
            busiest.threads,
            vec![
                ThreadReport {
                    tid: 20,
                    thread_name: "worker".into(),
                    cpu_ns: 700,
                    samples: 7
                },
                ThreadReport {
                    tid: 21,
                    thread_name: "io".into(),
                    cpu_ns: 100,
                    samples: 1
                },
            ]
        );
        assert_eq!(report.processes[1].comm, "proc1");
        assert_eq!(
            (busiest.unit.as_deref(), busiest.cgroup.as_deref(), busiest.ns_pid),
            (Some("a.service"), Some("/system.slice/a.service"), Some(7))
        );
        assert_eq!(
            (report.processes[1].unit.as_deref(), report.processes[1].ns_pid),
            (None, None)
        );
    }
}
