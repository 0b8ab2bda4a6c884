//! What each worker process is for, so that `ps` and `top` tell them apart.
//! Exec names a process after the file it ran (`exe` for
//! `/proc/self/exe`, a descriptor's number for a file opened beforehand),
//! so a worker names itself once it runs (`profilerd-sym`), and its command
//! line says the same (`profilerd symbolize-worker symbols`).

/// The daemon's three kinds of worker; each runs the same requests, for
/// its own client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerRole {
    /// The symbolizer's: names of native frames, perf maps, Python symbols.
    Symbols,
    /// The unwind-table manager's: CFI compiled into rows.
    UnwindTables,
    /// The allocation tracer's: allocator symbols to probe.
    Allocations,
}

impl WorkerRole {
    pub const ALL: [Self; 3] = [Self::Symbols, Self::UnwindTables, Self::Allocations];

    /// The argument after the worker's subcommand.
    pub fn arg(self) -> &'static str {
        match self {
            Self::Symbols => "symbols",
            Self::UnwindTables => "unwind-tables",
            Self::Allocations => "allocations",
        }
    }

    /// The process name (`comm`: 15 bytes at most, or the kernel cuts it).
    pub fn comm(self) -> &'static str {
        match self {
            Self::Symbols => "profilerd-sym",
            Self::UnwindTables => "profilerd-unw",
            Self::Allocations => "profilerd-alloc",
        }
    }

    pub fn from_arg(arg: &std::ffi::OsStr) -> Option<Self> {
        Self::ALL.into_iter().find(|role| arg == role.arg())
    }
}

/// Names this process after `role`. Cosmetic: a failure leaves the name
/// exec gave it.
pub fn name_this_process(role: WorkerRole) {
    let Ok(name) = std::ffi::CString::new(role.comm()) else {
        return;
    };
    if let Err(err) = nix::sys::prctl::set_name(&name) {
        eprintln!(
            "profilerd symbolize-worker: naming the process {}: {err}",
            role.comm()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_comm_and_arguments_name_one_role() {
        for role in WorkerRole::ALL {
            assert!(role.comm().len() <= 15, "{} is cut by the kernel", role.comm());
            assert_eq!(WorkerRole::from_arg(role.arg().as_ref()), Some(role));
        }
        assert_eq!(WorkerRole::from_arg("exe".as_ref()), None);
    }

    #[test]
    fn a_worker_names_itself() {
        // A thread of the test process names itself as a worker would (the
        // name is per thread: the test harness's other threads keep theirs).
        std::thread::spawn(|| {
            name_this_process(WorkerRole::UnwindTables);
            let comm = std::fs::read_to_string("/proc/thread-self/comm").expect("our comm");
            assert_eq!(comm.trim_end(), "profilerd-unw");
        })
        .join()
        .expect("the naming thread");
    }
}
