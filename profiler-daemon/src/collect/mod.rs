//! Stage 1: the BPF sampler and what the daemon reads out of it.
//!
//! [`Sampler`] loads and attaches the BPF program; [`Drainer`] empties its maps
//! into [`RawBatch`]es (with the off-CPU waits still going on, see `off_cpu`,
//! and the CPU threads used where no sample landed, see `thread_cpu`);
//! [`ProcessWatcher`] snapshots the memory mappings of every process the
//! sampler announces, while the process still exists;
//! [`unwind_tables::TableManager`] loads the CFI tables the sampler's own
//! user-stack walk reads. [`metrics`] registers what they count.

pub mod allocations;
mod batch;
mod btf;
mod clock;
mod drain;
mod kernel_names;
mod mapped_file;
pub mod metrics;
mod off_cpu;
mod proc_maps;
mod process_snapshot;
mod raw;
mod readable;
mod sampler;
mod thread_cpu;
pub mod unwind_tables;
mod watcher;

pub use drain::Drainer;
pub use kernel_names::{KernelLookup, KernelNamer, KernelNamesError};
pub use mapped_file::{
    DEFAULT_MAX_OPEN_FILES, FileKey, FileVersion, MappedFile, OpenFileStats, OpenFiles, Refusal,
};
pub use metrics::{DrainStatus, MapEntries};
pub use proc_maps::{MapsLine, fuse_on_path, parse_maps_line};
pub use process_snapshot::{MAX_FILES_PER_PROCESS, ProcessSnapshot, SnapshotMapping, SnapshotReader};
pub use raw::{
    BpfCounters, CpuCredits, OffCpuExact, RawBatch, RawSample, UNSAMPLED_CPU, UNSAMPLED_CPU_STACK_ID,
};
pub use readable::{ReadableBy, readable_by, readable_by_status};
pub use sampler::{
    DEFAULT_ALLOC_SAMPLE_BYTES, DEFAULT_OFF_CPU_BUDGET, MapSizes, OffCpuOptions, Sampler, SamplerOptions,
    UnwindMaps, UnwindMode,
};
pub use watcher::{ProcessNotice, ProcessWatcher, WatcherStats};

/// Errors from loading, attaching or reading the BPF side.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error("loading the BPF program failed (profilerd needs root, or CAP_BPF + CAP_PERFMON)")]
    Load(#[source] aya::EbpfError),
    #[error("BPF program {name}")]
    Program {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("attaching the sampler to CPU {cpu} failed")]
    AttachCpu {
        cpu: u32,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("listing online CPUs ({0})")]
    OnlineCpus(&'static str, #[source] std::io::Error),
    #[error("BPF map {name} is missing from the object")]
    MissingMap { name: &'static str },
    #[error("BPF map {name}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("BPF logger")]
    Logger(#[source] aya_log::Error),
}
