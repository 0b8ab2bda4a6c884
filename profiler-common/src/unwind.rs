//! The unwinder's tables and stacks: rows of CFI, their chunks and ranges,
//! each process's mappings, and the stacks the sampler walked.

use crate::MAX_STACK_DEPTH;

/// User stacks: how the sampler walks them (a load-time global, see
/// [`crate::globals::UNWIND_MODE`]).
pub mod unwind_mode {
    /// bpf_get_stackid with BPF_F_USER_STACK: frame pointers only.
    pub const FRAME_POINTERS: u64 = 0;
    /// The sampler's own walk: CFI tables where loaded, frame pointers elsewhere.
    pub const TABLES: u64 = 1;
}

/// How a row finds the canonical frame address (CFA), in the low 4 bits of
/// [`UnwindRow::rules`].
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CfaRule {
    /// No FDE covers this pc (a gap between functions): use the frame pointer.
    NoInfo = 0,
    /// CFA = rsp + 8 * cfa_offset.
    Rsp = 1,
    /// CFA = rbp + 8 * cfa_offset.
    Rbp = 2,
    /// A PLT stub (GCC's expression): CFA = rsp + 8 + ((rip & 15) >= 11 ? 8 : 0).
    Plt = 3,
    /// CFA = *(rsp + 8 * (cfa_offset & 0xff)) + 8 * (cfa_offset >> 8) (stack realignment).
    DerefRsp = 4,
    /// A signal trampoline (`__restore_rt`, CIE augmentation "S"): rsp points
    /// at the kernel's ucontext, whose saved registers give the interrupted frame.
    Signal = 5,
    /// The return address is undefined here: the outermost frame (`_start`,
    /// a thread's start). The walk is complete.
    End = 6,
    /// A rule the walker cannot evaluate (another register, another expression).
    Unsupported = 7,
}

/// Where the caller's rbp is, in the high 4 bits of [`UnwindRow::rules`].
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RbpRule {
    /// Not saved by this frame: the caller's rbp is the current one.
    Unchanged = 0,
    /// Saved at CFA + 8 * rbp_offset.
    Offset = 1,
    /// Saved in a way the walker cannot follow; rbp is unknown from here on.
    Unsupported = 2,
}

/// One row of a compiled unwind table: from `pc` up to the next row's `pc`,
/// this is how to find the caller. Tables are sorted by `pc`, an ELF virtual
/// address of the file (what `.eh_frame` speaks); a table ends with a
/// [`CfaRule::NoInfo`] row at the end of its last FDE. The return address is
/// always at CFA - 8 (x86-64).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    pub pc: u32,
    /// In units of 8 bytes; see [`CfaRule`] (DerefRsp packs two offsets).
    pub cfa_offset: u16,
    /// In units of 8 bytes, relative to the CFA; see [`RbpRule::Offset`].
    pub rbp_offset: i8,
    /// `CfaRule as u8 | (RbpRule as u8) << 4`.
    pub rules: u8,
}

impl UnwindRow {
    pub const fn cfa_rule(&self) -> u8 {
        self.rules & 0x0f
    }
    pub const fn rbp_rule(&self) -> u8 {
        self.rules >> 4
    }
}

/// Rows per element of the rows map: tables are loaded a chunk (4 KiB) per
/// map update, and every table starts at a chunk boundary.
pub const UNWIND_ROWS_PER_CHUNK: usize = 512;

/// Chunks per group: the rows map is an array of groups (inner maps of
/// 1 MiB), created as tables need them, so its kernel memory follows the
/// tables loaded rather than the configured maximum. The daemon holds a
/// descriptor per group (writing to a group through its id needs
/// CAP_SYS_ADMIN, which the service does not have): 1 MiB keeps them to
/// one per MiB of `unwind_table_memory_mb` (64 at the default).
pub const UNWIND_GROUP_CHUNKS: usize = 256;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UnwindRowChunk {
    pub rows: [UnwindRow; UNWIND_ROWS_PER_CHUNK],
}

/// Where one file's table lies in the rows map (indexed by table id).
/// `rows == 0`: not loaded (never, or evicted).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindTableRange {
    /// Index of the first row (a multiple of [`UNWIND_ROWS_PER_CHUNK`]).
    pub first_row: u32,
    pub rows: u32,
}

/// Executable mappings kept per process for the walk.
pub const MAX_UNWIND_MAPPINGS: usize = 256;

/// One executable mapping of a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindMapping {
    pub start: u64,
    pub end: u64,
    /// Runtime address minus the file's virtual address: a pc's row is
    /// looked up at `pc - bias`.
    pub bias: u64,
    /// Index in the table-range map; 0: the file has no table (use frame pointers).
    pub table: u32,
    pub reserved: u32,
}

/// A process's executable mappings, sorted by `start`, for the walk.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UnwindProcess {
    pub count: u32,
    /// 1 when the process runs CPython and has a `PYTHON_PROCESSES` entry
    /// (written first): only then does the walk look it up.
    pub python: u32,
    pub mappings: [UnwindMapping; MAX_UNWIND_MAPPINGS],
}

/// Why a user-stack walk ended; each is counted (see [`crate::Counter`]) and stored
/// with the stack.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnwindEnd {
    /// Reached the outermost frame (undefined return address, rip 0, or a
    /// frame-pointer chain ending in 0).
    Complete = 0,
    /// A pc outside every known mapping of the process, and no frame pointer to follow.
    NoMapping = 1,
    /// A frame without a table whose frame pointer led nowhere.
    NoFramePointer = 2,
    /// A CFA or rbp rule the walker cannot evaluate.
    UnsupportedRule = 3,
    /// Reading the stack faulted (paged out, or garbage registers).
    ReadFault = 4,
    /// MAX_STACK_DEPTH frames and more to go.
    DepthLimit = 5,
    /// The process's table was not loaded yet (or evicted) and frame pointers
    /// could not continue.
    TableNotLoaded = 6,
}

/// A user stack the sampler unwound itself, deduplicated by `hash` in the
/// unwound-stacks maps (keyed by the hash's low bits; a different stack with
/// the same key goes through the spill ring).
///
/// A stack deeper than [`MAX_STACK_DEPTH`] (up to [`crate::MAX_USER_DEPTH`])
/// holds its leaf-most frames here and the rest in an `UnwoundStack` of the
/// unwound-tails map under the same key, with the same `hash`, its `len` the
/// frames in it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UnwoundStack {
    pub hash: u64,
    /// Frames in the whole stack (in a tail: in the tail).
    pub len: u32,
    /// An [`UnwindEnd`] as u32.
    pub end: u32,
    pub frames: [u64; MAX_STACK_DEPTH],
}

// The layout is the contract: no implicit padding, sizes fixed.
const _: () = assert!(core::mem::size_of::<UnwindRow>() == 8);
const _: () = assert!(core::mem::size_of::<UnwindRowChunk>() == 4096);
const _: () = assert!(core::mem::size_of::<UnwindTableRange>() == 8);
const _: () = assert!(core::mem::size_of::<UnwindMapping>() == 32);
const _: () = assert!(core::mem::size_of::<UnwindProcess>() == 8 + 32 * MAX_UNWIND_MAPPINGS);
const _: () = assert!(core::mem::size_of::<UnwoundStack>() == 16 + 8 * MAX_STACK_DEPTH);
