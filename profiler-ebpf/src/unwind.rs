//! The sampler's own user-stack walk: from the sampled registers, frame by
//! frame, with the CFI tables the daemon compiled from each file's
//! `.eh_frame` where it has one, and the frame pointer where it does not.
//!
//! One frame per `bpf_loop` iteration: the verifier checks the step once,
//! not once per frame, so depth costs no verification budget.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, pt_regs},
    helpers::{
        bpf_probe_read_user,
        generated::{bpf_get_current_task_btf, bpf_loop, bpf_task_pt_regs},
    },
    macros::map,
    maps::{HashMap, PerCpuArray},
    programs::PerfEventContext,
};
use profiler_common::{
    CfaRule, Counter, MAX_STACK_DEPTH, MAX_USER_DEPTH, RbpRule, UnwindEnd, UnwindProcess, maps::*,
    python::PythonProcess,
};

mod rows;

use rows::find_row;

use crate::{
    add, bump,
    python::{self, PY_BATCH, PY_SKIP_PUSH},
    walk::{self, FNV_OFFSET, Walk},
};

/// tgid -> its executable mappings; written by the daemon once the process's
/// tables are loaded, removed at exec (the image changes).
#[map]
pub static UNWIND_PROCESSES: HashMap<u32, UnwindProcess> =
    HashMap::with_max_entries(DEFAULT_UNWIND_PROCESSES_ENTRIES, BPF_F_NO_PREALLOC);
#[map]
static UNWIND_SCRATCH: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);

/// The next lookup uses `ip` itself, not `ip - 1`: `ip` is where the thread
/// was interrupted (the leaf, or the frame a signal interrupted), not a
/// return address just past a call.
const EXACT_IP: u64 = 1;
/// rbp was saved in a way the walk cannot follow: it is unknown from here on.
const BP_UNKNOWN: u64 = 2;
/// The walk only reads the row cache: an allocation probe's, which the
/// sampler (or, preempted, the off-CPU program) can interrupt on this CPU
/// mid-write of an entry they share.
const ROWS_READ_ONLY: u64 = 4;

/// Offsets in the kernel's signal frame at `__restore_rt`: rsp points at
/// the ucontext, whose mcontext (struct sigcontext) starts 40 bytes in.
const UC_RBP: u64 = 40 + 10 * 8;
const UC_RSP: u64 = 40 + 15 * 8;
const UC_RIP: u64 = 40 + 16 * 8;

/// What a `bpf_loop` step needs; lives on the sampler's stack.
#[repr(C)]
struct StepContext {
    walk: *mut Walk,
    /// Null when the daemon has not loaded this process yet.
    process: *const UnwindProcess,
    /// Null unless the process runs CPython.
    python: *const PythonProcess,
}

/// Walks the current thread's user stack, from its user registers (see
/// [`sampled_user_registers`], [`saved_user_registers`]), into the per-CPU
/// scratch. None: the thread has no user stack (a kernel thread) or the
/// scratch is missing.
#[inline(always)]
pub fn walk_user_stack(registers: Option<(u64, u64, u64)>, tgid: u32) -> Option<*mut Walk> {
    walk_user_stack_in(UNWIND_SCRATCH.get_ptr_mut(0)?, registers, tgid, false)
}

/// [`walk_user_stack`] into another scratch. `from_probe`: for the
/// allocation probes, which have a scratch of their own as the sampler can
/// interrupt them: without CPython frames, no deeper than `MAX_STACK_DEPTH`
/// (they store a stack whole in one map value), reading the row cache only.
#[inline(always)]
pub fn walk_user_stack_in(
    walk: *mut Walk,
    registers: Option<(u64, u64, u64)>,
    tgid: u32,
    from_probe: bool,
) -> Option<*mut Walk> {
    let (ip, sp, bp) = registers?;
    if ip == 0 {
        return None;
    }
    // SAFETY: the value is only read, and stays valid for this run (RCU).
    let process: *const UnwindProcess =
        unsafe { UNWIND_PROCESSES.get(&tgid) }.map_or(core::ptr::null(), |p| p as *const _);
    // Only a process the daemon marked as CPython costs a second lookup.
    // SAFETY: a non-null `process` is a live map value (see above).
    let python = if !from_probe && !process.is_null() && unsafe { (*process).python } != 0 {
        python::process(tgid)
    } else {
        core::ptr::null()
    };
    // SAFETY: `walk` points at this CPU's scratch entry, which nothing else
    // touches while this program runs: the perf_event program does not nest
    // on a CPU, and the sched_switch one runs with interrupts off, so the
    // sampler cannot interrupt it; the allocation probes, which it can
    // interrupt, walk in a scratch of their own that they guard.
    unsafe {
        (*walk).ip = ip;
        (*walk).sp = sp;
        (*walk).bp = bp;
        (*walk).flags = if from_probe {
            EXACT_IP | ROWS_READ_ONLY
        } else {
            EXACT_IP
        };
        (*walk).table_frames = 0;
        (*walk).pointer_frames = 0;
        (*walk).mapping_hint = 0;
        (*walk).py_frame = 0;
        (*walk).py_frames = 0;
        (*walk).py_end = 0;
        (*walk).limit = if from_probe {
            MAX_STACK_DEPTH
        } else {
            MAX_USER_DEPTH
        } as u64;
        if !python.is_null() {
            python::start(&mut *walk, &*python);
        }
        (*walk).stack.len = 0;
        (*walk).stack.end = UnwindEnd::DepthLimit as u32;
        (*walk).stack.hash = FNV_OFFSET;
    }
    let mut step_context = StepContext {
        walk,
        process,
        python,
    };
    // SAFETY: `step` is a BPF subprogram with the callback signature; the
    // context is on this stack and outlives the call.
    unsafe {
        bpf_loop(
            // Two native frames a step, one Python frame; a Python batch
            // takes a step to end and the eval call under it one to be
            // skipped: on 3.8-3.10, where every Python call is a batch, a
            // frame can take two steps. The slots bound the walk, not this.
            2 * MAX_USER_DEPTH as u32 + 2,
            step as *mut c_void,
            (&mut step_context as *mut StepContext).cast(),
            0,
        );
    }
    // SAFETY: as above.
    let stack = unsafe { &mut (*walk).stack };
    let end = stack.end;
    bump(end_counter(end));
    // SAFETY: as above.
    python::count_end(unsafe { &*walk }, end == UnwindEnd::DepthLimit as u32);
    // SAFETY: as above.
    unsafe {
        add(Counter::UnwindTableFrames, (*walk).table_frames);
        add(Counter::UnwindFramePointerFrames, (*walk).pointer_frames);
    }
    stack.hash = walk::mix(stack.hash, u64::from(end));
    // A multiply carries differences only upwards: fold the high half in,
    // so the stack's id (the low bits) tells apart stacks that differ only
    // in high bits (a Python frame's instruction and key, see python.rs).
    stack.hash ^= stack.hash >> 32;
    Some(walk)
}

/// The user-mode registers: the sampled ones when the sample hit user mode,
/// else those saved at the kernel entry (the syscall or interrupt).
#[inline(always)]
pub fn sampled_user_registers(ctx: &PerfEventContext) -> Option<(u64, u64, u64)> {
    if in_user_mode(ctx) {
        // SAFETY: as in `in_user_mode`.
        let regs = unsafe { &(*ctx.ctx).regs };
        return Some((regs.rip, regs.rsp, regs.rbp));
    }
    saved_user_registers()
}

/// Whether the sample interrupted user mode (ring 3), where it has no
/// kernel stack: the kernel walks one only for registers not in user mode
/// (`cs & 3` zero), so this test, stricter than its `cs & 3 != 0`, never
/// skips a stack the kernel would have walked.
#[inline(always)]
pub fn in_user_mode(ctx: &PerfEventContext) -> bool {
    // SAFETY: the context of a perf_event program is its bpf_perf_event_data;
    // reading `regs` is a plain context access the verifier checks.
    unsafe { (*ctx.ctx).regs.cs & 3 == 3 }
}

/// The current thread's user registers as saved when it entered the kernel.
#[inline(always)]
pub fn saved_user_registers() -> Option<(u64, u64, u64)> {
    // SAFETY: a helper on the current task, which it always has.
    let user = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const pt_regs;
    if user.is_null() {
        return None;
    }
    // SAFETY: the helper returns a BTF pointer to the task's saved user
    // registers (task_pt_regs); the verifier checks each load against the
    // type and makes it fault-safe (PROBE_MEM), at the cost of a load where
    // probe_read was a helper call each (a fault reads 0: an ip of 0 ends
    // the walk as "no user stack"). Raw pointers, no references: the memory
    // is only known to be readable through the verifier's fault handling.
    // Volatile: in `sample` the loads stay this pointer's own, where the
    // compiler would share one instruction with the same field's load from
    // the perf context, which the verifier refuses ("same insn cannot be
    // used with different pointers").
    unsafe {
        Some((
            (&raw const (*user).rip).read_volatile(),
            (&raw const (*user).rsp).read_volatile(),
            (&raw const (*user).rbp).read_volatile(),
        ))
    }
}

#[inline(always)]
fn end_counter(end: u32) -> Counter {
    match end {
        0 => Counter::UnwindComplete,
        1 => Counter::UnwindNoMapping,
        2 => Counter::UnwindNoFramePointer,
        3 => Counter::UnwindUnsupportedRule,
        4 => Counter::UnwindReadFault,
        6 => Counter::UnwindTableNotLoaded,
        _ => Counter::UnwindDepthLimit,
    }
}

/// One `bpf_loop` iteration: record the current frame, find its caller.
/// Returns 1 to stop the loop.
extern "C" fn step(_index: u64, context: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes back the StepContext walk_user_stack gave it,
    // whose `walk` is a valid scratch entry for the whole walk.
    let (walk, process, python) = unsafe {
        let context = &*(context as *const StepContext);
        (&mut *context.walk, context.process, context.python)
    };
    if walk.flags & PY_BATCH != 0 && !python.is_null() {
        // One Python frame per iteration: the Python step is verified once.
        // SAFETY: a non-null `python` is a value of PYTHON_PROCESSES, valid
        // for the program's run (RCU).
        python::frame_step(walk, unsafe { &*python });
        return 0;
    }
    // Two frames per iteration: the loop's callback is an indirect call
    // (a retpoline on this kind of machine), worth amortizing.
    match step_frame(walk, process, python).and_then(|()| step_frame(walk, process, python)) {
        Ok(()) => 0,
        Err(end) => {
            walk.stack.end = end as u32;
            1
        }
    }
}

#[inline(always)]
fn step_frame(
    walk: &mut Walk,
    process: *const UnwindProcess,
    python: *const PythonProcess,
) -> Result<(), UnwindEnd> {
    if walk.flags & PY_BATCH != 0 {
        // The next iteration records the batch.
        return Ok(());
    }
    let ip = walk.ip;
    if ip == 0 {
        return Err(UnwindEnd::Complete);
    }
    if walk.full() {
        return Err(UnwindEnd::DepthLimit);
    }
    if walk.flags & PY_SKIP_PUSH == 0 {
        // SAFETY: as above.
        if !python.is_null() && python::enters(walk, unsafe { &*python }, ip) {
            return Ok(());
        }
        walk.push(ip);
    }
    walk.flags &= !PY_SKIP_PUSH;

    let lookup = if walk.flags & EXACT_IP != 0 { ip } else { ip - 1 };
    if process.is_null() {
        return frame_pointer_step(walk, UnwindEnd::TableNotLoaded);
    }
    // SAFETY: a non-null `process` is a value of UNWIND_PROCESSES, valid for
    // the program's run (RCU keeps a deleted element alive until it ends).
    let row = match find_row(unsafe { &*process }, lookup, walk) {
        Ok(row) => row,
        Err(missing) => return frame_pointer_step(walk, missing),
    };
    let off = u64::from(row.cfa_offset) * 8;
    let cfa = match row.cfa_rule() {
        r if r == CfaRule::Rsp as u8 => walk.sp + off,
        r if r == CfaRule::Rbp as u8 => {
            if walk.flags & BP_UNKNOWN != 0 {
                return Err(UnwindEnd::UnsupportedRule);
            }
            walk.bp + off
        }
        r if r == CfaRule::Plt as u8 => walk.sp + 8 + if ip & 15 >= 11 { 8 } else { 0 },
        r if r == CfaRule::DerefRsp as u8 => {
            let at = walk.sp + (off & 0x7f8);
            read_user(at)? + (u64::from(row.cfa_offset >> 8) * 8)
        }
        r if r == CfaRule::Signal as u8 => return signal_step(walk),
        r if r == CfaRule::End as u8 => return Err(UnwindEnd::Complete),
        r if r == CfaRule::NoInfo as u8 => return frame_pointer_step(walk, UnwindEnd::NoFramePointer),
        _ => return Err(UnwindEnd::UnsupportedRule),
    };
    // The caller's frame lies above this one; anything else is garbage
    // (and would loop until the depth limit).
    if cfa <= walk.sp {
        return Err(UnwindEnd::ReadFault);
    }
    let rbp_rule = row.rbp_rule();
    let return_address = if rbp_rule == RbpRule::Offset as u8 && (-8..=-2).contains(&row.rbp_offset) {
        // Callee-saved pushes sit right below the return address: one read
        // of the 64 bytes under the CFA gets both (a read costs the same for
        // 8 bytes or 64); two reads if the window crosses into nothing.
        let slot = (row.rbp_offset + 8) as usize;
        // SAFETY: probe_read checks the address; a fault is an error.
        match unsafe { bpf_probe_read_user((cfa - 64) as *const [u64; 8]) } {
            Ok(window) => {
                walk.bp = window[slot & 7];
                walk.flags &= !BP_UNKNOWN;
                window[7]
            }
            Err(_) => {
                walk.bp = read_user(cfa.wrapping_add((i64::from(row.rbp_offset) * 8) as u64))?;
                walk.flags &= !BP_UNKNOWN;
                read_user(cfa - 8)?
            }
        }
    } else {
        let return_address = read_user(cfa - 8)?;
        match rbp_rule {
            r if r == RbpRule::Unchanged as u8 => {}
            r if r == RbpRule::Offset as u8 => {
                walk.bp = read_user(cfa.wrapping_add((i64::from(row.rbp_offset) * 8) as u64))?;
                walk.flags &= !BP_UNKNOWN;
            }
            _ => walk.flags |= BP_UNKNOWN,
        }
        return_address
    };
    walk.sp = cfa;
    walk.ip = return_address;
    walk.flags &= !EXACT_IP;
    walk.table_frames += 1;
    Ok(())
}

/// `__restore_rt`: the interrupted frame's registers are in the ucontext.
#[inline(always)]
fn signal_step(walk: &mut Walk) -> Result<(), UnwindEnd> {
    let uc = walk.sp;
    walk.bp = read_user(uc + UC_RBP)?;
    walk.sp = read_user(uc + UC_RSP)?;
    walk.ip = read_user(uc + UC_RIP)?;
    walk.flags = (walk.flags & !(EXACT_IP | BP_UNKNOWN)) | EXACT_IP;
    walk.table_frames += 1;
    Ok(())
}

/// A frame without a table: follow rbp. `missing` says why there was no
/// table, and is the walk's end if the frame pointer leads nowhere.
#[inline(always)]
fn frame_pointer_step(walk: &mut Walk, missing: UnwindEnd) -> Result<(), UnwindEnd> {
    if walk.flags & BP_UNKNOWN != 0 {
        return Err(missing);
    }
    let bp = walk.bp;
    if bp == 0 {
        // The outermost frame of a frame-pointer chain (_start clears rbp).
        return Err(UnwindEnd::Complete);
    }
    if bp < walk.sp {
        return Err(missing);
    }
    // SAFETY: probe_read checks the addresses; a fault is an error.
    let (Ok(next_bp), Ok(return_address)) = (unsafe { bpf_probe_read_user(bp as *const u64) }, unsafe {
        bpf_probe_read_user((bp + 8) as *const u64)
    }) else {
        return Err(missing);
    };
    walk.bp = next_bp;
    walk.sp = bp + 16;
    walk.ip = return_address;
    walk.flags &= !EXACT_IP;
    walk.pointer_frames += 1;
    Ok(())
}

#[inline(always)]
fn read_user(address: u64) -> Result<u64, UnwindEnd> {
    // SAFETY: probe_read checks the address; a fault is an error, not a crash.
    unsafe { bpf_probe_read_user(address as *const u64) }.map_err(|_| UnwindEnd::ReadFault)
}
