//! Just enough of the kernel's BTF to find a struct member's byte offset.
//!
//! The sampler reads the current task's `se.sum_exec_runtime` (the kernel's
//! own per-thread CPU time); its offset in `task_struct` differs between
//! kernels and builds, and /sys/kernel/btf/vmlinux says where it is.

const MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("not BTF data (bad magic or header)")]
    BadHeader,
    #[error("BTF data truncated")]
    Truncated,
    #[error("struct {0} not found in BTF")]
    NoStruct(String),
    #[error("member {member} not found in struct {ty}")]
    NoMember { ty: String, member: String },
    #[error("reading BTF: {0}")]
    Read(std::io::ErrorKind),
}

/// Bytes at an offset: the BTF file (`pread`), or a blob in tests.
pub trait ReadAt {
    /// Reads into `buf` from `offset`; fewer bytes only at the end.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize>;
}

impl ReadAt for std::fs::File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(self, buf, offset)
    }
}

impl ReadAt for [u8] {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let rest = usize::try_from(offset)
            .ok()
            .and_then(|at| self.get(at..))
            .unwrap_or_default();
        let len = buf.len().min(rest.len());
        buf[..len].copy_from_slice(&rest[..len]);
        Ok(len)
    }
}

/// Fills `buf` from `offset`, or says the data ends before.
fn read_exact_at(source: &(impl ReadAt + ?Sized), buf: &mut [u8], offset: u64) -> Result<(), BtfError> {
    let mut filled = 0;
    while filled < buf.len() {
        match source.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => return Err(BtfError::Truncated),
            Ok(read) => filled += read,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => return Err(BtfError::Read(err.kind())),
        }
    }
    Ok(())
}

/// Reads a section front to back through one buffer: the kernel's BTF is
/// about 5 MB, and reading it whole, with a parsed copy of every type, was
/// the daemon's peak heap (14 MB at start, three times what it holds after).
struct Window<'a, R: ?Sized> {
    source: &'a R,
    end: u64,
    base: u64,
    buf: Vec<u8>,
}

impl<'a, R: ReadAt + ?Sized> Window<'a, R> {
    const BYTES: usize = 64 << 10;

    fn new(source: &'a R, end: u64) -> Self {
        Self {
            source,
            end,
            base: 0,
            buf: Vec::new(),
        }
    }

    /// The `len` bytes at `at` (`len` at most [`Self::BYTES`]).
    fn get(&mut self, at: u64, len: usize) -> Result<&[u8], BtfError> {
        let fits = |base: u64, buf: &[u8]| at >= base && at + len as u64 <= base + buf.len() as u64;
        if !fits(self.base, &self.buf) {
            let want = (Self::BYTES as u64).min(self.end.saturating_sub(at));
            self.buf.resize(usize::try_from(want).unwrap_or(Self::BYTES), 0);
            read_exact_at(self.source, &mut self.buf, at)?;
            self.base = at;
            if !fits(self.base, &self.buf) {
                return Err(BtfError::Truncated);
            }
        }
        // `fits`: `at - base` is within the buffer, which is a usize long.
        let from = usize::try_from(at - self.base).unwrap_or(usize::MAX);
        Ok(&self.buf[from..from + len])
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// A type's record: its 12-byte header, and the members of a struct or union.
struct Type {
    kind: u32,
    kind_flag: bool,
    /// Size, or referenced type id (typedef, const, ...).
    size_or_type: u32,
    /// (name_off, type id, bit offset) for structs and unions.
    members: Vec<(u32, u32, u32)>,
}

/// Just enough of a BTF blob to follow a path of members of one struct:
/// where each type's record starts (4 bytes a type), read from `source` as
/// needed.
pub struct Btf<'a, R: ?Sized> {
    source: &'a R,
    /// The struct's name.
    name: String,
    types_at: u64,
    strings_at: u64,
    strings_len: u64,
    /// Index = type id: the record's offset in the type section; id 0 is `void`.
    records: Vec<u32>,
    /// Ids of the structs named as asked.
    named: Vec<u32>,
}

/// Anonymous members nest this deep at most (the kernel's nest 2 or 3 deep).
const MAX_NESTING: usize = 16;
/// Anonymous members entered in one search, each a chain of qualifiers to
/// a struct and its members; past this, the member is reported not found.
/// The kernel's BTF has no member loops, but a struct embedding one
/// anonymous struct many times over, 16 deep, would be read vlen^16 times.
const MAX_VISITS: u32 = 4096;

impl<'a, R: ReadAt + ?Sized> Btf<'a, R> {
    /// Indexes `source`'s types, noting the structs called `name`. Names in
    /// BTF start right after a NUL (the kernel's string table is a list of
    /// whole strings), so only whole strings are looked for.
    pub fn index(source: &'a R, name: &str) -> Result<Self, BtfError> {
        let mut header = [0u8; 24];
        read_exact_at(source, &mut header, 0).map_err(|err| match err {
            BtfError::Truncated => BtfError::BadHeader,
            other => other,
        })?;
        if u16::from_le_bytes([header[0], header[1]]) != MAGIC {
            return Err(BtfError::BadHeader);
        }
        let hdr_len = u64::from(u32_at(&header, 4));
        let (type_off, type_len) = (u64::from(u32_at(&header, 8)), u64::from(u32_at(&header, 12)));
        let (str_off, str_len) = (u64::from(u32_at(&header, 16)), u64::from(u32_at(&header, 20)));
        let mut btf = Self {
            source,
            name: name.to_owned(),
            types_at: hdr_len + type_off,
            strings_at: hdr_len + str_off,
            strings_len: str_len,
            records: vec![0],
            named: Vec::new(),
        };
        let names = btf.string_offsets(name)?;
        if names.is_empty() {
            return Err(BtfError::NoStruct(name.to_owned()));
        }
        let mut types = Window::new(source, btf.types_at + type_len);
        let mut at = 0;
        while at < type_len {
            let record = u32::try_from(at).map_err(|_| BtfError::Truncated)?;
            let header = types.get(btf.types_at + at, 12)?;
            let (name_off, info) = (u32_at(header, 0), u32_at(header, 4));
            let vlen = u64::from(info & 0xffff);
            let kind = (info >> 24) & 0x1f;
            if kind == KIND_STRUCT && names.contains(&name_off) {
                btf.named
                    .push(u32::try_from(btf.records.len()).map_err(|_| BtfError::Truncated)?);
            }
            btf.records.push(record);
            at += 12
                + match kind {
                    KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                    KIND_ARRAY => 12,
                    KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                    KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                    _ => 0,
                };
        }
        if at != type_len {
            return Err(BtfError::Truncated);
        }
        Ok(btf)
    }

    /// Offsets of the strings equal to `name`, found by streaming the string
    /// section (every string follows a NUL: the section starts with "").
    fn string_offsets(&self, name: &str) -> Result<Vec<u32>, BtfError> {
        let needle = [b"\0", name.as_bytes(), b"\0"].concat();
        // Windows must overlap by less than their length.
        let Some(step) = Window::<R>::BYTES
            .checked_sub(needle.len())
            .filter(|&step| step > 0)
        else {
            return Ok(Vec::new());
        };
        let step = step as u64;
        let mut strings = Window::new(self.source, self.strings_at + self.strings_len);
        let mut found = Vec::new();
        let mut at = 0;
        while at + needle.len() as u64 <= self.strings_len {
            let len = (Window::<R>::BYTES as u64).min(self.strings_len - at);
            let chunk = strings.get(self.strings_at + at, usize::try_from(len).unwrap_or(0))?;
            // Windows overlap by the needle's length less one: a match is
            // seen in the window where it starts before `step`.
            for (index, window) in chunk.windows(needle.len()).enumerate() {
                if window == needle.as_slice() && (index as u64) < step {
                    found.push(u32::try_from(at + index as u64 + 1).map_err(|_| BtfError::Truncated)?);
                }
            }
            at += step;
        }
        Ok(found)
    }

    /// Whether the string at `offset` is `wanted` (`""`: an anonymous member).
    fn name_is(&self, offset: u32, wanted: &str) -> Result<bool, BtfError> {
        let offset = u64::from(offset);
        if offset >= self.strings_len {
            return Err(BtfError::Truncated);
        }
        let len = (wanted.len() as u64 + 1).min(self.strings_len - offset);
        let mut bytes = vec![0u8; usize::try_from(len).map_err(|_| BtfError::Truncated)?];
        read_exact_at(self.source, &mut bytes, self.strings_at + offset)?;
        Ok(bytes.strip_suffix(&[0]) == Some(wanted.as_bytes()))
    }

    fn get(&self, id: u32) -> Result<Type, BtfError> {
        let record = *self.records.get(id as usize).ok_or(BtfError::Truncated)?;
        let at = self.types_at + u64::from(record);
        let mut header = [0u8; 12];
        read_exact_at(self.source, &mut header, at)?;
        let info = u32_at(&header, 4);
        let kind = (info >> 24) & 0x1f;
        let mut members = Vec::new();
        if kind == KIND_STRUCT || kind == KIND_UNION {
            let mut bytes = vec![0u8; 12 * (info & 0xffff) as usize];
            read_exact_at(self.source, &mut bytes, at + 12)?;
            members = bytes
                .as_chunks::<12>()
                .0
                .iter()
                .map(|member| (u32_at(member, 0), u32_at(member, 4), u32_at(member, 8)))
                .collect();
        }
        Ok(Type {
            kind,
            kind_flag: info >> 31 == 1,
            size_or_type: u32_at(&header, 8),
            members,
        })
    }

    /// Follows typedefs and qualifiers to the underlying type.
    fn resolve(&self, mut id: u32) -> Result<Type, BtfError> {
        for _ in 0..32 {
            let ty = self.get(id)?;
            match ty.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = ty.size_or_type
                }
                _ => return Ok(ty),
            }
        }
        Err(BtfError::Truncated)
    }

    /// Byte offset of `path` (e.g. `["se", "sum_exec_runtime"]`) inside
    /// the struct [`Btf::index`] was asked for.
    pub fn member_offset(&self, path: &[&str]) -> Result<u32, BtfError> {
        let first = *self
            .named
            .first()
            .ok_or_else(|| BtfError::NoStruct(self.name.clone()))?;
        let mut ty = self.get(first)?;
        let mut offset_bits = 0;
        for (depth, member) in path.iter().enumerate() {
            let mut visits = 0;
            let (type_id, bits) =
                self.find_member(&ty, member, 0, &mut visits)?
                    .ok_or_else(|| BtfError::NoMember {
                        ty: path[..depth]
                            .iter()
                            .fold(self.name.clone(), |acc, part| format!("{acc}.{part}")),
                        member: (*member).to_owned(),
                    })?;
            offset_bits += bits;
            if depth + 1 < path.len() {
                ty = self.resolve(type_id)?;
            }
        }
        Ok(offset_bits / 8)
    }

    /// (type id, bit offset) of a member, looking inside anonymous structs and
    /// unions too (randomized layouts put fields in one).
    fn find_member(
        &self,
        ty: &Type,
        wanted: &str,
        nesting: usize,
        visits: &mut u32,
    ) -> Result<Option<(u32, u32)>, BtfError> {
        for &(name_off, type_id, raw_offset) in &ty.members {
            // With kind_flag, the top 8 bits hold a bitfield size.
            let bits = if ty.kind_flag {
                raw_offset & 0x00ff_ffff
            } else {
                raw_offset
            };
            if self.name_is(name_off, wanted)? {
                return Ok(Some((type_id, bits)));
            }
            if nesting < MAX_NESTING && *visits < MAX_VISITS && self.name_is(name_off, "")? {
                *visits += 1;
                let inner = self.resolve(type_id)?;
                if matches!(inner.kind, KIND_STRUCT | KIND_UNION)
                    && let Some((id, inner_bits)) = self.find_member(&inner, wanted, nesting + 1, visits)?
                {
                    return Ok(Some((id, bits + inner_bits)));
                }
            }
        }
        Ok(None)
    }
}

/// Offsets in the running kernel's `task_struct` of the thread's CPU time
/// (`se.sum_exec_runtime`), its start time (`start_time`) and its id (`pid`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskOffsets {
    pub runtime: u32,
    pub start_time: u32,
    /// `pid`: the thread id.
    pub pid: u32,
    /// `thread.fsbase`: the TLS base, by which a CPython thread state is
    /// found (0: unknown; Python frames are then not walked).
    pub fsbase: u32,
}

pub fn task_offsets() -> Result<TaskOffsets, String> {
    const VMLINUX: &str = "/sys/kernel/btf/vmlinux";
    let file = std::fs::File::open(VMLINUX).map_err(|err| format!("{VMLINUX}: {err}"))?;
    let btf = Btf::index(&file, "task_struct").map_err(|err| format!("{VMLINUX}: {err}"))?;
    let offset = |path: &[&str]| btf.member_offset(path).map_err(|err| err.to_string());
    Ok(TaskOffsets {
        runtime: offset(&["se", "sum_exec_runtime"])?,
        start_time: offset(&["start_time"])?,
        pid: offset(&["pid"])?,
        fsbase: offset(&["thread", "fsbase"]).unwrap_or(0),
    })
}

#[cfg(test)]
#[path = "btf_tests.rs"]
mod tests;
