//! A file read at explicit offsets (pread(2)), for object's `ReadCache`.
//!
//! The daemon hands the same open file to more than one worker: a new
//! binary is described by the symbolizer worker while the unwind-table
//! worker compiles its table. Descriptors passed over a socket (and their
//! dups) share one file offset, so through seek + read one worker's seek
//! could land between the other's seek and read and hand it the wrong
//! bytes. A position of this reader's own, read at with pread, cannot be
//! moved by anyone else.

use std::{
    fs::File,
    io::{self, Read, Seek, SeekFrom},
    os::{fd::OwnedFd, unix::fs::FileExt as _},
};

/// `Read + Seek` over a file, at a position no other descriptor moves.
pub(super) struct PositionalFile {
    file: File,
    position: u64,
}

impl PositionalFile {
    pub(super) fn new(file: File) -> Self {
        Self { file, position: 0 }
    }

    /// A reader over a duplicate of `fd` (the caller keeps its own).
    pub(super) fn dup(fd: &OwnedFd) -> io::Result<Self> {
        Ok(Self::new(File::from(fd.try_clone()?)))
    }
}

impl Read for PositionalFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self.file.read_at(buf, self.position)?;
        // `read` <= buf.len(), and a file's offsets fit in i64 (pread fails
        // past them), so the sum cannot wrap.
        self.position += read as u64;
        Ok(read)
    }
}

impl Seek for PositionalFile {
    fn seek(&mut self, from: SeekFrom) -> io::Result<u64> {
        let position = match from {
            SeekFrom::Start(at) => Some(at),
            SeekFrom::End(delta) => self.file.metadata()?.len().checked_add_signed(delta),
            SeekFrom::Current(delta) => self.position.checked_add_signed(delta),
        };
        self.position = position.ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "a seek before the start of the file")
        })?;
        Ok(self.position)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_at(offset: u64, len: usize) -> Vec<u8> {
        let mut file = File::open("/proc/self/exe").expect("our own binary");
        file.seek(SeekFrom::Start(offset)).expect("seek");
        let mut bytes = vec![0; len];
        file.read_exact(&mut bytes).expect("read");
        bytes
    }

    #[test]
    fn another_reader_of_the_same_open_file_does_not_move_this_one() {
        let file = File::open("/proc/self/exe").expect("our own binary");
        // A dup shares the file offset, as the descriptor another worker
        // received does.
        let mut other = file.try_clone().expect("dup");
        let mut reader = PositionalFile::new(file);
        reader.seek(SeekFrom::Start(4096)).expect("seek");
        other.seek(SeekFrom::Start(0)).expect("the other's seek");
        let mut got = vec![0; 64];
        reader.read_exact(&mut got).expect("read");
        assert_eq!(got, bytes_at(4096, 64));
        // Its reads moved its own position only.
        assert_eq!(other.stream_position().expect("the other's position"), 0);
        assert_eq!(reader.stream_position().expect("position"), 4160);
    }

    #[test]
    fn seeks_from_the_end_and_the_current_position() {
        let len = std::fs::metadata("/proc/self/exe").expect("our binary").len();
        let mut reader = PositionalFile::new(File::open("/proc/self/exe").expect("our binary"));
        assert_eq!(reader.seek(SeekFrom::End(0)).expect("len"), len);
        assert_eq!(reader.seek(SeekFrom::End(-16)).expect("end - 16"), len - 16);
        let mut tail = vec![0; 32];
        assert_eq!(reader.read(&mut tail).expect("read"), 16, "short at the end");
        assert_eq!(&tail[..16], bytes_at(len - 16, 16));
        assert_eq!(reader.seek(SeekFrom::Current(-32)).expect("back"), len - 32);
        assert!(reader.seek(SeekFrom::Current(-(len as i64) - 1)).is_err());
        assert!(reader.seek(SeekFrom::End(-(len as i64) - 1)).is_err());
    }
}
