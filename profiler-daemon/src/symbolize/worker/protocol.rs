//! What the daemon and its symbolizer worker say to each other over a Unix
//! stream socket: length-prefixed protobuf frames (prost), each request
//! carrying the descriptor of the file to read (SCM_RIGHTS).
//!
//! Both ends treat the other's bytes as untrusted: the worker parses hostile
//! files and may be subverted by one, so every length is bounded and every
//! decode can fail without harm.

use std::{
    io,
    os::fd::{FromRawFd, OwnedFd, RawFd},
};

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
    socket: RawFd,
    message: &impl prost::Message,
    fd: Option<RawFd>,
) -> Result<(), ProtocolError> {
    let body = message.encode_to_vec();
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(
        &u32::try_from(body.len())
            .map_err(|_| ProtocolError::TooLarge(body.len()))?
            .to_le_bytes(),
    );
    frame.extend_from_slice(&body);
    let mut sent = send_with_fd(socket, &frame, fd)?;
    while sent < frame.len() {
        sent += send_with_fd(socket, &frame[sent..], None)?;
    }
    Ok(())
}

/// Reads one frame of at most `max` bytes, and the descriptor attached to
/// it, if any. `wait` is called before each read that would block (it polls
/// with the caller's deadline).
pub fn recv_frame(
    socket: RawFd,
    max: usize,
    mut wait: impl FnMut() -> Result<(), ProtocolError>,
) -> Result<(Vec<u8>, Option<OwnedFd>), ProtocolError> {
    let mut header = [0u8; 4];
    let mut fd = None;
    let mut filled = 0;
    while filled < header.len() {
        wait()?;
        let (read, received) = recv_with_fd(socket, &mut header[filled..])?;
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
        let (read, _) = recv_with_fd(socket, &mut body[filled..])?;
        filled += read;
    }
    Ok((body, fd))
}

const CMSG_SPACE: usize = 64;

fn send_with_fd(socket: RawFd, bytes: &[u8], fd: Option<RawFd>) -> Result<usize, ProtocolError> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut control = [0u64; CMSG_SPACE / 8];
    // SAFETY: zeroed msghdr is a valid empty message; the pointers set below
    // point into `iov` and `control`, which outlive the sendmsg call.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    if let Some(fd) = fd {
        message.msg_control = control.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE only computes a size.
        message.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
        // SAFETY: msg_control points to a buffer of at least msg_controllen
        // bytes (64 >= CMSG_SPACE(4)), so the first header and its data fit.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&message);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<RawFd>(), fd);
        }
    }
    loop {
        // SAFETY: `message` is fully initialised and its buffers are live.
        let sent = unsafe { libc::sendmsg(socket, &message, libc::MSG_NOSIGNAL) };
        if sent >= 0 {
            return Ok(sent as usize);
        }
        let err = io::Error::last_os_error();
        match err.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => return Err(ProtocolError::Closed),
            _ => return Err(err.into()),
        }
    }
}

fn recv_with_fd(socket: RawFd, buffer: &mut [u8]) -> Result<(usize, Option<OwnedFd>), ProtocolError> {
    let mut iov = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: buffer.len(),
    };
    let mut control = [0u64; CMSG_SPACE / 8];
    // SAFETY: as in send_with_fd; the buffers outlive the recvmsg call.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = CMSG_SPACE;
    let read = loop {
        // SAFETY: `message` describes live buffers of the stated sizes.
        // MSG_CMSG_CLOEXEC: a received descriptor never leaks into a child.
        let read = unsafe { libc::recvmsg(socket, &mut message, libc::MSG_CMSG_CLOEXEC) };
        if read >= 0 {
            break read as usize;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err.into());
        }
    };
    let mut received = None;
    // SAFETY: the kernel filled msg_control/msg_controllen; CMSG_FIRSTHDR and
    // CMSG_NXTHDR walk only within them. Every SCM_RIGHTS descriptor is
    // owned by us from here on (so closed if unused).
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&message);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(header);
                // The kernel wrote the header; still, never read past the buffer.
                let count = ((*header).cmsg_len as usize)
                    .saturating_sub(libc::CMSG_LEN(0) as usize)
                    .min(CMSG_SPACE - libc::CMSG_LEN(0) as usize)
                    / size_of::<RawFd>();
                for index in 0..count {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(index));
                    let owned = OwnedFd::from_raw_fd(fd);
                    if received.is_none() {
                        received = Some(owned);
                    }
                }
            }
            header = libc::CMSG_NXTHDR(&message, header);
        }
    }
    if read == 0 && !buffer.is_empty() {
        return Err(ProtocolError::Closed);
    }
    Ok((read, received))
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
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors socketpair writes.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socketpair succeeded: both descriptors are open and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;
    use std::os::fd::AsRawFd;

    fn raw(fd: &OwnedFd) -> RawFd {
        fd.as_raw_fd()
    }

    #[test]
    fn frames_and_descriptors_cross_a_socket_pair() {
        let (a, b) = socket_pair().expect("socketpair");
        let file = std::fs::File::open("/proc/self/exe").expect("our own binary");
        let request = Request {
            file: Some(FileIdentity {
                dev: 1,
                inode: 2,
                size: 3,
                mtime_ns: -4,
            }),
            offsets: vec![1, 2, 3],
            unwind_table: false,
        };
        send_frame(raw(&a), &request, Some(file.as_raw_fd())).expect("send");
        let (body, fd) = recv_frame(raw(&b), MAX_REQUEST_BYTES, || Ok(())).expect("receive");
        assert_eq!(Request::decode(&*body).expect("decode"), request);
        assert!(fd.is_some(), "the descriptor should arrive with the frame");
    }

    #[test]
    fn oversized_frames_are_refused() {
        let (a, b) = socket_pair().expect("socketpair");
        let request = Request {
            file: None,
            offsets: (0..1000).collect(),
            unwind_table: false,
        };
        send_frame(raw(&a), &request, None).expect("send");
        let result = recv_frame(raw(&b), 16, || Ok(()));
        assert!(
            matches!(result, Err(ProtocolError::TooLarge(_))),
            "got {result:?}"
        );
    }

    #[test]
    fn bounded_cuts_on_a_character_boundary() {
        assert_eq!(bounded("héllo".into(), 2), "h");
        assert_eq!(bounded("abc".into(), 10), "abc");
    }

    #[test]
    fn causes_are_printed_once() {
        let decode = Response::decode(&[0xff_u8][..]).expect_err("one 0xff byte is not a message");
        crate::error::assert_each_cause_once(&ProtocolError::Decode(decode));
        let io = io::Error::from(io::ErrorKind::BrokenPipe);
        crate::error::assert_each_cause_once(&ProtocolError::Io(io));
    }
}
