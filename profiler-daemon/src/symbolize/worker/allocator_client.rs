//! The daemon asks the worker where a file's allocator entry points are,
//! and keeps of its answer only names it probes and offsets inside the file.

use std::os::fd::OwnedFd;

use super::{
    FileIdentity, WorkerClient, WorkerError,
    protocol::{self, Request},
};
use crate::{
    collect::{
        FileKey, FileVersion,
        allocations::{AllocatorReader, FileAllocator, is_allocator_name},
    },
    error::Chain,
};

/// Entry points reported per file, at most (a real allocator has about 20).
const MAX_SYMBOLS: usize = 64;

/// Why a file's allocator could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AllocatorError {
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error("{0}")]
    Unreadable(String),
}

impl WorkerClient {
    /// The allocator entry points of the open file `fd` (identified by
    /// `identity`, `size` bytes long).
    pub fn allocator(
        &mut self,
        fd: &OwnedFd,
        identity: FileIdentity,
    ) -> Result<FileAllocator, AllocatorError> {
        let request = Request {
            file: Some(identity),
            allocator: true,
            ..Request::default()
        };
        let answer = self.supervised(fd, &request, self.config.deadline, |response| {
            if !response.error.is_empty() {
                return Ok(Err(protocol::bounded(response.error, protocol::MAX_NAME_BYTES)));
            }
            let Some(found) = response.allocator else {
                return Err(WorkerError::Protocol("no allocator answer".into()));
            };
            if found.symbols.len() > MAX_SYMBOLS {
                return Err(WorkerError::Protocol(format!(
                    "{} allocator symbols",
                    found.symbols.len()
                )));
            }
            let mut symbols = Vec::with_capacity(found.symbols.len());
            for symbol in found.symbols {
                if !is_allocator_name(&symbol.name) || symbol.file_offset >= identity.size {
                    return Err(WorkerError::Protocol(format!(
                        "allocator symbol {:?} at {:#x} of a {}-byte file",
                        protocol::bounded(symbol.name, 64),
                        symbol.file_offset,
                        identity.size
                    )));
                }
                symbols.push((symbol.name, symbol.file_offset));
            }
            Ok(Ok(FileAllocator {
                go: found.go,
                symbols,
            }))
        })?;
        answer.map_err(AllocatorError::Unreadable)
    }
}

impl AllocatorReader for WorkerClient {
    fn allocator(
        &mut self,
        fd: &OwnedFd,
        key: FileKey,
        version: FileVersion,
    ) -> Result<FileAllocator, String> {
        let identity = FileIdentity {
            dev: key.dev,
            inode: key.inode,
            size: version.size,
            mtime_ns: version.mtime_ns,
        };
        WorkerClient::allocator(self, fd, identity).map_err(|err| Chain(&err).to_string())
    }
}
