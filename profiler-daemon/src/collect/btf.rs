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
}

struct Type {
    name_off: u32,
    kind: u32,
    kind_flag: bool,
    /// Size, or referenced type id (typedef, const, ...).
    size_or_type: u32,
    /// (name_off, type id, bit offset) for structs and unions.
    members: Vec<(u32, u32, u32)>,
}

pub struct Btf {
    /// Index = type id; id 0 is `void`.
    types: Vec<Option<Type>>,
    strings: Vec<u8>,
}

fn u32_at(data: &[u8], at: usize) -> Result<u32, BtfError> {
    data.get(at..at + 4)
        .map(|bytes| u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
        .ok_or(BtfError::Truncated)
}

impl Btf {
    pub fn parse(data: &[u8]) -> Result<Self, BtfError> {
        if data.len() < 24 || u16::from_le_bytes([data[0], data[1]]) != MAGIC {
            return Err(BtfError::BadHeader);
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let (type_off, type_len) = (u32_at(data, 8)? as usize, u32_at(data, 12)? as usize);
        let (str_off, str_len) = (u32_at(data, 16)? as usize, u32_at(data, 20)? as usize);
        let section = |off: usize, len: usize| {
            data.get(hdr_len + off..hdr_len + off + len)
                .ok_or(BtfError::Truncated)
        };
        let type_data = section(type_off, type_len)?;
        let strings = section(str_off, str_len)?.to_vec();
        let mut types = vec![None];
        let mut at = 0;
        while at < type_data.len() {
            let info = u32_at(type_data, at + 4)?;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let mut ty = Type {
                name_off: u32_at(type_data, at)?,
                kind,
                kind_flag: info >> 31 == 1,
                size_or_type: u32_at(type_data, at + 8)?,
                members: Vec::new(),
            };
            at += 12;
            let extra = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                _ => 0,
            };
            if kind == KIND_STRUCT || kind == KIND_UNION {
                for member in 0..vlen {
                    let base = at + member * 12;
                    ty.members.push((
                        u32_at(type_data, base)?,
                        u32_at(type_data, base + 4)?,
                        u32_at(type_data, base + 8)?,
                    ));
                }
            }
            at += extra;
            types.push(Some(ty));
        }
        Ok(Self { types, strings })
    }

    fn name(&self, offset: u32) -> &[u8] {
        let rest = self.strings.get(offset as usize..).unwrap_or_default();
        &rest[..rest.iter().position(|&byte| byte == 0).unwrap_or(rest.len())]
    }

    fn get(&self, id: u32) -> Option<&Type> {
        self.types.get(id as usize)?.as_ref()
    }

    /// Follows typedefs and qualifiers to the underlying type.
    fn resolve(&self, mut id: u32) -> Option<&Type> {
        for _ in 0..32 {
            let ty = self.get(id)?;
            match ty.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = ty.size_or_type
                }
                _ => return Some(ty),
            }
        }
        None
    }

    /// Byte offset of `path` (e.g. `["se", "sum_exec_runtime"]`) inside `struct name`.
    pub fn member_offset(&self, name: &str, path: &[&str]) -> Result<u32, BtfError> {
        let mut ty = self
            .types
            .iter()
            .flatten()
            .find(|ty| ty.kind == KIND_STRUCT && self.name(ty.name_off) == name.as_bytes())
            .ok_or_else(|| BtfError::NoStruct(name.to_owned()))?;
        let mut offset_bits = 0;
        for (depth, member) in path.iter().enumerate() {
            let (type_id, bits) = self.find_member(ty, member).ok_or_else(|| BtfError::NoMember {
                ty: path[..depth]
                    .iter()
                    .fold(name.to_owned(), |acc, part| format!("{acc}.{part}")),
                member: (*member).to_owned(),
            })?;
            offset_bits += bits;
            if depth + 1 < path.len() {
                ty = self.resolve(type_id).ok_or(BtfError::Truncated)?;
            }
        }
        Ok(offset_bits / 8)
    }

    /// (type id, bit offset) of a member, looking inside anonymous structs and
    /// unions too (randomized layouts put fields in one).
    fn find_member(&self, ty: &Type, wanted: &str) -> Option<(u32, u32)> {
        for &(name_off, type_id, raw_offset) in &ty.members {
            // With kind_flag, the top 8 bits hold a bitfield size.
            let bits = if ty.kind_flag {
                raw_offset & 0x00ff_ffff
            } else {
                raw_offset
            };
            let name = self.name(name_off);
            if name == wanted.as_bytes() {
                return Some((type_id, bits));
            }
            if name.is_empty()
                && let Some(inner) = self.resolve(type_id)
                && matches!(inner.kind, KIND_STRUCT | KIND_UNION)
                && let Some((id, inner_bits)) = self.find_member(inner, wanted)
            {
                return Some((id, bits + inner_bits));
            }
        }
        None
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
    let data = std::fs::read(VMLINUX).map_err(|err| format!("{VMLINUX}: {err}"))?;
    let btf = Btf::parse(&data).map_err(|err| format!("{VMLINUX}: {err}"))?;
    let offset = |path: &[&str]| {
        btf.member_offset("task_struct", path)
            .map_err(|err| err.to_string())
    };
    Ok(TaskOffsets {
        runtime: offset(&["se", "sum_exec_runtime"])?,
        start_time: offset(&["start_time"])?,
        pid: offset(&["pid"])?,
        fsbase: offset(&["thread", "fsbase"]).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob: int; struct inner { int a; int b; }; struct outer { int x;
    /// struct { struct inner in; }; } — the field sits in an anonymous struct.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0inner\0a\0b\0outer\0x\0in\0".to_vec();
        let name = |s: &str| {
            let needle = [s.as_bytes(), b"\0"].concat();
            strings
                .windows(needle.len())
                .position(|w| w == needle)
                .expect("name in table") as u32
        };
        let mut types = Vec::new();
        let mut push = |words: &[u32]| {
            words
                .iter()
                .for_each(|w| types.extend_from_slice(&w.to_le_bytes()))
        };
        push(&[name("int"), KIND_INT << 24, 4, 32]); // id 1
        push(&[name("inner"), (KIND_STRUCT << 24) | 2, 8]); // id 2
        push(&[name("a"), 1, 0]);
        push(&[name("b"), 1, 32]);
        push(&[0, (KIND_STRUCT << 24) | 1, 8]); // id 3: anonymous
        push(&[name("in"), 2, 0]);
        push(&[name("outer"), (KIND_STRUCT << 24) | 2, 16]); // id 4
        push(&[name("x"), 1, 0]);
        push(&[0, 3, 64]);
        let mut data = Vec::new();
        for word in [
            u32::from(MAGIC) | (1 << 16),
            24,
            0,
            types.len() as u32,
            types.len() as u32,
        ] {
            data.extend_from_slice(&word.to_le_bytes());
        }
        data.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        data.extend_from_slice(&types);
        data.extend_from_slice(&strings);
        data
    }

    #[test]
    fn finds_members_through_anonymous_structs() {
        let btf = Btf::parse(&blob()).expect("valid blob");
        assert_eq!(btf.member_offset("outer", &["x"]), Ok(0));
        assert_eq!(btf.member_offset("outer", &["in", "b"]), Ok(8 + 4));
        assert_eq!(
            btf.member_offset("outer", &["in", "c"]),
            Err(BtfError::NoMember {
                ty: "outer.in".into(),
                member: "c".into()
            })
        );
        assert_eq!(
            btf.member_offset("nope", &["x"]),
            Err(BtfError::NoStruct("nope".into()))
        );
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(
            Btf::parse(b"not btf at all, not at all").err(),
            Some(BtfError::BadHeader)
        );
        let mut truncated = blob();
        truncated.truncate(40);
        assert_eq!(Btf::parse(&truncated).err(), Some(BtfError::Truncated));
    }

    #[test]
    fn finds_the_task_runtime_in_this_kernel() {
        let offsets = task_offsets().expect("this kernel has BTF with task_struct.se.sum_exec_runtime");
        for offset in [offsets.runtime, offsets.start_time] {
            assert!(
                offset > 0 && offset < 16384 && offset % 8 == 0,
                "implausible offset {offset}"
            );
        }
    }
}
