//! CPython frames, walked where the native walk meets the eval loop.
//!
//! A native frame inside `_PyEval_EvalFrameDefault` stands for the Python
//! frames that call of the eval loop runs: the walk records those instead
//! (leaf first, from the thread's current frame along `previous`), then
//! goes on with the native caller of the eval loop. The frames one eval
//! call runs end at its entry frame: every frame on 3.8–3.10 (one eval
//! call per frame), the frame marked `is_entry` on 3.11, the shim frame
//! owned by the C stack on 3.12+. So a stack reads native root, Python
//! frames, the C frames of a call they made, Python frames it called back...
//!
//! The thread's state is found by its TLS base (`fsbase`, which is what
//! `PyThreadState.thread_id` holds), not by tid: that works for threads
//! without the GIL and for processes in another PID namespace. Every read
//! is checked; a forged chain ends at the stack's depth limit.

use aya_ebpf::{
    Global,
    bindings::BPF_F_NO_PREALLOC,
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_probe_read_kernel, bpf_probe_read_user},
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use profiler_common::{
    Counter,
    maps::DEFAULT_UNWIND_PROCESSES_ENTRIES,
    python::{
        FRAME_OWNED_BY_CSTACK, MAX_THREAD_SCAN, NO_INSTRUCTION, PythonCodeSeen, PythonProcess, SEEN_CODES,
        code_key, encode_frame, frame_model, instruction_model,
    },
};

use crate::{add, bump, walk::Walk};

/// tgid -> where its interpreter is; written by the daemon before the
/// process's unwind entry, removed at exec and exit.
#[map]
pub static PYTHON_PROCESSES: HashMap<u32, PythonProcess> =
    HashMap::with_max_entries(DEFAULT_UNWIND_PROCESSES_ENTRIES, BPF_F_NO_PREALLOC);
/// tid -> its PyThreadState, as last found (checked again at every use).
#[map]
static PYTHON_THREADS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(16384, 0);

/// Code objects to read while their process lives (see [`announce_code`]).
#[map]
static PYTHON_CODES: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);
/// Per CPU: the (process, code object) pairs announced lately, direct-mapped.
#[map]
static PYTHON_SEEN: PerCpuArray<[u64; SEEN_CODES]> = PerCpuArray::with_max_entries(1, 0);

#[unsafe(no_mangle)]
static TASK_FSBASE_OFFSET: Global<u64> = Global::new(0);

/// The walk met the eval loop and recorded Python frames (its end is counted).
pub const PY_ENTERED: u64 = 1 << 8;
/// Recording the Python frames of one eval call.
pub const PY_BATCH: u64 = 1 << 9;
/// The current native frame (an eval call) was replaced by Python frames:
/// unwind it without recording it.
pub const PY_SKIP_PUSH: u64 = 1 << 10;
/// No more Python frames for this walk (chain ended, or a read failed):
/// further eval frames are recorded as native ones.
pub const PY_DONE: u64 = 1 << 11;
/// The batch recorded a frame (else its eval call is recorded as native).
const PY_EMITTED: u64 = 1 << 12;
/// The batch ended without recording a frame: the eval call it stood for is
/// recorded as a native frame, not entered again (a forged chain of shim
/// frames would otherwise keep the walk at one frame until its steps ran out).
const PY_AS_NATIVE: u64 = 1 << 13;

/// The frame fields are read in one window of this many bytes.
const WINDOW_WORDS: usize = 16;

const END_COMPLETE: u64 = 0;
const END_READ_FAULT: u64 = 1;
const END_INVALID: u64 = 2;
const END_NO_THREAD_STATE: u64 = 3;
const END_DEPTH_LIMIT: u64 = 4;

/// The process's entry, if it runs CPython; null otherwise.
#[inline(always)]
pub fn process(tgid: u32) -> *const PythonProcess {
    // SAFETY: the value is only read, and stays valid for this run (RCU).
    unsafe { PYTHON_PROCESSES.get(&tgid) }.map_or(core::ptr::null(), |p| p as *const _)
}

/// Called for each native frame at `ip` before it is recorded: true when it
/// is an eval-loop call whose Python frames are recorded instead (the walk
/// is then in a batch, see [`frame_step`]). Only compares: the native step
/// runs twice per loop iteration and must stay small for the verifier.
#[inline(always)]
pub fn enters(walk: &mut Walk, python: &PythonProcess, ip: u64) -> bool {
    if ip < python.eval_start || ip >= python.eval_end || walk.flags & PY_DONE != 0 {
        return false;
    }
    if walk.flags & PY_AS_NATIVE != 0 {
        walk.flags &= !PY_AS_NATIVE;
        return false;
    }
    walk.flags = (walk.flags & !PY_EMITTED) | PY_BATCH | PY_SKIP_PUSH;
    true
}

/// One step of a batch: records the current Python frame and moves to its
/// caller, or ends the batch at the eval call's entry frame.
#[inline(always)]
pub fn frame_step(walk: &mut Walk, python: &PythonProcess) {
    if walk.flags & PY_ENTERED == 0 {
        walk.flags |= PY_ENTERED;
        if walk.py_end != END_COMPLETE {
            // The thread's state could not be found (see [`start`]).
            return fail(walk, walk.py_end);
        }
    }
    let frame = walk.py_frame;
    if frame == 0 {
        // The chain ended: no Python frame is left for this or later eval calls.
        walk.flags = (walk.flags & !PY_BATCH) | PY_DONE;
        if walk.flags & PY_EMITTED == 0 {
            walk.flags &= !PY_SKIP_PUSH;
        }
        return;
    }
    if walk.full() {
        walk.py_end = END_DEPTH_LIMIT;
        walk.flags = (walk.flags & !PY_BATCH) | PY_DONE;
        return;
    }
    let mut window = [0u64; WINDOW_WORDS];
    // SAFETY: probe_read checks the address; a fault is an error.
    if unsafe { bpf_probe_read_user(frame as *const [u64; WINDOW_WORDS]) }
        .map(|read| window = read)
        .is_err()
    {
        return fail(walk, END_READ_FAULT);
    }
    let model = python.frame_model;
    let previous = field(&window, python.frame_previous, 8);
    if model == frame_model::C_STACK_OWNER
        && field(&window, python.frame_entry, 1) == u64::from(FRAME_OWNED_BY_CSTACK)
    {
        // The shim the eval call pushed: the batch ends below it.
        walk.py_frame = previous;
        walk.flags &= !PY_BATCH;
        if walk.flags & PY_EMITTED == 0 {
            walk.flags = (walk.flags & !PY_SKIP_PUSH) | PY_AS_NATIVE;
        }
        return;
    }
    let code = field(&window, python.frame_code, 8) & !u64::from(python.frame_code_tag);
    if code == 0 || code & 15 != 0 || code >= 1 << 47 || previous == frame {
        return fail(walk, END_INVALID);
    }
    // SAFETY: probe_read checks the address; a fault is an error.
    let Ok(first_line) =
        (unsafe { bpf_probe_read_user((code + u64::from(python.code_first_line)) as *const u32) })
    else {
        return fail(walk, END_READ_FAULT);
    };
    let instruction = instruction(&window, python, code);
    let slot = encode_frame(code, instruction, code_key(first_line));
    announce_code(code);
    walk.push(slot);
    walk.py_frames += 1;
    walk.py_frame = previous;
    walk.flags |= PY_EMITTED;
    let batch_ends = match model {
        frame_model::FRAME_OBJECTS => true,
        frame_model::ENTRY_FLAG => field(&window, python.frame_entry, 1) != 0,
        _ => false,
    };
    if batch_ends {
        walk.flags &= !PY_BATCH;
    }
}

/// Tells the daemon of a code object this CPU has not told it of lately, so
/// that it is read while its process lives. Woken up: a process living a
/// few hundred milliseconds is gone by the next drain.
#[inline(always)]
fn announce_code(code: u64) {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // Code addresses are below 2^47: the tgid in the bits above makes the pair.
    let pair = code ^ (u64::from(tgid) << 47);
    let Some(seen) = PYTHON_SEEN.get_ptr_mut(0) else {
        return;
    };
    let slot = (pair >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 54;
    // SAFETY: this CPU's entry; programs do not nest on one CPU.
    let seen = unsafe { &mut (*seen)[slot as usize & (SEEN_CODES - 1)] };
    if *seen == pair {
        return;
    }
    match PYTHON_CODES.reserve::<PythonCodeSeen>(0) {
        Some(mut entry) => {
            entry.write(PythonCodeSeen {
                tgid,
                // SAFETY: the value is only read.
                instance: unsafe { crate::process::PROCESSES.get(&tgid) }
                    .copied()
                    .unwrap_or(0),
                code,
            });
            entry.submit(0);
            *seen = pair;
        }
        None => {
            bump(Counter::PythonCodesLost);
        }
    }
}

/// Ends the Python walk at a bad frame: the eval call it stood for is
/// recorded as the native frame it is.
#[inline(always)]
fn fail(walk: &mut Walk, end: u64) {
    walk.py_end = end;
    walk.flags = (walk.flags & !(PY_BATCH | PY_SKIP_PUSH)) | PY_DONE;
}

/// The frame's instruction, in code units from the start of its bytecode.
#[inline(always)]
fn instruction(window: &[u64; WINDOW_WORDS], python: &PythonProcess, code: u64) -> u64 {
    let raw = field(window, python.frame_instruction, 8);
    match python.instruction_model {
        instruction_model::LASTI_BYTES | instruction_model::LASTI_UNITS => {
            let lasti = raw as u32 as i32;
            if lasti < 0 {
                NO_INSTRUCTION
            } else if python.instruction_model == instruction_model::LASTI_BYTES {
                lasti as u64 / 2
            } else {
                lasti as u64
            }
        }
        _ => {
            let start = code + u64::from(python.code_instructions);
            if raw < start {
                NO_INSTRUCTION
            } else {
                (raw - start) / 2
            }
        }
    }
}

/// The `size`-byte field at byte `offset` of the window (fields never
/// straddle an 8-byte word: they are naturally aligned).
#[inline(always)]
fn field(window: &[u64; WINDOW_WORDS], offset: u16, size: u32) -> u64 {
    let word = window[usize::from(offset >> 3) & (WINDOW_WORDS - 1)] >> ((u32::from(offset) & 7) * 8);
    match size {
        1 => word & 0xff,
        4 => word & 0xffff_ffff,
        _ => word,
    }
}

/// Before the walk of a CPython process's thread: finds the thread's
/// newest Python frame (outside the walk's loop, whose step the verifier
/// checks over and over), or why it is not known; the walk counts it only
/// if it meets the eval loop.
#[inline(always)]
pub fn start(walk: &mut Walk, python: &PythonProcess) {
    match current_frame(python) {
        Ok(frame) => {
            walk.py_frame = frame;
            walk.py_end = END_COMPLETE;
        }
        Err(end) => {
            walk.py_frame = 0;
            walk.py_end = end;
        }
    }
}

/// The current thread's newest Python frame (0: none), or why not known.
#[inline(always)]
fn current_frame(python: &PythonProcess) -> Result<u64, u64> {
    let thread = thread_state(python)?;
    let frame = read(thread + u64::from(python.thread_frame)).map_err(|()| END_READ_FAULT)?;
    if python.cframe_current_frame == u16::MAX || frame == 0 {
        return Ok(frame);
    }
    read(frame + u64::from(python.cframe_current_frame)).map_err(|()| END_READ_FAULT)
}

/// The current thread's PyThreadState: the one whose `thread_id` is the
/// thread's TLS base, remembered per tid and checked at every use.
#[inline(always)]
fn thread_state(python: &PythonProcess) -> Result<u64, u64> {
    let offset = TASK_FSBASE_OFFSET.load();
    if offset == 0 {
        return Err(END_NO_THREAD_STATE);
    }
    // SAFETY: the task pointer is only used as an address for probe_read.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    // SAFETY: probe_read checks the address; the offset comes from BTF.
    let fsbase = unsafe { bpf_probe_read_kernel(task.wrapping_add(offset as usize) as *const u64) }
        .map_err(|_| END_READ_FAULT)?;
    let tid = bpf_get_current_pid_tgid() as u32;
    let id_offset = u64::from(python.thread_id);
    // SAFETY: the value is only read.
    if let Some(&known) = unsafe { PYTHON_THREADS.get(&tid) }
        && read(known + id_offset) == Ok(fsbase)
    {
        return Ok(known);
    }
    let interpreter =
        read(python.runtime + u64::from(python.runtime_interpreters_head)).map_err(|()| END_READ_FAULT)?;
    if interpreter == 0 {
        return Err(END_NO_THREAD_STATE);
    }
    let mut thread =
        read(interpreter + u64::from(python.interpreter_threads_head)).map_err(|()| END_READ_FAULT)?;
    for _ in 0..MAX_THREAD_SCAN {
        if thread == 0 {
            break;
        }
        if read(thread + id_offset) == Ok(fsbase) {
            let _ = PYTHON_THREADS.insert(&tid, &thread, 0);
            return Ok(thread);
        }
        thread = read(thread + u64::from(python.thread_next)).map_err(|()| END_READ_FAULT)?;
    }
    Err(END_NO_THREAD_STATE)
}

#[inline(always)]
fn read(address: u64) -> Result<u64, ()> {
    // SAFETY: probe_read checks the address; a fault is an error, not a crash.
    unsafe { bpf_probe_read_user(address as *const u64) }.map_err(|_| ())
}

/// Counts how the walk's Python part ended (once per walk that met the
/// eval loop) and its frames.
#[inline(always)]
pub fn count_end(walk: &Walk, stack_full: bool) {
    if walk.flags & PY_ENTERED == 0 {
        return;
    }
    let end = if stack_full && walk.py_end == END_COMPLETE && walk.py_frame != 0 {
        END_DEPTH_LIMIT
    } else {
        walk.py_end
    };
    bump(match end {
        END_COMPLETE => Counter::PythonComplete,
        END_READ_FAULT => Counter::PythonReadFault,
        END_INVALID => Counter::PythonInvalid,
        END_NO_THREAD_STATE => Counter::PythonNoThreadState,
        _ => Counter::PythonDepthLimit,
    });
    add(Counter::PythonFrames, walk.py_frames);
}

/// A process's entry goes with its image (exec) or its end (exit).
#[inline(always)]
pub fn forget(tgid: u32) {
    let _ = PYTHON_PROCESSES.remove(&tgid);
}
