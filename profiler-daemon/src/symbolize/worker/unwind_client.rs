//! The daemon asks the worker for a file's unwind table: compiled from
//! hostile CFI in the sandbox, checked again here before the daemon loads it
//! into BPF maps (a subverted worker is no more trusted than the file).

use std::{os::fd::OwnedFd, time::Duration};

use profiler_common::UnwindRow;

use crate::collect::{
    MappedFile,
    unwind_tables::{self, CompiledTable, TableCompiler},
};
use crate::error::Chain;

use super::{
    FileIdentity, LoadSegment, WorkerClient, WorkerError,
    protocol::{self, InvalidTable, Request},
};

/// Why a file got no unwind table.
#[derive(Debug, thiserror::Error)]
pub enum UnwindTableError {
    /// The worker failed (and was restarted) or the file is quarantined.
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// The worker read the file and found no table to make (not an x86-64
    /// ELF file, no CFI for its code, code beyond 4 GiB, over a bound...).
    #[error("no unwind table: {0}")]
    NoTable(String),
}

/// A file's unwind table, validated: rows sorted by pc (strictly), at most
/// [`MAX_TABLE_ROWS`](super::MAX_TABLE_ROWS), known rules, ending with a `NoInfo` row.
#[derive(Clone, Debug)]
pub struct FileUnwindTable {
    pub rows: Vec<UnwindRow>,
    /// The PT_LOAD segments: a mapping of the file at `start` from file
    /// offset `offset` has bias `start - (vaddr + (offset - file_offset))`
    /// for the segment whose file range holds `offset`.
    pub segments: Vec<LoadSegment>,
    /// GNU build id (empty if none).
    pub build_id: Vec<u8>,
    pub fdes: u32,
    pub fdes_skipped: u32,
    pub rows_before_merge: u32,
    pub unsupported_rows: u32,
    /// The sections used, e.g. ".eh_frame" or ".eh_frame+.debug_frame".
    pub source: String,
    /// As the worker measured it (reading the file included).
    pub compile_time: Duration,
    /// The file is a CPython interpreter.
    pub python: Option<protocol::PythonSymbols>,
}

impl WorkerClient {
    /// Compiles the unwind table of the open file `fd` (identified by
    /// `identity`), within `table_deadline`. A worker that crashes, misses
    /// the deadline or answers with a table that fails validation counts
    /// against the file as for [`WorkerClient::symbolize`].
    pub fn unwind_table(
        &mut self,
        fd: &OwnedFd,
        identity: FileIdentity,
    ) -> Result<FileUnwindTable, UnwindTableError> {
        let request = Request {
            file: Some(identity),
            unwind_table: true,
            ..Request::default()
        };
        let answer = self.supervised(fd, &request, self.config.table_deadline, |response| {
            if !response.error.is_empty() {
                return Ok(Err(protocol::bounded(response.error, protocol::MAX_NAME_BYTES)));
            }
            if response.build_id.len() > protocol::MAX_BUILD_ID_BYTES {
                return Err(WorkerError::Protocol(format!(
                    "a build id of {} bytes",
                    response.build_id.len()
                )));
            }
            let table = response
                .unwind_table
                .ok_or_else(|| WorkerError::Protocol("no table and no error".into()))?;
            let invalid = |err: InvalidTable| WorkerError::Protocol(format!("unwind table: {err}"));
            let rows = table.rows().map_err(invalid)?;
            table.check_segments().map_err(invalid)?;
            Ok(Ok(FileUnwindTable {
                rows,
                segments: table.segments,
                build_id: response.build_id,
                fdes: table.fdes,
                fdes_skipped: table.fdes_skipped,
                rows_before_merge: table.rows_before_merge,
                unsupported_rows: table.unsupported_rows,
                source: protocol::bounded(table.source, protocol::MAX_NAME_BYTES),
                compile_time: Duration::from_nanos(table.compile_ns),
                python: table.python,
            }))
        })?;
        answer.map_err(UnwindTableError::NoTable)
    }
}

/// The table manager's compiler: this worker, on a descriptor of the file.
impl TableCompiler for WorkerClient {
    fn compile(&mut self, file: &MappedFile) -> Result<CompiledTable, String> {
        let fd = file
            .descriptor()
            .ok_or("the file was closed and its process is gone")?;
        file.touch();
        let identity = FileIdentity {
            dev: file.key.dev,
            inode: file.key.inode,
            size: file.version.size,
            mtime_ns: file.version.mtime_ns,
        };
        let table = self
            .unwind_table(&fd, identity)
            .map_err(|err| Chain(&err).to_string())?;
        Ok(CompiledTable {
            rows: table.rows,
            segments: table
                .segments
                .iter()
                .map(|segment| unwind_tables::LoadSegment {
                    file_offset: segment.file_offset,
                    vaddr: segment.vaddr,
                    file_size: segment.file_size,
                })
                .collect(),
            compile_time: table.compile_time,
            python: table.python.map(|found| crate::python::detect::PythonSymbols {
                runtime: found.runtime,
                eval_start: found.eval_start,
                eval_size: found.eval_size,
                version_hex: found.version_hex,
            }),
        })
    }
}
