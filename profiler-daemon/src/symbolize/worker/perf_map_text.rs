//! The worker reads a perf map (`/tmp/perf-PID.map`, written by a JIT's
//! runtime: `START SIZE NAME` per line, hexadecimal, `0x` optional) from
//! where the daemon's last read ended. The file is its writer's: any user's,
//! any size, any bytes, and growing while it is read. Only whole lines are
//! taken; each is bounded, and a bad one is counted and skipped.

use std::os::fd::OwnedFd;

use super::protocol::{self, MAX_NAME_BYTES, PerfMapChunk, PerfMapRead, PerfMapSymbol};

/// Read per request at most (a busy Node process writes a few MiB).
pub const MAX_CHUNK_BYTES: u64 = 4 << 20;
/// Symbols per request at most.
pub const MAX_CHUNK_SYMBOLS: usize = 65_536;
/// A line longer than this is no symbol of a runtime we know.
const MAX_LINE_BYTES: usize = MAX_NAME_BYTES + 64;
/// No JIT compiles one function into more than this.
pub const MAX_SYMBOL_SIZE: u64 = 1 << 30;
/// Above every user-space address of the architectures we run on.
pub const MAX_ADDRESS: u64 = 1 << 57;

/// The head of a file compared between reads, at most.
pub const MAX_HEAD_BYTES: u64 = 4096;

/// Reads `read.from` onwards of `fd` (at most `read.max_bytes`), parses the
/// lines, and hashes the file's first `read.head_bytes`.
pub fn read_chunk(fd: &OwnedFd, read: PerfMapRead) -> Result<PerfMapChunk, String> {
    let max = usize::try_from(read.max_bytes.min(MAX_CHUNK_BYTES)).unwrap_or(0);
    let bytes = read_at(fd, read.from, max)?;
    let mut chunk = parse_chunk(&bytes, read.from, bytes.len() == max);
    chunk.head_len = match read.head_bytes {
        0 => chunk.read_to.min(MAX_HEAD_BYTES),
        asked => asked.min(MAX_HEAD_BYTES),
    };
    let head_len = usize::try_from(chunk.head_len).unwrap_or(0);
    if head_len > 0 {
        let head = read_at(fd, 0, head_len)?;
        if head.len() == head_len {
            chunk.head_hash = head_hash(&head);
        }
    }
    Ok(chunk)
}

/// FNV-1a of the head of a file (never 0, which says "too short").
pub fn head_hash(bytes: &[u8]) -> u64 {
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    hash.max(1)
}

/// Up to `len` bytes of `fd` from `from` (fewer at its end).
fn read_at(fd: &OwnedFd, from: u64, len: usize) -> Result<Vec<u8>, String> {
    let mut bytes = vec![0; len];
    let mut filled = 0;
    while filled < len {
        let at = i64::try_from(from + filled as u64).map_err(|_| "offset out of range".to_owned())?;
        match nix::sys::uio::pread(fd, &mut bytes[filled..], at) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(nix::errno::Errno::EINTR) => {}
            Err(err) => return Err(format!("reading the perf map: {err}")),
        }
    }
    bytes.truncate(filled);
    Ok(bytes)
}

/// Parses the whole lines of `bytes` (read from byte `from` of the file;
/// `full`: the read stopped at its bound, not at the end of the file).
pub fn parse_chunk(bytes: &[u8], from: u64, full: bool) -> PerfMapChunk {
    let mut chunk = PerfMapChunk {
        symbols: Vec::new(),
        read_to: from,
        bad_lines: 0,
        head_hash: 0,
        head_len: 0,
    };
    let mut consumed = 0;
    while let Some(length) = bytes[consumed..].iter().position(|&byte| byte == b'\n') {
        if chunk.symbols.len() >= MAX_CHUNK_SYMBOLS {
            break;
        }
        let line = &bytes[consumed..consumed + length];
        consumed += length + 1;
        match parse_line(line) {
            Some(symbol) => chunk.symbols.push(symbol),
            None if line.is_empty() => {}
            None => chunk.bad_lines += 1,
        }
    }
    if consumed == 0 && full && !bytes.is_empty() {
        // A whole chunk without a line end: no line of a runtime. Skipped,
        // or the next read would start here again.
        consumed = bytes.len();
        chunk.bad_lines += 1;
    }
    chunk.read_to = from + consumed as u64;
    chunk
}

fn parse_line(line: &[u8]) -> Option<PerfMapSymbol> {
    if line.len() > MAX_LINE_BYTES {
        return None;
    }
    let line = std::str::from_utf8(line).ok()?;
    let (start, rest) = line.split_once(' ')?;
    let (size, name) = rest.split_once(' ')?;
    let start = hex(start)?;
    let size = hex(size)?;
    let end = start.checked_add(size)?;
    let name = name.trim_end_matches('\r');
    if size == 0 || size > MAX_SYMBOL_SIZE || end > MAX_ADDRESS || name.is_empty() {
        return None;
    }
    Some(PerfMapSymbol {
        start,
        size,
        name: protocol::bounded(name.to_owned(), MAX_NAME_BYTES),
    })
}

fn hex(text: &str) -> Option<u64> {
    let digits = text.strip_prefix("0x").unwrap_or(text);
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(chunk: &PerfMapChunk) -> Vec<(u64, u64, &str)> {
        chunk
            .symbols
            .iter()
            .map(|symbol| (symbol.start, symbol.size, symbol.name.as_str()))
            .collect()
    }

    #[test]
    fn node_and_jvm_lines_parse_and_a_partial_last_line_waits() {
        let text = b"3ef414a0e0 2c LazyCompile:*hotA /srv/app.js:3:14\n\
                     0x00007f3a1c01d2a0 0x0000000000000120 void Main.hotB(int)\n\
                     7f00 10 half-writ";
        let chunk = parse_chunk(text, 100, false);
        assert_eq!(
            names(&chunk),
            [
                (0x3ef414a0e0, 0x2c, "LazyCompile:*hotA /srv/app.js:3:14"),
                (0x7f3a1c01d2a0, 0x120, "void Main.hotB(int)"),
            ]
        );
        assert_eq!(chunk.bad_lines, 0);
        let whole = text.len() - b"7f00 10 half-writ".len();
        assert_eq!(
            chunk.read_to,
            100 + whole as u64,
            "the partial line is read again later"
        );
    }

    #[test]
    fn absurd_lines_are_counted_and_skipped() {
        let long = format!("1000 10 {}\n", "x".repeat(1 << 20));
        let text = format!(
            "zz 10 bad hex\n1000 0 empty\nffffffffffffff00 1000 wraps\n1000 80000000 huge\n1000 10\n\n{long}2000 10 good\n"
        );
        let chunk = parse_chunk(text.as_bytes(), 0, false);
        assert_eq!(names(&chunk), [(0x2000, 0x10, "good")]);
        assert_eq!(chunk.bad_lines, 6);
        assert_eq!(chunk.read_to, text.len() as u64);
    }

    #[test]
    fn a_full_chunk_without_a_line_end_is_skipped() {
        let chunk = parse_chunk(&[b'a'; 64], 0, true);
        assert_eq!((chunk.read_to, chunk.bad_lines, chunk.symbols.len()), (64, 1, 0));
        let waiting = parse_chunk(&[b'a'; 64], 0, false);
        assert_eq!(
            waiting.read_to, 0,
            "at the end of the file, the line may still be written"
        );
    }
}
