//! The daemon asks the worker for the lines of a perf map past where its
//! last read ended, and checks the answer as it would any hostile one.

use std::os::fd::OwnedFd;

use super::{
    FileIdentity, WorkerClient, WorkerError,
    perf_map_text::{MAX_ADDRESS, MAX_CHUNK_BYTES, MAX_CHUNK_SYMBOLS, MAX_HEAD_BYTES, MAX_SYMBOL_SIZE},
    protocol::{self, MAX_NAME_BYTES, PerfMapRead, Request},
};

/// Why a perf map could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PerfMapError {
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error("{0}")]
    Unreadable(String),
}

/// Symbols read from a perf map: (start, end, name), in file order (later
/// lines are newer), where the next read starts, and the hash of the head
/// asked for (0: the file is shorter now).
#[derive(Debug, Default)]
pub struct JitSymbols {
    pub symbols: Vec<(u64, u64, String)>,
    pub read_to: u64,
    pub bad_lines: u64,
    /// The hash of the file's first `head_len` bytes.
    pub head_hash: u64,
    pub head_len: u64,
}

impl WorkerClient {
    /// The perf map lines of the open file `fd` from byte `from` on (at most
    /// 4 MiB of them), and the hash of its first `head_bytes`.
    pub fn perf_map(
        &mut self,
        fd: &OwnedFd,
        identity: FileIdentity,
        from: u64,
        head_bytes: u64,
    ) -> Result<JitSymbols, PerfMapError> {
        let request = Request {
            file: Some(identity),
            perf_map: Some(PerfMapRead {
                from,
                max_bytes: MAX_CHUNK_BYTES,
                head_bytes,
            }),
            ..Request::default()
        };
        let answer = self.supervised(fd, &request, self.config.deadline, |response| {
            if !response.error.is_empty() {
                return Ok(Err(protocol::bounded(response.error, MAX_NAME_BYTES)));
            }
            let Some(chunk) = response.perf_map else {
                return Err(WorkerError::Protocol("no perf map answer".into()));
            };
            if chunk.read_to < from
                || chunk.read_to - from > MAX_CHUNK_BYTES
                || chunk.head_len > MAX_HEAD_BYTES
                || chunk.symbols.len() > MAX_CHUNK_SYMBOLS
            {
                return Err(WorkerError::Protocol(format!(
                    "{} perf map symbols read from {from} to {}",
                    chunk.symbols.len(),
                    chunk.read_to
                )));
            }
            let mut symbols = Vec::with_capacity(chunk.symbols.len());
            for symbol in chunk.symbols {
                let end = symbol.start.saturating_add(symbol.size);
                if symbol.size == 0
                    || symbol.size > MAX_SYMBOL_SIZE
                    || end > MAX_ADDRESS
                    || symbol.name.len() > MAX_NAME_BYTES
                {
                    return Err(WorkerError::Protocol(format!(
                        "perf map symbol of {} bytes at {:#x}",
                        symbol.size, symbol.start
                    )));
                }
                symbols.push((symbol.start, end, symbol.name));
            }
            Ok(Ok(JitSymbols {
                symbols,
                read_to: chunk.read_to,
                bad_lines: chunk.bad_lines,
                head_hash: chunk.head_hash,
                head_len: chunk.head_len,
            }))
        })?;
        answer.map_err(PerfMapError::Unreadable)
    }
}
