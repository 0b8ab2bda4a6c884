//! The real thing: a process with a mapping of a file on a FUSE filesystem
//! whose server never answers a READ. A read of that mapping through the
//! reader fails within the deadline; once the connection is aborted the
//! abandoned thread returns.
//!
//! The server speaks the kernel's protocol on /dev/fuse itself (INIT,
//! LOOKUP, GETATTR, OPEN, and no answer to READ), so nothing need be
//! installed; mounting needs root (CAP_SYS_ADMIN) and /dev/fuse.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::{
    errno::Errno,
    mount::{MntFlags, MsFlags, mount, umount2},
    poll::{PollFd, PollFlags, poll},
    sys::{
        signal::{Signal, kill},
        wait::waitpid,
    },
    unistd::{self, ForkResult, Pid, fork},
};

use crate::python::memory::{Memory, MemoryError};
use crate::python::reader::{DEADLINE, Reader, ReaderLimits};

const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const OPEN: u32 = 14;
const READ: u32 = 15;
const RELEASE: u32 = 18;
const FLUSH: u32 = 25;
const INIT: u32 = 26;
const INTERRUPT: u32 = 36;
const BATCH_FORGET: u32 = 42;

/// `struct fuse_in_header`.
const IN_HEADER: usize = 40;
/// The file's node (the root is 1).
const FILE_NODE: u64 = 2;
const FILE_SIZE: u64 = 4 * 4096;

/// What the server saw.
#[derive(Default)]
struct Seen {
    /// A READ came (and was left unanswered).
    read: AtomicBool,
    stop: AtomicBool,
}

/// `struct fuse_attr` of node `node`.
fn attr(node: u64) -> Vec<u8> {
    let (mode, size, nlink) = match node {
        FILE_NODE => (libc::S_IFREG | 0o644, FILE_SIZE, 1u32),
        _ => (libc::S_IFDIR | 0o755, 0, 2),
    };
    let mut out = Vec::with_capacity(88);
    out.extend(node.to_ne_bytes()); // ino
    out.extend(size.to_ne_bytes());
    out.extend(size.div_ceil(512).to_ne_bytes()); // blocks
    out.extend([0u8; 3 * 8 + 3 * 4]); // atime, mtime, ctime and their nanoseconds
    out.extend(mode.to_ne_bytes());
    out.extend(nlink.to_ne_bytes());
    out.extend([0u8; 4 * 4]); // uid, gid, rdev, blksize
    out.extend(0u32.to_ne_bytes()); // flags
    assert_eq!(out.len(), 88);
    out
}

fn reply(fd: &OwnedFd, unique: u64, error: i32, body: &[u8]) {
    let mut out = Vec::with_capacity(16 + body.len());
    out.extend(((16 + body.len()) as u32).to_ne_bytes());
    out.extend(error.to_ne_bytes());
    out.extend(unique.to_ne_bytes());
    out.extend(body);
    // A failed write (the request was interrupted) is nothing to the test.
    let _ = unistd::write(fd, &out);
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// Answers requests until told to stop; then closes the device, which
/// aborts the connection (pending requests fail).
fn serve(fd: OwnedFd, seen: Arc<Seen>) {
    let mut buffer = vec![0u8; 256 * 1024];
    while !seen.stop.load(Ordering::SeqCst) {
        if !matches!(
            poll(&mut [PollFd::new(fd.as_fd(), PollFlags::POLLIN)], 20u8),
            Ok(1..)
        ) {
            continue;
        }
        let got = match unistd::read(&fd, &mut buffer) {
            Ok(got) if got >= IN_HEADER => got,
            // Unmounted.
            Err(Errno::ENODEV) => break,
            _ => continue,
        };
        let request = &buffer[..got];
        let (opcode, unique, node) = (u32_at(request, 4), u64_at(request, 8), u64_at(request, 16));
        let body = &request[IN_HEADER..];
        match opcode {
            INIT => {
                let max_readahead = u32_at(body, 8);
                let mut out = Vec::with_capacity(64);
                out.extend(7u32.to_ne_bytes()); // major
                out.extend(31u32.to_ne_bytes()); // minor
                out.extend(max_readahead.to_ne_bytes());
                out.extend(0u32.to_ne_bytes()); // flags: no async reads
                out.extend(16u16.to_ne_bytes()); // max_background
                out.extend(12u16.to_ne_bytes()); // congestion_threshold
                out.extend(4096u32.to_ne_bytes()); // max_write
                out.extend(1u32.to_ne_bytes()); // time_gran
                out.resize(64, 0);
                reply(&fd, unique, 0, &out);
            }
            LOOKUP if node == 1 && body.starts_with(b"file\0") => {
                let mut out = Vec::with_capacity(128);
                out.extend(FILE_NODE.to_ne_bytes());
                out.extend(0u64.to_ne_bytes()); // generation
                out.extend(60u64.to_ne_bytes()); // entry_valid
                out.extend(60u64.to_ne_bytes()); // attr_valid
                out.extend([0u8; 8]); // their nanoseconds
                out.extend(attr(FILE_NODE));
                reply(&fd, unique, 0, &out);
            }
            LOOKUP => reply(&fd, unique, -libc::ENOENT, &[]),
            GETATTR => {
                let mut out = Vec::with_capacity(104);
                out.extend(60u64.to_ne_bytes());
                out.extend([0u8; 8]);
                out.extend(attr(node));
                reply(&fd, unique, 0, &out);
            }
            OPEN => reply(&fd, unique, 0, &[0u8; 16]), // fh 0, no direct io: mmap goes through the page cache
            READ => seen.read.store(true, Ordering::SeqCst), // never answered
            FLUSH | RELEASE => reply(&fd, unique, 0, &[]),
            FORGET | BATCH_FORGET | INTERRUPT => {}
            _ => reply(&fd, unique, -libc::ENOSYS, &[]),
        }
    }
}

/// A mount of the never-answering filesystem; stopped and unmounted when dropped.
struct Mount {
    dir: PathBuf,
    /// The server's end of the connection (a child must close its copy).
    device: RawFd,
    seen: Arc<Seen>,
    server: Option<std::thread::JoinHandle<()>>,
}

impl Mount {
    fn new() -> Mount {
        let dir = std::env::temp_dir().join(format!("profilerd-fuse-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mount point");
        // std opens close-on-exec.
        let device = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .unwrap_or_else(|err| panic!("opening /dev/fuse: {err} (the test needs root and FUSE)"));
        let fd = OwnedFd::from(device);
        let raw = fd.as_raw_fd();
        let options = format!("fd={raw},rootmode=40000,user_id=0,group_id=0");
        mount(
            Some("profilerd-test"),
            &dir,
            Some("fuse"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(options.as_str()),
        )
        .unwrap_or_else(|errno| panic!("mounting FUSE: {}", std::io::Error::from(errno)));
        let seen = Arc::new(Seen::default());
        let server = {
            let seen = seen.clone();
            std::thread::spawn(move || serve(fd, seen))
        };
        Mount {
            dir,
            device: raw,
            seen,
            server: Some(server),
        }
    }

    /// Aborts the connection: requests waiting on the server fail.
    fn stop(&mut self) {
        self.seen.stop.store(true, Ordering::SeqCst);
        if let Some(server) = self.server.take() {
            server.join().expect("server thread");
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.stop();
        let _ = umount2(&self.dir, MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A forked child that holds the mapping and waits to be killed.
struct Child(Pid);

impl Drop for Child {
    fn drop(&mut self) {
        // Our child: killed and reaped once.
        let _ = kill(self.0, Signal::SIGKILL);
        let _ = waitpid(self.0, None);
    }
}

#[test]
fn a_mapping_that_never_pages_in_times_out() {
    let mut mount = Mount::new();
    let file = std::fs::File::open(mount.dir.join("file")).expect("opening the file");
    // SAFETY: a fresh private mapping of the file; never touched here (a
    // fault would block this thread), unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            FILE_SIZE as usize,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    // The mapping keeps the file.
    drop(file);
    // The target is a child, as in the daemon (a fault holds the target's
    // memory map lock at times, which must not be this test's own).
    // SAFETY: the child only calls async-signal-safe functions (close, pause).
    let pid = match unsafe { fork() }.expect("fork") {
        ForkResult::Parent { child } => child,
        ForkResult::Child => {
            // Its copy of the device would keep the connection up when the
            // server closes its own.
            let _ = unistd::close(mount.device);
            // Until its SIGKILL.
            loop {
                unistd::pause();
            }
        }
    };
    let child = Child(pid);
    // SAFETY: the mapping made above, never used here; the child has its own.
    unsafe { libc::munmap(map, FILE_SIZE as usize) };

    let reader = Reader::new(ReaderLimits::default());
    let memory = reader.open(child.0.as_raw() as u32);
    let mut buffer = [0u8; 64];
    let start = Instant::now();
    let outcome = memory.read(map as u64 + 4096, &mut buffer);
    let took = start.elapsed();
    assert!(
        matches!(outcome, Err(MemoryError::TimedOut { .. })),
        "{outcome:?} after {took:?}"
    );
    assert!(took >= DEADLINE && took < 2 * DEADLINE, "{took:?}");
    assert!(mount.seen.read.load(Ordering::SeqCst), "the server saw no READ");
    // Blocked in the kernel, not in anything of ours.
    assert_eq!(reader.stats().abandoned_threads, 1);
    let (outcome, took) = {
        let start = Instant::now();
        (memory.read(map as u64, &mut buffer), start.elapsed())
    };
    assert!(matches!(outcome, Err(MemoryError::Stalled { .. })), "{outcome:?}");
    assert!(took < DEADLINE / 4);

    // The connection aborted, the read returns (with an error) and its thread ends.
    mount.stop();
    let start = Instant::now();
    while reader.stats().abandoned_threads != 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the blocked read never returned"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(child);
}
