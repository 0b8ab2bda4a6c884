//! CPython frames in the sampler's walk: where a process's interpreter
//! keeps its state (written by the daemon per process, from the version's
//! layout), and how a Python frame is stored among the native ones.
//!
//! A Python frame takes one slot of the stack, like a native one, so a
//! Python stack is as deep as a native one: bit 63 (never set in a user
//! address on x86-64) marks it, and the rest packs the code object's
//! address, the instruction it was at and a few bits of the code object's
//! identity, which the daemon checks when it reads the code object (an
//! address freed and reused by another code object is not misnamed).

/// Marks a stack slot as a Python frame.
pub const FRAME_TAG: u64 = 1 << 63;
/// Code objects are 16-byte aligned (pymalloc and malloc both): their
/// address is stored shifted by this, in the low [`CODE_BITS`] bits.
pub const CODE_SHIFT: u32 = 4;
pub const CODE_BITS: u32 = 43;
/// Instruction index in code units (2 bytes), or [`NO_INSTRUCTION`].
pub const INSTRUCTION_SHIFT: u32 = CODE_BITS;
pub const INSTRUCTION_BITS: u32 = 15;
/// A frame that has not run an instruction yet, or is past the bits.
pub const NO_INSTRUCTION: u64 = (1 << INSTRUCTION_BITS) - 1;
pub const KEY_SHIFT: u32 = CODE_BITS + INSTRUCTION_BITS;
pub const KEY_BITS: u32 = 5;

/// A Python frame as stored in a stack slot.
pub const fn encode_frame(code: u64, instruction: u64, key: u64) -> u64 {
    let instruction = if instruction > NO_INSTRUCTION {
        NO_INSTRUCTION
    } else {
        instruction
    };
    FRAME_TAG
        | ((key & ((1 << KEY_BITS) - 1)) << KEY_SHIFT)
        | (instruction << INSTRUCTION_SHIFT)
        | ((code >> CODE_SHIFT) & ((1 << CODE_BITS) - 1))
}

/// (code object address, instruction index, key) of a stored Python frame.
pub const fn decode_frame(slot: u64) -> (u64, u64, u64) {
    (
        (slot & ((1 << CODE_BITS) - 1)) << CODE_SHIFT,
        (slot >> INSTRUCTION_SHIFT) & NO_INSTRUCTION,
        (slot >> KEY_SHIFT) & ((1 << KEY_BITS) - 1),
    )
}

pub const fn is_python_frame(slot: u64) -> bool {
    slot & FRAME_TAG != 0
}

/// The identity bits of a code object: its first line number folded.
/// The sampler and the daemon compute it alike.
pub const fn code_key(first_line: u32) -> u64 {
    let folded =
        first_line ^ (first_line >> 5) ^ (first_line >> 10) ^ (first_line >> 15) ^ (first_line >> 20);
    (folded & ((1 << KEY_BITS) - 1)) as u64
}

/// How the frames of a version chain to each other and to the C stack.
pub mod frame_model {
    /// 3.8–3.10: `PyFrameObject`s, one per call of the eval loop.
    pub const FRAME_OBJECTS: u8 = 1;
    /// 3.11: `_PyInterpreterFrame`s; the eval loop's first frame has `is_entry` set.
    pub const ENTRY_FLAG: u8 = 2;
    /// 3.12+: the eval loop pushes a shim frame owned by the C stack.
    pub const C_STACK_OWNER: u8 = 3;
}

/// What a frame's instruction field holds.
pub mod instruction_model {
    /// An int, the offset of the last instruction in bytes (3.8, 3.9).
    pub const LASTI_BYTES: u8 = 1;
    /// An int, the index of the last instruction in code units (3.10).
    pub const LASTI_UNITS: u8 = 2;
    /// A pointer to the last instruction run (3.11, 3.12: `prev_instr`).
    pub const PREVIOUS_POINTER: u8 = 3;
    /// A pointer to the instruction running now (3.13+: `instr_ptr`).
    pub const CURRENT_POINTER: u8 = 4;
}

/// Value of `_PyInterpreterFrame.owner` for the eval loop's entry frame
/// (3.12+): `FRAME_OWNED_BY_CSTACK` in 3.12 and 3.13, renamed
/// `FRAME_OWNED_BY_INTERPRETER` in 3.14 with the same value (3.14's
/// `FRAME_OWNED_BY_CSTACK` is 4, not an eval call's entry).
pub const FRAME_OWNED_BY_CSTACK: u8 = 3;

/// Sent through the `PYTHON_CODES` ring when a CPU records a code object it
/// has not recorded lately: the daemon reads it while the process lives (a
/// short-lived process is gone by the time its samples are drained).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonCodeSeen {
    pub tgid: u32,
    /// The process instance the sampler knows it by (0: unknown).
    pub instance: u32,
    pub code: u64,
}

/// Code objects each CPU remembers having announced (direct-mapped).
pub const SEEN_CODES: usize = 1024;

/// Python threads scanned to find the sampled thread's state.
pub const MAX_THREAD_SCAN: u32 = 64;

/// A CPython process as the sampler walks it (map `PYTHON_PROCESSES`, by
/// tgid; the daemon writes it with the process's unwind entry, the sampler
/// removes it at exec and exit). Offsets are bytes into each struct.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonProcess {
    /// Runtime address of `_PyRuntime`.
    pub runtime: u64,
    /// Runtime addresses of the eval loop (`_PyEval_EvalFrameDefault`):
    /// a native frame in [start, end) is where Python frames go.
    pub eval_start: u64,
    pub eval_end: u64,
    /// (major << 8) | minor, for the daemon's and the reader's sake.
    pub version: u16,
    /// One of [`frame_model`].
    pub frame_model: u8,
    /// One of [`instruction_model`].
    pub instruction_model: u8,
    /// `_PyRuntime.interpreters.head`.
    pub runtime_interpreters_head: u16,
    /// `PyInterpreterState.threads.head` (`tstate_head` before 3.11).
    pub interpreter_threads_head: u16,
    /// `PyThreadState.next`.
    pub thread_next: u16,
    /// `PyThreadState.thread_id`: the thread's pthread_t, its TLS base.
    pub thread_id: u16,
    /// `PyThreadState.frame` (3.8–3.10), `.cframe` (3.11, 3.12) or
    /// `.current_frame` (3.13+).
    pub thread_frame: u16,
    /// `_PyCFrame.current_frame` (3.11, 3.12); `u16::MAX` when the thread's
    /// field is the frame itself.
    pub cframe_current_frame: u16,
    /// The frame's caller: `f_back` / `previous`.
    pub frame_previous: u16,
    /// `f_code` / `f_executable`.
    pub frame_code: u16,
    /// `f_lasti` / `prev_instr` / `instr_ptr`.
    pub frame_instruction: u16,
    /// `is_entry` (3.11) or `owner` (3.12+): a byte.
    pub frame_entry: u16,
    /// `co_firstlineno` (an int).
    pub code_first_line: u16,
    /// Where the bytecode starts in the code object (3.11+: `co_code_adaptive`).
    pub code_instructions: u16,
    /// Tag bits to clear from `f_executable` (3.14+: a `_PyStackRef`, whose
    /// low bit marks a deferred or immortal reference); 0 before.
    pub frame_code_tag: u16,
    pub reserved: u16,
}

const _: () = assert!(core::mem::size_of::<PythonProcess>() == 3 * 8 + 4 + 12 * 2 + 4);
const _: () = assert!(core::mem::size_of::<PythonProcess>().is_multiple_of(8));
const _: () = assert!(core::mem::size_of::<PythonCodeSeen>() == 16);

#[cfg(feature = "user")]
// SAFETY: repr(C), only integer fields, no padding (asserted above).
unsafe impl aya::Pod for PythonProcess {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for PythonCodeSeen {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let code = 0x7f12_3456_7890;
        let slot = encode_frame(code, 1234, code_key(42));
        assert!(is_python_frame(slot));
        assert_eq!(decode_frame(slot), (code, 1234, code_key(42)));
        assert_eq!(decode_frame(encode_frame(code, 1 << 20, 0)).1, NO_INSTRUCTION);
        assert!(!is_python_frame(0x7fff_ffff_f000));
    }
}
