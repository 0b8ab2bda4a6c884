//! One user-stack walk's state, shared by the native unwinder (`unwind`)
//! and the Python frame walk (`python`), and the hash that names the stack.

use profiler_common::{MAX_STACK_DEPTH, UnwindRow, UnwoundStack};

/// FNV-1a over the frames: the stack's key in the unwound-stacks map.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// One FNV-1a step of `hash` over `value`.
#[inline(always)]
pub fn mix(hash: u64, value: u64) -> u64 {
    (hash ^ value).wrapping_mul(FNV_PRIME)
}

/// Per-CPU scratch of one walk; its `stack` is what gets stored.
#[repr(C)]
pub struct Walk {
    pub stack: UnwoundStack,
    /// The frames past `MAX_STACK_DEPTH`, stored apart (see `UnwoundStack`).
    pub tail: UnwoundStack,
    /// Frames this walk may keep: `MAX_USER_DEPTH`, or `MAX_STACK_DEPTH`
    /// for stacks stored whole in one map value (the allocation probes').
    pub(crate) limit: u64,
    pub(crate) ip: u64,
    pub(crate) sp: u64,
    pub(crate) bp: u64,
    /// EXACT_IP, BP_UNKNOWN, and the Python walk's `PY_*` bits.
    pub flags: u64,
    /// Frames taken through a table row / a frame pointer, added to the
    /// counters once per walk rather than once per frame.
    pub(crate) table_frames: u64,
    pub(crate) pointer_frames: u64,
    /// Index of the mapping the previous frame was in.
    pub(crate) mapping_hint: u64,
    /// Where the row searches pass their probe indices through (see
    /// `unwind::rows`): in the walk's own scratch, which no program that
    /// can interrupt this one on the CPU uses.
    pub(crate) opaque: u64,
    /// The row `unwind::rows` found for the current frame.
    pub(crate) row: UnwindRow,
    /// The next Python frame to record (see `python`); 0: none.
    pub py_frame: u64,
    /// Python frames recorded, and how the Python part ended.
    pub py_frames: u64,
    pub py_end: u64,
}

impl Walk {
    /// Adds a frame (or end reason) to the stack's hash.
    #[inline(always)]
    pub fn mix(&mut self, value: u64) {
        self.stack.hash = mix(self.stack.hash, value);
    }

    /// True when the walk has kept all the frames it may.
    #[inline(always)]
    pub fn full(&self) -> bool {
        u64::from(self.stack.len) >= self.limit
    }

    /// Records `frame` as the stack's next (callers check [`Walk::full`]
    /// first; a frame past both arrays is dropped).
    #[inline(always)]
    pub fn push(&mut self, frame: u64) {
        let len = self.stack.len as usize;
        if len < MAX_STACK_DEPTH {
            self.stack.frames[len] = frame;
        } else if len - MAX_STACK_DEPTH < MAX_STACK_DEPTH {
            self.tail.frames[len - MAX_STACK_DEPTH] = frame;
        } else {
            return;
        }
        self.stack.len = len as u32 + 1;
        self.mix(frame);
    }
}
