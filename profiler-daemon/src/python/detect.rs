//! From what the worker found in a mapped file to the sampler's entry for
//! a CPython process: the version's layout (a table, or the process's own
//! `_Py_DebugOffsets` from 3.13 on) and the runtime addresses. Every
//! process found is counted by version and outcome for /metrics; an
//! unknown version keeps native stacks.

use std::{collections::BTreeMap, sync::Mutex};

use profiler_common::python::PythonProcess;

use super::layout::{self, DEBUG_OFFSETS_LEN, DebugOffsetsError, Layout, Version};

/// A file's CPython symbols, as ELF virtual addresses (from the worker:
/// unchecked until the process's memory agrees).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonSymbols {
    pub runtime: u64,
    pub eval_start: u64,
    pub eval_size: u64,
    /// PY_VERSION_HEX; 0: unknown.
    pub version_hex: u32,
}

impl PythonSymbols {
    pub fn version(&self) -> Option<Version> {
        let major = (self.version_hex >> 24) as u8;
        let minor = (self.version_hex >> 16) as u8;
        (major != 0).then_some(Version { major, minor })
    }
}

/// A CPython process found, for the symbolizer (which names its code
/// objects with the same layout).
#[derive(Clone, Debug)]
pub struct Detected {
    pub pid: u32,
    pub instance: u32,
    pub layout: Layout,
}

#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    #[error("CPython {0}: no layout for this version")]
    UnknownVersion(String),
    #[error("reading _Py_DebugOffsets: {0}")]
    Read(std::io::Error),
    #[error("_Py_DebugOffsets: {0}")]
    DebugOffsets(#[from] DebugOffsetsError),
    #[error("_Py_DebugOffsets says {found}, the file {file}")]
    VersionMismatch { found: Version, file: Version },
    #[error("a frame field beyond the sampler's window ({0} bytes)")]
    Unwalkable(u16),
    #[error("addresses out of range")]
    BadAddresses,
}

impl DetectError {
    /// The outcome label in /metrics.
    pub fn outcome(&self) -> &'static str {
        match self {
            DetectError::UnknownVersion(_) => "unknown_version",
            DetectError::Read(_) => "unreadable",
            DetectError::DebugOffsets(_) | DetectError::VersionMismatch { .. } => "bad_debug_offsets",
            DetectError::Unwalkable(_) | DetectError::BadAddresses => "unsupported",
        }
    }
}

/// The sampler reads a frame's fields in one window of this many bytes.
const FRAME_WINDOW: u16 = 128;

/// The sampler's entry for a process whose file `symbols` is mapped with
/// load bias `bias`, and the layout it uses. `read` reads the process's
/// memory (for `_Py_DebugOffsets`).
pub fn entry(
    symbols: &PythonSymbols,
    bias: u64,
    read: impl FnOnce(u64, &mut [u8]) -> std::io::Result<()>,
) -> Result<(PythonProcess, Layout), DetectError> {
    let file_version = symbols.version();
    let runtime = symbols
        .runtime
        .checked_add(bias)
        .ok_or(DetectError::BadAddresses)?;
    let eval_start = symbols
        .eval_start
        .checked_add(bias)
        .ok_or(DetectError::BadAddresses)?;
    let eval_end = eval_start
        .checked_add(symbols.eval_size)
        .ok_or(DetectError::BadAddresses)?;
    let layout = match file_version {
        Some(version) if version >= (Version { major: 3, minor: 13 }) => {
            let mut bytes = vec![0; DEBUG_OFFSETS_LEN];
            read(runtime, &mut bytes).map_err(DetectError::Read)?;
            let layout = layout::from_debug_offsets(&bytes)?;
            if layout.version != version {
                return Err(DetectError::VersionMismatch {
                    found: layout.version,
                    file: version,
                });
            }
            layout
        }
        Some(version) => {
            layout::for_version(version).ok_or_else(|| DetectError::UnknownVersion(version.to_string()))?
        }
        None => return Err(DetectError::UnknownVersion("unknown".into())),
    };
    let widest = [
        layout.frame_previous.saturating_add(8),
        layout.frame_code.saturating_add(8),
        layout.frame_instruction.saturating_add(8),
        layout.frame_entry.map_or(0, |offset| offset.saturating_add(1)),
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    if widest > FRAME_WINDOW {
        return Err(DetectError::Unwalkable(widest));
    }
    Ok((layout.to_bpf(runtime, eval_start, eval_end), layout))
}

/// CPython processes found, by (version, outcome), for /metrics.
#[derive(Debug, Default)]
pub struct DetectionStats {
    /// Locked only to add a count or copy them out.
    counts: Mutex<BTreeMap<(String, &'static str), u64>>,
}

impl DetectionStats {
    pub fn count(&self, version: Option<Version>, outcome: &'static str) {
        let version = version.map_or_else(|| "unknown".to_owned(), |version| version.to_string());
        // A poisoned lock only means a panic elsewhere mid-count: the counts stand.
        let mut counts = self
            .counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *counts.entry((version, outcome)).or_default() += 1;
    }

    /// (version, outcome, processes).
    pub fn series(&self) -> Vec<(String, &'static str, u64)> {
        self.counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
            .map(|((version, outcome), count)| (version.clone(), *outcome, *count))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn symbols(version_hex: u32) -> PythonSymbols {
        PythonSymbols {
            runtime: 0x5b_7000,
            eval_start: 0x1_0000,
            eval_size: 0x8000,
            version_hex,
        }
    }

    #[test]
    fn a_known_version_gets_its_layout_at_runtime_addresses() {
        let (entry, layout) = entry(&symbols(0x030b_02f0), 0x1000, |_, _| unreachable!()).expect("3.11");
        assert_eq!(layout.version, Version { major: 3, minor: 11 });
        assert_eq!(
            (entry.runtime, entry.eval_start, entry.eval_end),
            (0x5b_8000, 0x1_1000, 0x1_9000)
        );
        assert_eq!(entry.version, 0x030b);
    }

    #[test]
    fn unknown_versions_and_bad_addresses_are_refused() {
        let err = entry(&symbols(0x0307_00f0), 0, |_, _| unreachable!()).unwrap_err();
        assert_eq!(err.outcome(), "unknown_version");
        assert_eq!(err.to_string(), "CPython 3.7: no layout for this version");
        assert_eq!(
            entry(&symbols(0), 0, |_, _| unreachable!())
                .unwrap_err()
                .outcome(),
            "unknown_version"
        );
        let err = entry(&symbols(0x030b_02f0), u64::MAX, |_, _| unreachable!()).unwrap_err();
        assert_eq!(err.outcome(), "unsupported");
    }

    #[test]
    fn from_3_13_the_process_is_asked() {
        let err = entry(&symbols(0x030d_00f0), 0, |_, _| {
            Err(std::io::Error::other("gone"))
        })
        .unwrap_err();
        assert_eq!(err.outcome(), "unreadable");
        let err = entry(&symbols(0x030d_00f0), 0, |_, bytes| {
            bytes.fill(0);
            Ok(())
        })
        .unwrap_err();
        assert_eq!(err.outcome(), "bad_debug_offsets");
    }
}
