//! JIT-compiled code named from its runtime's perf map: the file
//! `/tmp/perf-PID.map` that Node (`--perf-basic-prof`), the JVM
//! (`jcmd PID Compiler.perfmap`), .NET (`DOTNET_PerfMapEnabled=1`) and
//! CPython 3.12+ (`-X perf`) write, one `START SIZE NAME` line per compiled
//! function, appended as they compile.
//!
//! The file lives in a directory every user may write and is written by the
//! process's owner: hostile input to a root daemon. So it is the file the
//! process itself would see (its own root's `/tmp`, its pid in its own
//! namespace), resolved inside that root with no symbolic link followed
//! anywhere on the way, opened without blocking, taken only if it is a
//! regular file owned by the process's owner (or root's, readable by
//! anyone: what the owner could read anyway), and read by the sandboxed
//! worker in bounded chunks from where the last read ended (runtimes
//! append). A later line for the same address wins over an earlier one.

use std::{
    collections::{BTreeMap, HashMap},
    os::fd::OwnedFd,
    sync::Arc,
    time::{Duration, Instant},
};

use nix::{
    fcntl::{OFlag, OpenHow, ResolveFlag},
    sys::stat::{Mode, SFlag, fstat},
};

use super::{resolver::Resolver, stack::Line, worker::FileIdentity};
use crate::procfs::ProcRoot;

/// A process's map is looked at again at most this often.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// Chunks (of 4 MiB) read per look: the rest waits for the next.
const CHUNKS_PER_CHECK: usize = 4;
/// What one process's map may make the daemon keep and read.
const MAX_SYMBOLS_PER_PROCESS: usize = 262_144;
const MAX_BYTES_PER_PROCESS: u64 = 256 << 20;
/// Processes with a map kept at once; past it, the least recently looked at go.
const MAX_PROCESSES: usize = 256;

/// Perf map figures for /metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct PerfMapStats {
    /// Chunks read by the worker.
    pub reads: u64,
    /// Maps not read: not a regular file, another user's, a link.
    pub refused: u64,
    /// Lines that were no symbol.
    pub bad_lines: u64,
    /// Maps that hit a bound (symbols, bytes): the rest is not read.
    pub capped: u64,
    /// Symbols held now.
    pub symbols: u64,
}

#[derive(Default)]
struct JitProcess {
    /// The map's (dev, inode) as last read: another file starts over.
    file: Option<(u64, u64)>,
    read_to: u64,
    /// By start: (end, the function as a frame shows it).
    symbols: BTreeMap<u64, (u64, Arc<[Line]>)>,
    checked: Option<Instant>,
    capped: bool,
}

pub struct PerfMaps {
    proc: ProcRoot,
    processes: HashMap<(u32, u32), JitProcess>,
    pub stats: PerfMapStats,
}

impl PerfMaps {
    pub fn new(proc: ProcRoot) -> Self {
        Self {
            proc,
            processes: HashMap::new(),
            stats: PerfMapStats::default(),
        }
    }

    /// The JIT-compiled function at `address` in the process, as a frame.
    pub fn lines(&self, pid: u32, instance: u32, address: u64) -> Option<Arc<[Line]>> {
        let process = self.processes.get(&(pid, instance))?;
        let (_, (end, name)) = process.symbols.range(..=address).next_back()?;
        (address < *end).then(|| name.clone())
    }

    pub fn exited(&mut self, pid: u32, instance: u32) {
        if let Some(process) = self.processes.remove(&(pid, instance)) {
            self.stats.symbols -= process.symbols.len() as u64;
        }
    }

    /// Reads what is new in the perf map of the process (`ns_pid`: its pid
    /// in its own namespace, the one in the file's name), at most once a
    /// second; a process without one is looked at again as often.
    pub fn refresh(&mut self, pid: u32, instance: u32, ns_pid: Option<u32>, resolver: &mut Resolver) {
        if !self.processes.contains_key(&(pid, instance)) && self.processes.len() >= MAX_PROCESSES {
            let oldest = self
                .processes
                .iter()
                .min_by_key(|(_, process)| process.checked)
                .map(|(key, _)| *key);
            if let Some((pid, instance)) = oldest {
                self.exited(pid, instance);
            }
        }
        let process = self.processes.entry((pid, instance)).or_default();
        if process.checked.is_some_and(|at| at.elapsed() < CHECK_EVERY) {
            return;
        }
        process.checked = Some(Instant::now());
        let (fd, identity) = match open(&self.proc, pid, ns_pid.unwrap_or(pid)) {
            Ok(Some(opened)) => opened,
            Ok(None) => return,
            Err(reason) => {
                self.stats.refused += 1;
                tracing::debug!(pid, "perf map not read: {reason}");
                return;
            }
        };
        if process.file != Some((identity.dev, identity.inode)) || identity.size < process.read_to {
            // Another file, or this one truncated: what it said is gone.
            self.stats.symbols -= process.symbols.len() as u64;
            *process = JitProcess {
                file: Some((identity.dev, identity.inode)),
                checked: process.checked,
                ..JitProcess::default()
            };
        }
        for _ in 0..CHUNKS_PER_CHECK {
            if process.capped || process.read_to >= identity.size {
                break;
            }
            let chunk = match resolver.perf_map(&fd, identity, process.read_to) {
                Ok(chunk) => chunk,
                Err(err) => {
                    tracing::debug!(pid, "perf map: {}", crate::error::Chain(&err));
                    break;
                }
            };
            self.stats.reads += 1;
            self.stats.bad_lines += chunk.bad_lines;
            let advanced = chunk.read_to > process.read_to;
            process.read_to = chunk.read_to;
            for (start, end, name) in chunk.symbols {
                if process.symbols.len() >= MAX_SYMBOLS_PER_PROCESS && !process.symbols.contains_key(&start) {
                    process.capped = true;
                    break;
                }
                // As the runtime wrote it: Node's `JS:*hot /srv/app.js:3:14`,
                // the JVM's `void Main.hot(int)`.
                if process
                    .symbols
                    .insert(start, (end, Line::named(name.into())))
                    .is_none()
                {
                    self.stats.symbols += 1;
                }
            }
            if process.read_to >= MAX_BYTES_PER_PROCESS {
                process.capped = true;
            }
            if process.capped {
                self.stats.capped += 1;
                tracing::info!(pid, "perf map past its bounds: the rest is not read");
            }
            if !advanced {
                break;
            }
        }
    }
}

/// The process's perf map as it sees it, if it has one it may show: None
/// without one; Err(why) for one that is refused.
fn open(proc: &ProcRoot, pid: u32, ns_pid: u32) -> Result<Option<(OwnedFd, FileIdentity)>, String> {
    let owner = proc.real_uid(pid).ok_or("the process's owner is unknown")?;
    // The magic link to its root is followed once, on purpose; everything
    // inside is resolved as if that were `/`, with no link followed.
    let root = match nix::fcntl::open(
        &proc.file(pid, "root"),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(root) => root,
        Err(_) => return Ok(None),
    };
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | OFlag::O_NOCTTY)
        .resolve(
            ResolveFlag::RESOLVE_IN_ROOT
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
    let fd = match nix::fcntl::openat2(&root, format!("tmp/perf-{ns_pid}.map").as_str(), how) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(nix::errno::Errno::ELOOP) => return Err("a symbolic link on the way".into()),
        Err(err) => return Err(format!("opening it: {err}")),
    };
    let stat = fstat(&fd).map_err(|err| format!("fstat: {err}"))?;
    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err("not a regular file".into());
    }
    let world_readable = stat.st_mode & 0o004 != 0;
    if stat.st_uid != owner && !(stat.st_uid == 0 && world_readable) {
        return Err(format!(
            "owned by uid {}, not by the process's owner {owner}",
            stat.st_uid
        ));
    }
    let identity = FileIdentity {
        dev: stat.st_dev,
        inode: stat.st_ino,
        size: u64::try_from(stat.st_size).unwrap_or(0),
        mtime_ns: stat.st_mtime * 1_000_000_000 + stat.st_mtime_nsec,
    };
    Ok(Some((fd, identity)))
}
