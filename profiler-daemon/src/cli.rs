//! Command-line interface. `profilerd` alone runs the daemon.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};
use profiler_common::maps;

use crate::{
    collect::{DEFAULT_MAX_OPEN_FILES, MapSizes, OffCpuOptions, SamplerOptions, UnwindMode},
    kind::ProfileType,
    pipeline::{PipelineOptions, SymbolizerOptions},
    procfs::ProcRoot,
    serve::{ListenAddress, connections::ConnectionLimits, scrape::ScrapeLimits},
    store::StoreConfig,
};

#[derive(Debug, Parser)]
#[command(
    name = "profilerd",
    version,
    about = "System-wide continuous CPU profiler (eBPF), serving pprof"
)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub daemon: DaemonArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Record a profile for a while and write it to a file, like `perf record`.
    Record(Box<RecordArgs>),
    /// Check a config file and print the settings it results in.
    CheckConfig {
        /// The TOML file, e.g. /etc/profilerd/profilerd.toml.
        file: PathBuf,
    },
    /// The symbolizer worker (started by the daemon itself, never by hand).
    #[command(name = "symbolize-worker", hide = true)]
    SymbolizeWorker,
}

#[derive(Debug, Clone, Args)]
pub struct SamplingArgs {
    /// Samples per second on each CPU.
    #[arg(long, default_value_t = 99, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub frequency: u64,
    /// How often the BPF maps are drained, in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(50..=60_000))]
    pub drain_interval_ms: u64,
    /// Capacity of each BPF counts map (distinct thread+stack pairs per drain).
    #[arg(long, default_value_t = maps::DEFAULT_COUNTS_ENTRIES, value_parser = clap::value_parser!(u32).range(1..=1 << 22))]
    pub counts_map_entries: u32,
    /// Capacity of each user stack-trace map (distinct user stacks per drain).
    #[arg(long, default_value_t = maps::DEFAULT_USER_STACKS_ENTRIES, value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    pub user_stack_map_entries: u32,
    /// Capacity of each kernel stack-trace map at most: without --off-cpu
    /// each gets 8 entries per sample a drain can hold (a power of two, at
    /// least 1024), this its ceiling.
    #[arg(long, default_value_t = maps::DEFAULT_KERNEL_STACKS_ENTRIES, value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    pub kernel_stack_map_entries: u32,
    /// Descriptors held open for mapped files (so binaries stay readable
    /// after their process exits); past it the least recently used close.
    #[arg(long, default_value_t = DEFAULT_MAX_OPEN_FILES as u32, value_parser = clap::value_parser!(u32).range(16..=65_536))]
    pub max_open_files: u32,
    /// Memory (heap) limit of the symbolizer worker process, in MiB.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(64..=65_536))]
    pub symbolizer_memory_mb: u64,
    /// How long the symbolizer worker may take to read one file, in
    /// milliseconds; past it the worker is killed and restarted.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub symbolizer_deadline_ms: u64,
    /// Also read file:line and inlined frames from separate debug files
    /// (`/usr/lib/debug/.build-id/`, e.g. Debian's `libc6-dbg`). Off, their
    /// symbol tables still name every function; on, the symbolizer worker
    /// holds each one's decompressed DWARF (about 10 MB for glibc's).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub debug_file_lines: bool,
    /// How user stacks are walked: `auto` unwinds with each file's CFI
    /// (`.eh_frame`) where the daemon has loaded it, and frame pointers
    /// elsewhere; `frame-pointers` uses frame pointers only.
    #[arg(long, value_enum, default_value_t = UnwindMode::Auto)]
    pub unwind: UnwindMode,
    /// Kernel memory for the unwind tables (`--unwind auto`) at most, in
    /// MiB, allocated in groups of 1 MiB as tables are loaded; past it the
    /// least recently sampled files' tables are evicted.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub unwind_table_memory_mb: u64,
    /// The percentage of `--unwind-table-memory-mb` each non-root user's
    /// tables keep when others need the room; root and the system services
    /// keep the rest. A user may borrow beyond it while there is room nobody
    /// else needs; past it, its tables evict only its own.
    #[arg(long, default_value_t = crate::shares::DEFAULT_USER_SHARE_PERCENT, value_parser = clap::value_parser!(u64).range(0..=100))]
    pub unwind_table_user_share_percent: u64,
    /// Off-CPU profiling: where threads wait (`?type=offcpu`, `wall`). Off
    /// by default: it costs a stack walk per context switch (see the README).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub off_cpu: bool,
    /// Off-CPU: record one context switch in N, weighted N (1: every one).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub off_cpu_sample_every: u64,
    /// Off-CPU: record at most about this many context switches per CPU per
    /// second (the odds halve while a CPU switches faster; each recorded
    /// wait weighs one over its odds). 0: no limit.
    #[arg(long, default_value_t = crate::collect::DEFAULT_OFF_CPU_BUDGET, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub off_cpu_budget: u64,
    /// Off-CPU: drop waits shorter than this, in microseconds (0: keep all).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000_000))]
    pub off_cpu_min_us: u64,
    /// Do not walk CPython frames: Python processes then profile as the
    /// interpreter's native frames (`python_frames = false` in the file).
    /// On by default; its cost is in the README.
    #[arg(long, default_value_t = false)]
    pub no_python_frames: bool,
    /// Allocation profiles: mean bytes between sampled allocations, as Go
    /// and jemalloc sample (0: record every allocation, at a higher cost).
    #[arg(long, default_value_t = crate::collect::DEFAULT_ALLOC_SAMPLE_BYTES, value_parser = clap::value_parser!(u64).range(0..=1 << 30))]
    pub alloc_sample_bytes: u64,
    /// Allocation profiles: processes traced at once, at most.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub alloc_max_processes: u64,
    /// Allocation profiles: a traced process whose probes cost it more than
    /// this percentage of its CPU time stops being traced.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub alloc_budget_percent: u64,
    /// Allocation profiles: trace the processes of this name (their comm)
    /// while the daemon runs, not only for windows asked for; their heap is
    /// then at /debug/pprof/heap?pid=P, and pushed. Repeatable.
    #[arg(long = "alloc-trace-comm", value_name = "COMM")]
    pub alloc_trace_comms: Vec<String>,
    /// Allocation profiles: trace the processes of this systemd unit
    /// (`nginx.service`) while the daemon runs. Repeatable.
    #[arg(long = "alloc-trace-unit", value_name = "UNIT")]
    pub alloc_trace_units: Vec<String>,
    /// Allocation profiles: trace this process while the daemon runs.
    /// Repeatable.
    #[arg(long = "alloc-trace-pid", value_name = "PID")]
    pub alloc_trace_pids: Vec<u32>,
    /// Where the sampled processes' /proc is: the host's, when the daemon
    /// runs in a container with the host's /proc mounted elsewhere (e.g.
    /// /host/proc, with the host's PID namespace for the sampler's pids).
    #[arg(long, default_value = "/proc", value_parser = parse_proc_root)]
    pub proc_root: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct DaemonArgs {
    /// Settings file (TOML); flags given here override it. Default:
    /// /etc/profilerd/profilerd.toml when it exists.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address of the HTTP server: IP:PORT, or unix:/absolute/path for a
    /// Unix socket. Profiles reveal code and process names: keep it on
    /// loopback (or a Unix socket) unless a proxy guards it.
    #[arg(long, default_value = "127.0.0.1:7040")]
    pub listen: ListenAddress,
    /// How long samples are kept, in seconds.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub retention_seconds: u64,
    /// Upper bound of the sample store's memory, in MiB.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub store_max_mb: u64,
    /// The percentage of `--store-max-mb` each non-root user's samples keep
    /// once the store is full; root and the system services keep the rest.
    /// A user may borrow beyond it while the store has room; once full, the
    /// oldest samples of whoever is over their share go first.
    #[arg(long, default_value_t = crate::shares::DEFAULT_USER_SHARE_PERCENT, value_parser = clap::value_parser!(u64).range(0..=100))]
    pub store_user_share_percent: u64,
    /// Members of this group (and root) see every process; any other local
    /// user sees only the processes they own.
    #[arg(long, default_value = crate::serve::access::DEFAULT_GROUP)]
    pub access_group: String,
    /// A file holding a bearer token: a request with `Authorization: Bearer
    /// TOKEN` sees every process (scrapers on other machines).
    #[arg(long)]
    pub access_token_file: Option<PathBuf>,
    /// Listen beyond loopback without a token or a client CA: anyone who can
    /// reach the port is refused profiles (403) unless they are a local
    /// user, but the daemon starts. Without it, listening beyond loopback
    /// needs a token or a client CA.
    #[arg(long)]
    pub insecure: bool,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub push: crate::push::flags::PushArgs,
}

/// TLS on the TCP listener. SIGHUP re-reads the three files.
#[derive(Debug, Clone, Args)]
pub struct TlsArgs {
    /// The server's certificate chain (PEM: its certificate first, then the
    /// intermediates). With --tls-key-file, the listener speaks only TLS.
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key of the certificate (PEM: PKCS#8, RSA or EC).
    #[arg(long)]
    pub tls_key_file: Option<PathBuf>,
    /// A CA (PEM): clients must present a certificate it signed (mutual
    /// TLS), and such a client sees every process, like the token's holder.
    #[arg(long)]
    pub tls_client_ca_file: Option<PathBuf>,
}

/// Bounds on HTTP connections, so that idle or slow clients cannot exhaust
/// the daemon or lock scrapers out.
#[derive(Debug, Clone, Args)]
pub struct HttpArgs {
    /// Most HTTP connections held at once. At the limit, a new connection
    /// closes the one idle the longest, or is refused if every one has a
    /// request in flight.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub http_max_connections: u64,
    /// How long a client has to send a request's headers, in milliseconds
    /// (from connecting, or from its first byte after an idle spell).
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(100..=300_000))]
    pub http_header_timeout_ms: u64,
    /// How long a keep-alive connection may wait for its next request, in seconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub http_idle_timeout_seconds: u64,
    /// Profiles computed at once (queries and encodings; requests for the
    /// same one share it).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub scrape_concurrency: u64,
    /// Profiles waiting for their turn, at most; past it a request is
    /// refused at once (503 with Retry-After).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(0..=4096))]
    pub scrape_queue: u64,
    /// Memory for profiles being encoded and answers kept for requests
    /// that ask for the same, in MiB; a profile that would need more waits,
    /// or is refused (503).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(4..=65_536))]
    pub scrape_memory_mb: u64,
    /// A scrape is answered from a drain asked for at most this many
    /// milliseconds before it arrived (0: always its own drain), so that
    /// scrapes arriving together share one answer.
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u64).range(0..=1000))]
    pub scrape_share_ms: u64,
}

impl HttpArgs {
    pub fn limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            // Within the flag's range, which fits any usize we build for.
            max_connections: usize::try_from(self.http_max_connections).unwrap_or(usize::MAX),
            header_timeout: Duration::from_millis(self.http_header_timeout_ms),
            idle_timeout: Duration::from_secs(self.http_idle_timeout_seconds),
        }
    }

    pub fn scrape_limits(&self) -> ScrapeLimits {
        // Within the flags' ranges, which fit any usize we build for.
        let size = |value: u64| usize::try_from(value).unwrap_or(usize::MAX);
        ScrapeLimits {
            concurrency: size(self.scrape_concurrency),
            queue: size(self.scrape_queue),
            memory_bytes: size(self.scrape_memory_mb << 20),
            share: Duration::from_millis(self.scrape_share_ms),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// `comm;root;...;leaf COUNT` lines (flamegraph.pl, inferno, speedscope).
    Folded,
    /// Gzipped pprof protobuf (go tool pprof, Parca, Pyroscope, speedscope).
    Pprof,
    /// An interactive SVG flame graph.
    Svg,
}

/// A unit name as `/pprof?unit=` accepts it.
fn parse_unit(value: &str) -> Result<String, String> {
    if crate::cgroup::unit_of(&format!("/{value}")).as_deref() == Some(value) {
        Ok(value.to_owned())
    } else {
        Err("expected a systemd unit name such as nginx.service (a user's unit: user@1000.service/app.service)".to_owned())
    }
}

/// `--proc-root`: a mounted proc file system.
fn parse_proc_root(value: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(value);
    crate::procfs::check(&path).map(|()| path)
}

/// `--type`: the names `?type=` takes.
fn parse_profile_type(value: &str) -> Result<ProfileType, String> {
    ProfileType::parse(value).ok_or_else(|| format!("expected {}", ProfileType::accepted()))
}

#[derive(Debug, Clone, Args)]
pub struct RecordArgs {
    /// Only this process (repeatable). Without it, the whole system.
    #[arg(long = "pid", value_parser = clap::value_parser!(u32).range(1..))]
    pub pids: Vec<u32>,
    /// Only the processes of this systemd unit (repeatable), e.g.
    /// `nginx.service`; with --pid, processes that are both.
    #[arg(long = "unit", value_parser = parse_unit)]
    pub units: Vec<String>,
    /// How long to record.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub seconds: u64,
    /// Where to write the profile; `-` is standard output.
    #[arg(long, short, default_value = "-")]
    pub output: PathBuf,
    #[arg(long, value_enum, default_value_t = Format::Folded)]
    pub format: Format,
    /// What to profile: `cpu` (where threads run), `offcpu` (where they
    /// wait: turns --off-cpu on) or `wall` (both). Folded and SVG output
    /// count samples for cpu, nanoseconds for offcpu and wall.
    #[arg(long = "type", default_value = "cpu", value_parser = parse_profile_type)]
    pub profile_type: ProfileType,
    /// Members of this group (and root) see every process; any other local
    /// user sees only the processes they own.
    #[arg(long, default_value = crate::serve::access::DEFAULT_GROUP)]
    pub access_group: String,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

impl SamplingArgs {
    /// The /proc of the sampled processes.
    pub fn proc_root(&self) -> ProcRoot {
        ProcRoot::new(self.proc_root.clone())
    }

    pub fn pipeline_options(&self, store: StoreConfig) -> PipelineOptions {
        PipelineOptions {
            sampler: SamplerOptions {
                frequency: self.frequency,
                drain_interval: Duration::from_millis(self.drain_interval_ms),
                map_sizes: MapSizes {
                    counts: self.counts_map_entries,
                    user_stacks: self.user_stack_map_entries,
                    kernel_stacks: self.kernel_stack_map_entries,
                },
                unwind: self.unwind,
                unwind_table_bytes: self.unwind_table_memory_mb << 20,
                unwind_table_user_share_percent: self.unwind_table_user_share_percent,
                off_cpu: OffCpuOptions {
                    enabled: self.off_cpu,
                    sample_every: self.off_cpu_sample_every,
                    budget: self.off_cpu_budget,
                    min_ns: self.off_cpu_min_us.saturating_mul(1000),
                },
                python_frames: !self.no_python_frames,
                alloc_sample_bytes: self.alloc_sample_bytes,
                alloc_max_processes: self.alloc_max_processes,
            },
            allocations: crate::collect::allocations::AllocationLimits {
                max_processes: usize::try_from(self.alloc_max_processes).unwrap_or(usize::MAX),
                budget_percent: self.alloc_budget_percent,
                ..Default::default()
            },
            alloc_targets: crate::collect::allocations::AllocTargets {
                pids: self.alloc_trace_pids.clone(),
                units: self.alloc_trace_units.clone(),
                comms: self.alloc_trace_comms.clone(),
            },
            proc_root: self.proc_root(),
            store,
            only_pids: Vec::new(),
            symbolizer: SymbolizerOptions {
                max_open_files: self.max_open_files as usize,
                worker_memory_bytes: self.symbolizer_memory_mb << 20,
                worker_deadline: Duration::from_millis(self.symbolizer_deadline_ms),
                debug_file_lines: self.debug_file_lines,
            },
        }
    }
}
