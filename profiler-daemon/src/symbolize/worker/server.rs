//! The worker's side: a separate process with no capabilities, a memory
//! limit and a deadline per request (see [`super::sandbox`]), which parses
//! the ELF and DWARF of files other users control. Whatever a hostile file
//! does here (a panic, SIGBUS on a truncated mapping, an endless loop,
//! runaway memory) costs this process, which the daemon restarts.
//!
//! It opens no path a file names: a debug link is never followed; the only
//! separate debug files it reads are the system's, found by build id.

use std::{
    collections::HashMap,
    os::fd::{AsFd, AsRawFd, OwnedFd},
    path::PathBuf,
};

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer as Blaze,
    source::{Elf, Source},
};
use object::{Object as _, ObjectSegment as _, ReadCache};
use prost::Message as _;

use super::protocol::{
    self, FileIdentity, MAX_NAME_BYTES, MAX_REQUEST_BYTES, ProtocolError, Request, Response, SymbolLine,
    Symbols,
};
use super::{
    allocator_elf,
    debug_file::{SYSTEM_DEBUG_DIR, system_debug_file},
    perf_map_text,
    positional::PositionalFile,
    resident, unwind_elf,
};
use crate::{error::Chain, symbolize::demangle::demangle};

/// Parsed files kept between requests; the least recently used go first.
const MAX_CACHED_FILES: usize = 32;

/// Serves requests on `socket` until the daemon closes it.
pub fn serve(socket: OwnedFd) -> Result<(), ProtocolError> {
    // As the daemon does; a failure only leaves start-up's pages resident.
    if let Err(err) = crate::own_pages::release_startup_pages() {
        eprintln!("profilerd symbolize-worker: {}", Chain(&err));
    }
    let mut worker = Worker::new();
    loop {
        let (body, fd) = match protocol::recv_frame(socket.as_fd(), MAX_REQUEST_BYTES, || Ok(())) {
            Ok(frame) => frame,
            Err(ProtocolError::Closed) => return Ok(()),
            Err(err) => return Err(err),
        };
        let request = Request::decode(&*body)?;
        let fd = fd.ok_or(ProtocolError::NoDescriptor)?;
        let response = worker.handle(&request, fd);
        protocol::send_frame(socket.as_fd(), &response, None)?;
        // Answered first: the daemon need not wait for it.
        if std::mem::take(&mut worker.parsed) {
            // SAFETY: the worker process runs this one thread (blazesym
            // spawns none): nothing maps or unmaps memory meanwhile.
            unsafe { worker.release.after_parse() };
        }
    }
}

/// What the worker learned of one file, kept while the file is cached.
struct FileInfo {
    build_id: Vec<u8>,
    /// PT_LOAD segments as (file offset, file size, virtual address).
    segments: Vec<(u64, u64, u64)>,
    debug_link: bool,
    /// The system debug file with the same build id, if installed.
    debug_file: Option<PathBuf>,
}

struct CachedFile {
    /// Held so that `/proc/self/fd/N` keeps naming this file.
    fd: OwnedFd,
    info: Result<FileInfo, String>,
    last_used: u64,
}

impl CachedFile {
    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }
}

struct Worker {
    blaze: Blaze,
    files: HashMap<FileIdentity, CachedFile>,
    clock: u64,
    /// blazesym read files (mapped) for the request being served.
    parsed: bool,
    release: resident::Release,
}

impl Worker {
    fn new() -> Self {
        Self {
            // Demangled below, so both names reach pprof. Debug directories:
            // only for the system debug files' own links (dwz's altlink);
            // files without one get `debug_syms: false` when they name any.
            blaze: Blaze::builder()
                .enable_demangling(false)
                .set_debug_dirs(Some([SYSTEM_DEBUG_DIR]))
                .build(),
            files: HashMap::new(),
            clock: 0,
            parsed: false,
            release: resident::Release::new(),
        }
    }

    fn handle(&mut self, request: &Request, fd: OwnedFd) -> Response {
        if let Some(read) = request.perf_map {
            return match perf_map_text::read_chunk(&fd, read) {
                Ok(chunk) => Response {
                    perf_map: Some(chunk),
                    ..Response::default()
                },
                Err(err) => error_response(&err),
            };
        }
        if request.allocator {
            return match allocator_elf::allocator_symbols(&fd) {
                Ok(symbols) => Response {
                    allocator: Some(symbols),
                    ..Response::default()
                },
                Err(err) => error_response(&err),
            };
        }
        if request.unwind_table {
            // Compiled once per file by the daemon's cache: not kept here.
            return match unwind_elf::unwind_table(&fd) {
                Ok((table, build_id)) => Response {
                    build_id,
                    unwind_table: Some(table),
                    ..Response::default()
                },
                Err(err) => error_response(&err),
            };
        }
        let Some(identity) = request.file else {
            return error_response("the request named no file");
        };
        self.clock += 1;
        self.admit(identity, fd);
        let Some(file) = self.files.get_mut(&identity) else {
            return error_response("the file could not be cached");
        };
        file.last_used = self.clock;
        let info = match &file.info {
            Ok(info) => info,
            Err(err) => return error_response(err),
        };
        let path = file.path();
        let (source_path, debug_syms) = match &info.debug_file {
            // Its symbol table names every function; its DWARF (lines,
            // inlined frames) only when asked for, as it costs its size.
            Some(debug_file) => (debug_file.clone(), request.debug_file_lines),
            // A file naming a debug file of its own is read without DWARF
            // rather than letting the reader open the path it names.
            None => (path, !info.debug_link),
        };
        let virtual_offsets: Vec<Option<u64>> = request
            .offsets
            .iter()
            .map(|&offset| virtual_offset(&info.segments, offset))
            .collect();
        let wanted: Vec<u64> = virtual_offsets.iter().flatten().copied().collect();
        let mut response = Response {
            error: String::new(),
            build_id: info.build_id.clone(),
            symbols: Vec::with_capacity(request.offsets.len()),
            debug_link_refused: info.debug_link,
            debug_file_used: info.debug_file.is_some(),
            unwind_table: None,
            allocator: None,
            perf_map: None,
        };
        let mut resolved = if wanted.is_empty() {
            Vec::new().into_iter()
        } else {
            let mut elf = Elf::new(source_path);
            elf.debug_syms = debug_syms;
            self.parsed = true;
            match self
                .blaze
                .symbolize(&Source::Elf(elf), Input::VirtOffset(&wanted))
            {
                Ok(symbols) => symbols.into_iter(),
                Err(err) => {
                    response.error = protocol::bounded(format!("{err:#}"), MAX_NAME_BYTES);
                    return response;
                }
            }
        };
        for offset in virtual_offsets {
            let lines = match offset.and_then(|_| resolved.next()) {
                Some(Symbolized::Sym(sym)) => lines_of(&sym),
                _ => Vec::new(),
            };
            response.symbols.push(Symbols { lines });
        }
        response
    }

    /// Caches the file under its identity (a changed file replaces the
    /// entry of its inode), evicting the least recently used past the bound.
    fn admit(&mut self, identity: FileIdentity, fd: OwnedFd) {
        if self.files.contains_key(&identity) {
            return; // `fd` is a duplicate of the one held: dropped here.
        }
        let stale: Vec<FileIdentity> = self
            .files
            .keys()
            .filter(|held| (held.dev, held.inode) == (identity.dev, identity.inode))
            .copied()
            .collect();
        for held in stale {
            self.evict(&held);
        }
        while self.files.len() >= MAX_CACHED_FILES {
            let Some(oldest) = self
                .files
                .iter()
                .min_by_key(|(_, file)| file.last_used)
                .map(|(key, _)| *key)
            else {
                break;
            };
            self.evict(&oldest);
        }
        let info = describe(&fd);
        self.files.insert(
            identity,
            CachedFile {
                fd,
                info,
                last_used: self.clock,
            },
        );
    }

    fn evict(&mut self, identity: &FileIdentity) {
        let Some(file) = self.files.remove(identity) else {
            return;
        };
        // Before the descriptor closes: its number will name another file.
        let _ = self.blaze.evict(&evict(file.path()));
        if let Ok(FileInfo {
            debug_file: Some(debug_file),
            ..
        }) = &file.info
            && !self.files.values().any(|other| {
                other
                    .info
                    .as_ref()
                    .is_ok_and(|info| info.debug_file.as_ref() == Some(debug_file))
            })
        {
            let _ = self.blaze.evict(&evict(debug_file.clone()));
        }
    }
}

fn evict(path: PathBuf) -> blazesym::symbolize::evict::Evict {
    blazesym::symbolize::evict::Evict::Elf(blazesym::symbolize::evict::Elf::new(path))
}

fn error_response(error: &str) -> Response {
    Response {
        error: protocol::bounded(error.to_owned(), MAX_NAME_BYTES),
        ..Response::default()
    }
}

/// Reads what the symbolizer needs of the file's headers through read(2)
/// (not a mapping: a file truncated meanwhile is an error, not a SIGBUS).
fn describe(fd: &OwnedFd) -> Result<FileInfo, String> {
    let file = PositionalFile::dup(fd).map_err(|err| format!("dup: {err}"))?;
    let cache = ReadCache::new(file);
    let object = object::File::parse(&cache).map_err(|err| format!("not a readable ELF file: {err}"))?;
    let build_id = object
        .build_id()
        .ok()
        .flatten()
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    let debug_link = object.gnu_debuglink().ok().flatten().is_some()
        || object.gnu_debugaltlink().ok().flatten().is_some()
        || object.section_by_name(".debug_sup").is_some();
    let segments = object
        .segments()
        .map(|segment| {
            let (offset, size) = segment.file_range();
            (offset, size, segment.address())
        })
        .collect();
    let debug_file = system_debug_file(&build_id);
    Ok(FileInfo {
        build_id,
        segments,
        debug_link,
        debug_file,
    })
}

/// The ELF virtual address of a file offset, through the PT_LOAD segment that holds it.
fn virtual_offset(segments: &[(u64, u64, u64)], offset: u64) -> Option<u64> {
    segments.iter().find_map(|&(start, size, address)| {
        let delta = offset.checked_sub(start)?;
        (delta < size).then(|| address.wrapping_add(delta))
    })
}

/// pprof's lines for one address, innermost first. blazesym reports the
/// outermost function with its inlined callees outer to inner; each callee's
/// code info is its call site (a line of its caller), and the symbol's own
/// code info is the address's line in the innermost function.
fn lines_of(sym: &blazesym::symbolize::Sym<'_>) -> Vec<SymbolLine> {
    let mut names: Vec<(&str, Option<&blazesym::symbolize::CodeInfo<'_>>)> =
        Vec::with_capacity(sym.inlined.len() + 1);
    names.push((&sym.name, None));
    names.extend(sym.inlined.iter().map(|inlined| (&*inlined.name, None)));
    // Shift code infos: the outermost gets the first callee's call site, ...,
    // the innermost gets the symbol's own location.
    for (index, inlined) in sym.inlined.iter().enumerate() {
        names[index].1 = inlined.code_info.as_ref();
    }
    if let Some(last) = names.last_mut() {
        last.1 = sym.code_info.as_deref();
    }
    names
        .iter()
        .rev()
        .map(|(system_name, code_info)| SymbolLine {
            system_name: protocol::bounded((*system_name).to_owned(), MAX_NAME_BYTES),
            name: protocol::bounded(demangle(system_name), MAX_NAME_BYTES),
            filename: code_info
                .map(|info| protocol::bounded(info.to_path().to_string_lossy().into_owned(), MAX_NAME_BYTES)),
            line: code_info.and_then(|info| info.line).unwrap_or(0),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_map_through_their_load_segment() {
        let segments = [(0, 0x1000, 0), (0x1000, 0x2000, 0x401000)];
        assert_eq!(virtual_offset(&segments, 0x10), Some(0x10));
        assert_eq!(virtual_offset(&segments, 0x1800), Some(0x401800));
        assert_eq!(virtual_offset(&segments, 0x3000), None);
    }
}
