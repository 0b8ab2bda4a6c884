//! Symbolization of user binaries in a supervised worker process.
//!
//! Any local user decides what the daemon parses: the ELF and DWARF of
//! every binary they run. A panic, a SIGBUS on a file truncated while it is
//! mapped, an endless loop or runaway memory inside the parser must cost at
//! most that file's symbols and a bounded delay, never the daemon. So the
//! daemon opens each file itself (safely: see `collect::process_snapshot`)
//! and hands the descriptor to a worker process that has no capabilities,
//! runs as nobody (when the daemon is root), has a memory limit, and must
//! answer each request within a deadline. A worker that crashes or misses
//! its deadline is killed and restarted; a file that brings it down twice is
//! quarantined: its frames stay `[unknown] file+0xoffset`.

mod allocator_client;
mod allocator_elf;
mod debug_file;
mod gnu_hash;
mod perf_map_client;
mod perf_map_text;
mod positional;
mod protocol;
mod python_elf;
mod resident;
mod role;
mod sandbox;
mod server;
mod unwind_client;
mod unwind_elf;
mod unwind_rules;
mod unwind_table;
#[cfg(test)]
mod unwind_test_cfi;

use std::{
    collections::{HashMap, HashSet},
    ffi::OsString,
    fs::File,
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use nix::{
    errno::Errno,
    poll::{PollFd, PollFlags, PollTimeout, poll},
};

use crate::error::Chain;
pub use allocator_client::AllocatorError;
pub use perf_map_client::{JitSymbols, PerfMapError};
pub use protocol::{FileIdentity, LoadSegment, MAX_TABLE_ROWS, PythonSymbols, Response, SymbolLine, Symbols};
use protocol::{MAX_RESPONSE_BYTES, ProtocolError, Request};
pub use role::WorkerRole;
pub use unwind_client::{FileUnwindTable, UnwindTableError};

/// The hidden subcommand that runs [`run_worker`].
pub const SUBCOMMAND: &str = "symbolize-worker";
/// Failures (crash or missed deadline) that quarantine a file.
const QUARANTINE_AFTER: u8 = 2;
/// Files remembered as failed or quarantined; past this the oldest knowledge
/// is dropped (a file then gets two more tries).
const MAX_REMEMBERED_FAILURES: usize = 4096;
/// After a worker fails to start, wait this long before trying again.
const RESPAWN_BACKOFF: Duration = Duration::from_secs(1);
/// A worker is replaced (not counted as a failure) after this many requests,
/// so that whatever a parser leaks cannot build up to its memory limit and
/// be blamed on an innocent file.
const RECYCLE_AFTER_REQUESTS: u64 = 20_000;

/// The executable a worker runs.
#[derive(Clone, Debug)]
pub enum WorkerProgram {
    /// Executed by path, which the worker resolves after it has dropped its
    /// privileges: every directory on the way must be open to `nobody`.
    Path(PathBuf),
    /// Executed through a descriptor opened while still privileged, so the
    /// worker need not reach the file's path (a build under `/root`, mode
    /// 0700). The descriptor survives fork; exec opens the file through it
    /// before close-on-exec drops it.
    Opened(Arc<File>),
}

impl WorkerProgram {
    /// Opens `path` now, with the caller's rights, for workers to run.
    pub fn open(path: impl AsRef<Path>) -> std::io::Result<Self> {
        File::open(path).map(|file| Self::Opened(Arc::new(file)))
    }

    /// What the worker passes to exec (in the forked child, whose
    /// descriptor table is a copy of ours).
    fn exec_path(&self) -> PathBuf {
        match self {
            Self::Path(path) => path.clone(),
            Self::Opened(file) => PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd())),
        }
    }
}

#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// How to start a worker: a program and its arguments.
    pub program: WorkerProgram,
    pub args: Vec<OsString>,
    /// RLIMIT_DATA of the worker (its heap; mapped files do not count).
    pub memory_bytes: u64,
    /// How long one request (one file) may take.
    pub deadline: Duration,
    /// How long compiling one file's unwind table may take. `this_binary`
    /// makes it the symbols' deadline: the largest tables at hand compile
    /// in about 50 ms (libLLVM-15, 1 M rows; chromium's 57 k rows in 4 ms),
    /// and the worker's bounds (16 M rows, 256 MiB of CFI evaluated) keep a
    /// hostile file to a few seconds.
    pub table_deadline: Duration,
    /// Symbol requests ask for file:line and inlined frames from system
    /// debug files too (`--debug-file-lines`).
    pub debug_file_lines: bool,
}

impl WorkerConfig {
    /// This very binary (even if replaced on disk since) in worker mode, as
    /// a `role` worker. `/proc/self/exe` is a magic link: exec follows it to
    /// the file without walking the directories of its path.
    pub fn this_binary(role: WorkerRole, memory_bytes: u64, deadline: Duration) -> Self {
        Self {
            program: WorkerProgram::Path(PathBuf::from("/proc/self/exe")),
            args: vec![SUBCOMMAND.into(), role.arg().into()],
            memory_bytes,
            deadline,
            table_deadline: deadline,
            debug_file_lines: false,
        }
    }
}

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("the file is quarantined")]
    Quarantined,
    #[error("no symbolizer worker is running: {0}")]
    Unavailable(String),
    #[error("the symbolizer worker died while reading the file")]
    Crashed,
    #[error("the symbolizer worker missed its deadline of {0:?}")]
    Deadline(Duration),
    #[error("the symbolizer worker broke the protocol: {0}")]
    Protocol(String),
}

/// Counters for metrics (cumulative).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerStats {
    pub requests: u64,
    pub restarts_crashed: u64,
    pub restarts_deadline: u64,
    pub restarts_protocol: u64,
    pub spawn_failures: u64,
    pub quarantined: u64,
    pub quarantine_skips: u64,
    /// Workers replaced after RECYCLE_AFTER_REQUESTS requests.
    pub recycled: u64,
}

struct Running {
    child: Child,
    socket: OwnedFd,
    requests: u64,
}

/// The daemon's end: starts, feeds, times and restarts the worker.
pub struct WorkerClient {
    config: WorkerConfig,
    running: Option<Running>,
    failures: HashMap<FileIdentity, u8>,
    quarantined: HashSet<(u64, u64)>,
    not_before: Option<Instant>,
    pub stats: WorkerStats,
}

impl WorkerClient {
    pub fn new(config: WorkerConfig) -> Self {
        Self {
            config,
            running: None,
            failures: HashMap::new(),
            quarantined: HashSet::new(),
            not_before: None,
            stats: WorkerStats::default(),
        }
    }

    /// Symbolizes `offsets` of the open file `fd` (identified by `identity`).
    pub fn symbolize(
        &mut self,
        fd: &OwnedFd,
        identity: FileIdentity,
        offsets: &[u64],
    ) -> Result<Response, WorkerError> {
        let request = Request {
            file: Some(identity),
            offsets: offsets.to_vec(),
            unwind_table: false,
            allocator: false,
            perf_map: None,
            debug_file_lines: self.config.debug_file_lines,
        };
        self.supervised(fd, &request, self.config.deadline, |response| {
            if response.error.is_empty() && response.symbols.len() != offsets.len() {
                return Err(WorkerError::Protocol(format!(
                    "{} answers for {} offsets",
                    response.symbols.len(),
                    offsets.len()
                )));
            }
            Ok(response)
        })
    }

    /// One request under supervision: refused for a quarantined file; a
    /// worker that crashes, misses `deadline`, breaks the protocol or gives
    /// an answer `accept` rejects is killed, and the file held responsible.
    fn supervised<T>(
        &mut self,
        fd: &OwnedFd,
        request: &Request,
        deadline: Duration,
        accept: impl FnOnce(Response) -> Result<T, WorkerError>,
    ) -> Result<T, WorkerError> {
        let identity = request.file.unwrap_or_default();
        if self.quarantined.contains(&(identity.dev, identity.inode)) {
            self.stats.quarantine_skips += 1;
            return Err(WorkerError::Quarantined);
        }
        self.stats.requests += 1;
        let result = self.exchange(request, fd, deadline).and_then(accept);
        match &result {
            Err(WorkerError::Crashed) => self.stats.restarts_crashed += 1,
            Err(WorkerError::Deadline(_)) => self.stats.restarts_deadline += 1,
            Err(WorkerError::Protocol(_)) => self.stats.restarts_protocol += 1,
            Err(WorkerError::Quarantined | WorkerError::Unavailable(_)) | Ok(_) => return result,
        }
        // The worker is gone or not to be trusted: kill it (a new one starts
        // with the next request), and hold the file responsible.
        self.stop();
        let failures = self.failures.entry(identity).or_default();
        *failures += 1;
        if *failures >= QUARANTINE_AFTER {
            self.failures.remove(&identity);
            if self.quarantined.len() >= MAX_REMEMBERED_FAILURES {
                self.quarantined.clear();
            }
            self.quarantined.insert((identity.dev, identity.inode));
            self.stats.quarantined += 1;
            tracing::warn!(
                dev = identity.dev,
                inode = identity.inode,
                "quarantined a file that brought the symbolizer worker down {QUARANTINE_AFTER} times"
            );
        } else if self.failures.len() > MAX_REMEMBERED_FAILURES {
            self.failures.clear();
        }
        result
    }

    fn exchange(
        &mut self,
        request: &Request,
        fd: &OwnedFd,
        timeout: Duration,
    ) -> Result<Response, WorkerError> {
        let deadline = Instant::now() + timeout;
        if self
            .running
            .as_ref()
            .is_some_and(|running| running.requests >= RECYCLE_AFTER_REQUESTS)
        {
            self.stop();
            self.stats.recycled += 1;
        }
        let running = self.running()?;
        running.requests += 1;
        let socket = running.socket.as_fd();
        let answer = protocol::send_frame(socket, request, Some(fd.as_fd())).and_then(|()| {
            protocol::recv_frame_without_fd(socket, MAX_RESPONSE_BYTES, || wait_readable(socket, deadline))
        });
        let body = answer.map_err(|err| self.lost(err, timeout))?;
        protocol::decode_response(body).map_err(|err| WorkerError::Protocol(err.to_string()))
    }

    /// Classifies a failed exchange.
    fn lost(&mut self, err: ProtocolError, timeout: Duration) -> WorkerError {
        match err {
            ProtocolError::Closed | ProtocolError::Io(_) => {
                if let Some(running) = &mut self.running
                    && let Ok(Some(status)) = running.child.try_wait()
                {
                    tracing::warn!("the symbolizer worker died: {status}");
                }
                WorkerError::Crashed
            }
            ProtocolError::TimedOut => WorkerError::Deadline(timeout),
            other => WorkerError::Protocol(Chain(&other).to_string()),
        }
    }

    /// The running worker, started if there is none.
    fn running(&mut self) -> Result<&mut Running, WorkerError> {
        if let Some(running) = self.running.take() {
            return Ok(self.running.insert(running));
        }
        if self.not_before.is_some_and(|at| Instant::now() < at) {
            return Err(WorkerError::Unavailable("restarting after a failed start".into()));
        }
        match self.spawn() {
            Ok(running) => {
                self.not_before = None;
                Ok(self.running.insert(running))
            }
            Err(err) => {
                self.stats.spawn_failures += 1;
                self.not_before = Some(Instant::now() + RESPAWN_BACKOFF);
                tracing::error!("starting the symbolizer worker failed: {err}");
                Err(WorkerError::Unavailable(err.to_string()))
            }
        }
    }

    fn spawn(&self) -> std::io::Result<Running> {
        use std::os::unix::process::CommandExt as _;
        let (ours, theirs) = protocol::socket_pair()?;
        let memory = self.config.memory_bytes;
        let mut command = Command::new(self.config.program.exec_path());
        command
            .arg0("profilerd")
            .args(&self.config.args)
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // SAFETY: `confine` makes only async-signal-safe calls (see there).
        unsafe {
            command.pre_exec(move || sandbox::confine(memory));
        }
        let child = command.spawn()?;
        Ok(Running {
            child,
            socket: ours,
            requests: 0,
        })
    }

    /// The running worker's pid, if one runs.
    pub fn worker_pid(&self) -> Option<u32> {
        self.running.as_ref().map(|running| running.child.id())
    }

    /// Kills and reaps the worker, if any.
    pub fn stop(&mut self) {
        if let Some(mut running) = self.running.take() {
            let _ = running.child.kill();
            let _ = running.child.wait();
        }
    }
}

impl Drop for WorkerClient {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until `socket` is readable or `deadline` passes.
fn wait_readable(socket: BorrowedFd<'_>, deadline: Instant) -> Result<(), ProtocolError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ProtocolError::TimedOut);
        }
        let timeout = PollTimeout::try_from(left.as_millis().max(1)).unwrap_or(PollTimeout::MAX);
        match poll(&mut [PollFd::new(socket, PollFlags::POLLIN)], timeout) {
            Ok(ready) if ready > 0 => return Ok(()),
            Ok(_) | Err(Errno::EINTR) => {}
            Err(errno) => return Err(std::io::Error::from(errno).into()),
        }
    }
}

/// The worker process's main: serve the daemon on standard input (the
/// socket it was given), once the sandbox is verified.
pub fn run_worker() -> std::process::ExitCode {
    if let Err(err) = sandbox::verify_unprivileged() {
        eprintln!("profilerd symbolize-worker: refusing to run: {err}");
        return std::process::ExitCode::FAILURE;
    }
    if let Some(role) = std::env::args_os()
        .nth(2)
        .and_then(|arg| WorkerRole::from_arg(&arg))
    {
        role::name_this_process(role);
    }
    // SAFETY: fd 0 is the socket the daemon passed as standard input; from
    // here on this function owns it.
    let socket = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(0) };
    match server::serve(socket) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("profilerd symbolize-worker: {}", Chain(&err));
            std::process::ExitCode::FAILURE
        }
    }
}
