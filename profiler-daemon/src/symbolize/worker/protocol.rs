//! What the daemon and its symbolizer worker say to each other over a Unix
//! stream socket: length-prefixed protobuf frames (prost), each request
//! carrying the descriptor of the file to read (SCM_RIGHTS).
//!
//! Both ends treat the other's bytes as untrusted: the worker parses hostile
//! files and may be subverted by one, so every length is bounded and every
//! decode can fail without harm.

use std::{
    io::{self, IoSlice, IoSliceMut},
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
};

use nix::{
    errno::Errno,
    sys::socket::{self, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType},
};
use prost::Message as _;

mod unwind;
pub use unwind::{
    InvalidTable, LoadSegment, MAX_BUILD_ID_BYTES, MAX_LOAD_SEGMENTS, MAX_TABLE_ROWS, PythonSymbols,
    UnwindTable,
};

/// A request is small; a response carries names and paths for every offset.
pub const MAX_REQUEST_BYTES: usize = 4 << 20;
pub const MAX_RESPONSE_BYTES: usize = 64 << 20;
/// Bounds what one hostile symbol can make the daemon keep.
pub const MAX_NAME_BYTES: usize = 4096;

/// Symbolize these file offsets of the attached file, or compile its unwind table.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Request {
    /// The file's identity as the daemon opened it: the worker keys its
    /// parsed-file cache on it, so a changed file replaces its entry.
    #[prost(message, optional, tag = "1")]
    pub file: Option<FileIdentity>,
    #[prost(uint64, repeated, tag = "2")]
    pub offsets: Vec<u64>,
    /// Compile the file's unwind table instead (`offsets` is then empty).
    #[prost(bool, tag = "3")]
    pub unwind_table: bool,
    /// Find the file's allocator entry points instead (`offsets` is then empty).
    #[prost(bool, tag = "4")]
    pub allocator: bool,
    /// Read the file as a perf map instead, from this byte on.
    #[prost(message, optional, tag = "5")]
    pub perf_map: Option<PerfMapRead>,
    /// Read file:line and inlined frames from the file's system debug file
    /// too; else only its symbol table (its DWARF, decompressed, would be
    /// held in the worker: ~10 MB for glibc's).
    #[prost(bool, tag = "6")]
    pub debug_file_lines: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct PerfMapRead {
    #[prost(uint64, tag = "1")]
    pub from: u64,
    #[prost(uint64, tag = "2")]
    pub max_bytes: u64,
    /// Hash this many bytes at the start of the file too (0: the whole
    /// lines this read takes, up to 4 KiB): the daemon compares them with
    /// what was there before, to tell a file truncated and written anew
    /// from one appended to.
    #[prost(uint64, tag = "3")]
    pub head_bytes: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct FileIdentity {
    #[prost(uint64, tag = "1")]
    pub dev: u64,
    #[prost(uint64, tag = "2")]
    pub inode: u64,
    #[prost(uint64, tag = "3")]
    pub size: u64,
    #[prost(int64, tag = "4")]
    pub mtime_ns: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Response {
    /// Empty when the file could be read; else why not (its offsets stay unresolved).
    #[prost(string, tag = "1")]
    pub error: String,
    /// GNU build id.
    #[prost(bytes = "vec", tag = "2")]
    pub build_id: Vec<u8>,
    /// One per requested offset, in order.
    #[prost(message, repeated, tag = "3")]
    pub symbols: Vec<Symbols>,
    /// The file names a debug file (.gnu_debuglink, .gnu_debugaltlink,
    /// .debug_sup) that was not followed: only system debug files found by
    /// build id are read.
    #[prost(bool, tag = "4")]
    pub debug_link_refused: bool,
    /// A system debug file (by build id) supplied the symbols.
    #[prost(bool, tag = "5")]
    pub debug_file_used: bool,
    /// The answer to an unwind-table request (absent when `error` says why not).
    #[prost(message, optional, tag = "6")]
    pub unwind_table: Option<UnwindTable>,
    /// The answer to an allocator request.
    #[prost(message, optional, tag = "7")]
    pub allocator: Option<AllocatorSymbols>,
    /// The answer to a perf map request.
    #[prost(message, optional, tag = "8")]
    pub perf_map: Option<PerfMapChunk>,
}

/// The whole lines of a perf map read from where the last read ended.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PerfMapChunk {
    #[prost(message, repeated, tag = "1")]
    pub symbols: Vec<PerfMapSymbol>,
    /// Where the next read starts: after the last whole line taken.
    #[prost(uint64, tag = "2")]
    pub read_to: u64,
    /// Lines that were no symbol (bad numbers, absurd ranges, too long).
    #[prost(uint64, tag = "3")]
    pub bad_lines: u64,
    /// The hash of the file's first `head_len` bytes (0: it is shorter).
    #[prost(uint64, tag = "4")]
    pub head_hash: u64,
    #[prost(uint64, tag = "5")]
    pub head_len: u64,
}

/// One perf map line: code of `size` bytes at `start`, named `name`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct PerfMapSymbol {
    #[prost(uint64, tag = "1")]
    pub start: u64,
    #[prost(uint64, tag = "2")]
    pub size: u64,
    #[prost(string, tag = "3")]
    pub name: String,
}

/// A file's allocator entry points, as the worker says they are: the
/// daemon keeps only names it knows and offsets within the file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AllocatorSymbols {
    /// The file is a Go program.
    #[prost(bool, tag = "1")]
    pub go: bool,
    #[prost(message, repeated, tag = "2")]
    pub symbols: Vec<AllocatorSymbol>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AllocatorSymbol {
    #[prost(string, tag = "1")]
    pub name: String,
    /// Where its code starts in the file: the uprobe's offset.
    #[prost(uint64, tag = "2")]
    pub file_offset: u64,
}

/// The functions at one address, innermost (inlined) first; empty: unknown.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Symbols {
    #[prost(message, repeated, tag = "1")]
    pub lines: Vec<SymbolLine>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SymbolLine {
    /// As in the symbol table (mangled).
    #[prost(string, tag = "1")]
    pub system_name: String,
    /// Demangled (the worker demangles: demanglers parse hostile input too).
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, optional, tag = "3")]
    pub filename: Option<String>,
    #[prost(uint32, tag = "4")]
    pub line: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("the other end closed the connection")]
    Closed,
    #[error("socket")]
    Io(#[from] io::Error),
    #[error("frame of {0} bytes is over the bound")]
    TooLarge(usize),
    #[error("malformed message")]
    Decode(#[from] prost::DecodeError),
    #[error("the request carried no file descriptor")]
    NoDescriptor,
    #[error("no answer before the deadline")]
    TimedOut,
}

/// Writes one frame, with `fd` attached to its first byte.
pub fn send_frame(
    socket: BorrowedFd<'_>,
    message: &impl prost::Message,
    fd: Option<BorrowedFd<'_>>,
) -> Result<(), ProtocolError> {
    // Encoded straight into the frame: an unwind table can be megabytes,
    // and a second copy of it would be the worker's peak.
    // The length is checked before the frame is allocated.
    let len = message.encoded_len();
    let header = u32::try_from(len).map_err(|_| ProtocolError::TooLarge(len))?;
    let mut frame = Vec::with_capacity(4 + len);
    frame.extend_from_slice(&header.to_le_bytes());
    // A Vec grows as needed: encoding into one does not fail.
    message
        .encode(&mut frame)
        .map_err(|_| ProtocolError::TooLarge(len))?;
    let mut sent = send_with_fd(socket, &frame, fd)?;
    while sent < frame.len() {
        sent += send_with_fd(socket, &frame[sent..], None)?;
    }
    Ok(())
}

/// Reads one frame of at most `max` bytes, and the descriptor attached to
/// it, if any (the worker's side: each request carries its file). `wait` is
/// called before each read that would block (it polls with the caller's
/// deadline).
pub fn recv_frame(
    socket: BorrowedFd<'_>,
    max: usize,
    wait: impl FnMut() -> Result<(), ProtocolError>,
) -> Result<(Vec<u8>, Option<OwnedFd>), ProtocolError> {
    recv_frame_taking(socket, max, Descriptors::Take, wait)
}

/// Reads one frame of at most `max` bytes that should carry no descriptor
/// (the daemon's side: answers carry none). Any the other end attaches are
/// closed by the kernel unseen, never installed in this process.
pub fn recv_frame_without_fd(
    socket: BorrowedFd<'_>,
    max: usize,
    wait: impl FnMut() -> Result<(), ProtocolError>,
) -> Result<Vec<u8>, ProtocolError> {
    recv_frame_taking(socket, max, Descriptors::Refuse, wait).map(|(body, _)| body)
}

fn recv_frame_taking(
    socket: BorrowedFd<'_>,
    max: usize,
    descriptors: Descriptors,
    mut wait: impl FnMut() -> Result<(), ProtocolError>,
) -> Result<(Vec<u8>, Option<OwnedFd>), ProtocolError> {
    let mut header = [0u8; 4];
    let mut fd = None;
    let mut filled = 0;
    while filled < header.len() {
        wait()?;
        let (read, received) = recv_with_fd(socket, &mut header[filled..], descriptors)?;
        if received.is_some() {
            fd = received;
        }
        filled += read;
    }
    let len = u32::from_le_bytes(header) as usize;
    if len > max {
        return Err(ProtocolError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    let mut filled = 0;
    while filled < len {
        wait()?;
        let (read, _) = recv_with_fd(socket, &mut body[filled..], descriptors)?;
        filled += read;
    }
    Ok((body, fd))
}

/// Whether a read takes the descriptors that arrive with the bytes.
#[derive(Clone, Copy)]
enum Descriptors {
    Take,
    Refuse,
}

/// The most descriptors one message can carry (the kernel's SCM_MAX_FD).
const SCM_MAX_FD: usize = 253;
/// Room for the control message of [`SCM_MAX_FD`] descriptors,
/// CMSG_SPACE(253 * 4): a header and data, each aligned to a `usize`.
/// With that room the kernel never cuts a list of descriptors short for
/// space (MSG_CTRUNC), which nix would refuse to decode, leaking whatever
/// the kernel had already installed.
const CONTROL_BYTES: usize =
    cmsg_align(size_of::<libc::cmsghdr>()) + cmsg_align(SCM_MAX_FD * size_of::<RawFd>());

const fn cmsg_align(len: usize) -> usize {
    len.next_multiple_of(size_of::<usize>())
}

/// The control buffer, aligned as a `cmsghdr` must be (nix reads the headers in place).
#[repr(C, align(8))]
struct ControlBuffer([u8; CONTROL_BYTES]);

fn send_with_fd(
    socket: BorrowedFd<'_>,
    bytes: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> Result<usize, ProtocolError> {
    let iov = [IoSlice::new(bytes)];
    let fds = fd.map(|fd| [fd.as_raw_fd()]);
    let rights = fds.as_ref().map(|fds| ControlMessage::ScmRights(fds));
    loop {
        // MSG_NOSIGNAL: a worker gone is an error here, not a SIGPIPE.
        match socket::sendmsg::<()>(
            socket.as_raw_fd(),
            &iov,
            rights.as_slice(),
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(sent) => return Ok(sent),
            Err(Errno::EINTR) => continue,
            Err(Errno::EPIPE | Errno::ECONNRESET) => return Err(ProtocolError::Closed),
            Err(errno) => return Err(io::Error::from(errno).into()),
        }
    }
}

fn recv_with_fd(
    socket: BorrowedFd<'_>,
    buffer: &mut [u8],
    descriptors: Descriptors,
) -> Result<(usize, Option<OwnedFd>), ProtocolError> {
    let mut room = ControlBuffer([0; CONTROL_BYTES]);
    let mut control = match descriptors {
        Descriptors::Take => Some(&mut room.0[..]),
        // No room at all: the kernel closes what was sent (MSG_CTRUNC).
        Descriptors::Refuse => None,
    };
    let empty = buffer.is_empty();
    let mut iov = [IoSliceMut::new(buffer)];
    // MSG_CMSG_CLOEXEC: a received descriptor never leaks into a child.
    let message = loop {
        match socket::recvmsg::<()>(
            socket.as_raw_fd(),
            &mut iov,
            control.as_deref_mut(),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(message) => break message,
            Err(Errno::EINTR) => continue,
            Err(errno) => return Err(io::Error::from(errno).into()),
        }
    };
    let mut received = None;
    // nix does not decode a list the kernel cut short (MSG_CTRUNC). Given
    // the room, that happens here only when this process is out of
    // descriptors, and then the kernel installed none of the single one
    // the daemon sends: the frame carries no descriptor, as before.
    if let Ok(messages) = message.cmsgs() {
        for rights in messages {
            let ControlMessageOwned::ScmRights(fds) = rights else {
                continue;
            };
            for fd in fds {
                // SAFETY: the kernel has just installed `fd` in this
                // process for this message (SCM_RIGHTS): nothing else
                // refers to it, so it is ours to own, and closed if unused.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                received.get_or_insert(owned);
            }
        }
    }
    if message.bytes == 0 && !empty {
        return Err(ProtocolError::Closed);
    }
    Ok((message.bytes, received))
}

/// The worker's answer in a frame the daemon received. Decoded from
/// `Bytes`, an unwind table's rows are a slice of the frame, not a copy: a
/// table can be megabytes, and copies of it were the daemon's peak heap.
pub fn decode_response(body: Vec<u8>) -> Result<Response, prost::DecodeError> {
    Response::decode(bytes::Bytes::from(body))
}

/// Truncates `text` to at most `max` bytes on a character boundary.
pub fn bounded(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// A connected pair of stream sockets, close-on-exec.
pub fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(socket::socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?)
}

#[cfg(test)]
mod tests;
