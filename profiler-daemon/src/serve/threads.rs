//! The report of `GET /threads` (its handler is in `views.rs`): CPU and
//! off-CPU time per thread and per process over a window, as JSON. `type` is
//! accepted and ignored (both are always reported, off-CPU as 0 when off).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    kind::{ProfileType, SampleKind},
    profile::Profile,
};

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

impl From<crate::profile::Window> for WindowReport {
    fn from(window: crate::profile::Window) -> Self {
        Self {
            start_ms: window.start_ms,
            end_ms: window.end_ms,
        }
    }
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
    #[serde(flatten)]
    pub times: Times,
    /// Sorted by CPU time, busiest first.
    pub threads: Vec<ThreadReport>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct ThreadReport {
    pub tid: u32,
    pub thread_name: String,
    #[serde(flatten)]
    pub times: Times,
}

/// A thread's (or process's) samples and amounts, by kind. Written as the
/// fields the descriptions name (`kind.rs`): `cpu_ns` (CPU time measured
/// in the kernel, see the README) and `samples`; with `--off-cpu`,
/// `off_cpu_blocked_ns`, `off_cpu_runnable_ns` and their sum `off_cpu_ns`
/// (0 when off).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Times {
    counts: [u64; SampleKind::ALL.len()],
    amounts: [u64; SampleKind::ALL.len()],
}

impl Times {
    fn add_sample(&mut self, kind: SampleKind, count: u64, amount: u64) {
        self.counts[kind.index()] += count;
        self.amounts[kind.index()] += amount;
    }

    fn add(&mut self, other: &Times) {
        for kind in SampleKind::ALL {
            self.add_sample(kind, other.counts[kind.index()], other.amounts[kind.index()]);
        }
    }

    /// The amount of `profile_type`: its kinds' added up.
    pub fn amount(&self, profile_type: ProfileType) -> u64 {
        profile_type.kinds().map(|kind| self.amounts[kind.index()]).sum()
    }
}

impl Serialize for Times {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        for kind in SampleKind::ALL {
            let description = kind.describe();
            map.serialize_entry(description.threads_amount, &self.amounts[kind.index()])?;
            if let Some(name) = description.threads_count {
                map.serialize_entry(name, &self.counts[kind.index()])?;
            }
        }
        for profile_type in ProfileType::ALL {
            if let Some(name) = profile_type.describe().threads_total {
                map.serialize_entry(name, &self.amount(profile_type))?;
            }
        }
        map.end()
    }
}

/// Groups a profile's samples by process and thread, and by kind. A thread
/// that renamed itself (pthread_setname_np after it started) is named as
/// most of its samples (and waits) name it, not as whichever came first.
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
            times: Times::default(),
        });
        thread.times.add_sample(sample.kind, sample.count, sample.amount);
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
            threads.sort_by_key(|thread| {
                (
                    std::cmp::Reverse(thread.times.amount(ProfileType::Cpu)),
                    thread.tid,
                )
            });
            let mut times = Times::default();
            for thread in &threads {
                times.add(&thread.times);
            }
            let cgroup = cgroups
                .get(&pid)
                .and_then(|paths| paths.iter().max_by_key(|(_, (count, _))| *count));
            ProcessReport {
                pid,
                comm,
                unit: cgroup.and_then(|(_, (_, unit))| unit.map(str::to_owned)),
                cgroup: cgroup.map(|(path, _)| (*path).to_owned()),
                ns_pid: ns_pids.get(&pid).copied(),
                times,
                threads,
            }
        })
        .collect();
    processes.sort_by_key(|process| {
        (
            std::cmp::Reverse(process.times.amount(ProfileType::Cpu)),
            process.pid,
        )
    });
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
        profile::Window,
        symbolize::{SymbolizedSample, SymbolizedStack},
    };

    /// What `/threads` reports of `times`: (cpu_ns, samples, blocked ns,
    /// runnable ns); off_cpu_ns is their sum (checked in the JSON below).
    fn reported(times: &Times) -> (u64, u64, u64, u64) {
        let json = serde_json::to_value(times).expect("serializable");
        let field = |name: &str| json[name].as_u64().unwrap_or_else(|| panic!("{name} in {json}"));
        assert_eq!(
            field("off_cpu_ns"),
            field("off_cpu_blocked_ns") + field("off_cpu_runnable_ns")
        );
        (
            field("cpu_ns"),
            field("samples"),
            field("off_cpu_blocked_ns"),
            field("off_cpu_runnable_ns"),
        )
    }

    #[test]
    fn sums_threads_into_processes_busiest_first() {
        use SampleKind::{Cpu, OffCpuBlocked, OffCpuRunnable};
        let stack = Arc::new(SymbolizedStack {
            locations: Box::new([]),
        });
        let unit = Some(Arc::new(crate::cgroup::Cgroup::from_path(
            "/system.slice/a.service",
        )));
        let sample = |kind, pid, tid, name: &str, count, ns| SymbolizedSample {
            kind,
            pid,
            tid,
            comm: format!("proc{pid}").into(),
            readable_by: crate::collect::ReadableBy::Privileged,
            thread_name: name.into(),
            stack: stack.clone(),
            count,
            amount: ns,
            cgroup: (pid == 2).then(|| unit.clone()).flatten(),
            ns_pid: (pid == 2).then_some(7),
        };
        let profile = Profile {
            window: Window {
                start_ms: 1_000,
                end_ms: 6_000,
            },
            frequency: 99,
            alloc_interval: 0,
            profile_type: crate::kind::ProfileType::Wall,
            samples: vec![
                sample(Cpu, 1, 1, "main", 1, 10),
                sample(OffCpuBlocked, 1, 1, "main", 4, 9_000),
                sample(Cpu, 2, 20, "worker", 5, 500),
                sample(Cpu, 2, 21, "io", 1, 100),
                sample(OffCpuBlocked, 2, 21, "io", 3, 3_000),
                sample(OffCpuRunnable, 2, 21, "io", 1, 40),
                sample(Cpu, 2, 20, "worker", 2, 200),
                sample(OffCpuRunnable, 2, 20, "worker", 2, 60),
                // A thread that only waited.
                sample(OffCpuBlocked, 2, 22, "idle", 1, 50_000),
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
        assert_eq!(
            (busiest.pid, reported(&busiest.times)),
            (2, (800, 8, 53_000, 100)),
            "CPU samples and ns from CPU samples only; waits by kind"
        );
        assert_eq!(
            busiest
                .threads
                .iter()
                .map(|thread| (thread.tid, &*thread.thread_name, reported(&thread.times)))
                .collect::<Vec<_>>(),
            vec![
                (20, "worker", (700, 7, 0, 60)),
                (21, "io", (100, 1, 3_000, 40)),
                (22, "idle", (0, 0, 50_000, 0)),
            ],
            "sorted by CPU time, however long a thread waited"
        );
        assert_eq!(report.processes[1].comm, "proc1");
        assert_eq!(reported(&report.processes[1].times), (10, 1, 9_000, 0));
        assert_eq!(
            (busiest.unit.as_deref(), busiest.cgroup.as_deref(), busiest.ns_pid),
            (Some("a.service"), Some("/system.slice/a.service"), Some(7))
        );
        assert_eq!(
            (report.processes[1].unit.as_deref(), report.processes[1].ns_pid),
            (None, None)
        );
        let json = serde_json::to_value(&report.processes[1]).expect("serializable");
        assert_eq!(
            json["threads"][0],
            serde_json::json!({
                "tid": 1, "thread_name": "main", "cpu_ns": 10, "samples": 1,
                "off_cpu_ns": 9_000, "off_cpu_blocked_ns": 9_000, "off_cpu_runnable_ns": 0,
                "allocs": 0, "alloc_bytes": 0, "frees": 0, "freed_bytes": 0, "freed_lifetime_ns": 0
            }),
            "flat fields, off-CPU and allocation ones always present"
        );
        assert_eq!(
            (json["cpu_ns"].as_u64(), json["off_cpu_ns"].as_u64()),
            (Some(10), Some(9_000))
        );
    }
}
