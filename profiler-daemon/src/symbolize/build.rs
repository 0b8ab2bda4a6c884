//! Building a stack from its addresses, and taking it whole from the
//! previous batch when nothing in it could name differently now.
//!
//! A thread blocked for a minute is credited its wait at every drain, with
//! the same stack (collect/off_cpu.rs keeps it); a hot loop brings the same
//! addresses at every drain. Building a stack looks every frame up in the
//! caches (its mapping, its lines), once per sample to want it and once to
//! build it; reusing it is one lookup by content.

use std::{collections::HashMap, sync::Arc};

use profiler_common::{SampleKey, python::is_python_frame};

use crate::collect::{RawBatch, UNSAMPLED_CPU_STACK_ID};

use super::{
    Location, Mapping, PythonFrames, SymbolizedStack,
    perf_maps::PerfMaps,
    processes::{self, ProcessEntry},
    resolver::Resolver,
    stack::{FrameKind, Line},
};

/// Executable memory no file describes: a JIT's code. Anonymous, or (.NET
/// 7+, which maps its code twice to keep it never writable and executable
/// at once) its double-mapped memfd.
pub(super) fn is_jit_code(mapping: &processes::UserMapping) -> bool {
    let path = &*mapping.mapping.path;
    path.is_empty() || path.starts_with("/memfd:doublemapper")
}

/// Non-leaf frames hold return addresses, which may already belong to the
/// next function; the call instruction is at address - 1.
pub(super) fn return_adjusted(ip: u64, is_return_address: bool) -> u64 {
    if is_return_address {
        ip.saturating_sub(1)
    } else {
        ip
    }
}

/// Where a stack's frames get their names (besides Python's).
pub(super) struct Namers<'a> {
    pub resolver: &'a Resolver,
    pub perf_maps: &'a PerfMaps,
    pub kernel_mapping: &'a Arc<Mapping>,
}

/// A stack built, and whether it holds frames of code that moves: JIT code
/// or a Python frame, whose addresses name other code once theirs is freed.
pub(super) struct Built {
    pub stack: SymbolizedStack,
    pub moving_code: bool,
}

pub(super) fn build_stack(
    Namers {
        resolver,
        perf_maps,
        kernel_mapping,
    }: Namers<'_>,
    python: &mut PythonFrames,
    (pid, instance): (u32, u32),
    process: Option<&ProcessEntry>,
    kernel: Option<&[u64]>,
    user: Option<&[u64]>,
) -> Built {
    let mut locations = Vec::with_capacity(kernel.map_or(0, <[u64]>::len) + user.map_or(0, <[u64]>::len));
    let mut moving_code = false;
    for (index, &ip) in kernel.unwrap_or_default().iter().enumerate() {
        let lines = resolver.kernel(return_adjusted(ip, index > 0));
        locations.push(location(
            FrameKind::Kernel,
            ip,
            Some(kernel_mapping.clone()),
            lines,
            || format!("[unknown] [kernel.kallsyms]+{ip:#x}"),
        ));
    }
    let after_kernel = kernel.is_some();
    for (index, &ip) in user.unwrap_or_default().iter().enumerate() {
        if is_python_frame(ip) {
            moving_code = true;
            locations.push(python.location(pid, instance, ip));
            continue;
        }
        let address = return_adjusted(ip, index > 0 || after_kernel);
        let mapping = process.and_then(|process| process.mapping_of(address));
        let lines = mapping.and_then(|mapping| match &mapping.file {
            _ if is_jit_code(mapping) => {
                moving_code = true;
                perf_maps.lines(pid, instance, address)
            }
            Some(file) => resolver.user(file, address - mapping.start + mapping.offset),
            None => None,
        });
        locations.push(location(
            FrameKind::User,
            ip,
            mapping.map(|mapping| mapping.mapping.clone()),
            lines,
            || match mapping {
                // Anonymous executable memory: a JIT's code, not named by a
                // perf map (the runtime writes none, or not this yet).
                Some(mapping) if is_jit_code(mapping) => "[jit]".to_owned(),
                Some(mapping) => {
                    let module = mapping.mapping.path.rsplit('/').next().unwrap_or_default();
                    format!(
                        "[unknown] {module}+{:#x}",
                        address - mapping.start + mapping.offset
                    )
                }
                None => format!("[unknown] {ip:#x}"),
            },
        ));
    }
    Built {
        stack: SymbolizedStack {
            locations: locations.into(),
        },
        moving_code,
    }
}

fn location(
    kind: FrameKind,
    address: u64,
    mapping: Option<Arc<Mapping>>,
    lines: Option<Arc<[Line]>>,
    placeholder: impl FnOnce() -> String,
) -> Location {
    let resolved = lines.is_some();
    let lines = lines.unwrap_or_else(|| Line::named(placeholder().into()));
    Location {
        kind,
        address,
        mapping,
        lines,
        resolved,
    }
}

/// What a stack is built from: its process (an exec is another instance),
/// its addresses, and whether it is a wait's (its switch frames trimmed).
/// Equal by content: the drained stacks of two batches are other Arcs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct StackSource {
    pub pid: u32,
    pub instance: u32,
    pub ends_in_switch: bool,
    pub kernel: Option<Arc<[u64]>>,
    pub user: Option<Arc<[u64]>>,
}

fn shared_stack_of(stacks: &HashMap<u32, Arc<[u64]>>, id: i32) -> Option<Arc<[u64]>> {
    u32::try_from(id).ok().and_then(|id| stacks.get(&id)).cloned()
}

/// What `key`'s stack is built from in `batch`.
pub(super) fn stack_source(key: SampleKey, ends_in_switch: bool, batch: &RawBatch) -> StackSource {
    StackSource {
        pid: key.tgid,
        instance: key.instance,
        ends_in_switch,
        kernel: shared_stack_of(&batch.kernel_stacks, key.kernel_stack_id),
        user: shared_stack_of(&batch.user_stacks, key.user_stack_id),
    }
}

/// A stack within one batch: (pid, instance, user stack id, kernel stack
/// id, whether it is a wait's).
pub(super) type StackIds = (u32, u32, i32, i32, bool);

/// The ids of `key`'s stack, for a sample of a kind this daemon knows with
/// a stack to build (pass 1 meets the others too; pass 2 drops them).
pub(super) fn stack_ids(key: SampleKey) -> Option<StackIds> {
    let kind = crate::kind::SampleKind::from_bpf(key.kind)?;
    (key.user_stack_id != UNSAMPLED_CPU_STACK_ID).then_some((
        key.tgid,
        key.instance,
        key.user_stack_id,
        key.kernel_stack_id,
        kind.describe().ends_in_switch,
    ))
}

/// Stacks held at most in a batch: a batch's distinct stacks are bounded
/// by the stack maps (16k user, 16k unwound, 8k kernel by default); this
/// bounds what a storm of new stacks pins beside the store.
const MAX_HELD: usize = 32 * 1024;

/// The reusable stacks built or reused in this batch and the previous one;
/// one not used in a batch is dropped at its end, so they hold at most two
/// batches' distinct stacks, [`MAX_HELD`] each.
#[derive(Default)]
pub(super) struct BuiltStacks {
    previous: HashMap<StackSource, Arc<SymbolizedStack>>,
    current: HashMap<StackSource, Arc<SymbolizedStack>>,
    /// Stacks taken from the previous batch, not built again.
    pub reused: u64,
}

impl BuiltStacks {
    /// Whether `source`'s stack is held.
    #[cfg(test)]
    pub fn holds(&self, source: &StackSource) -> bool {
        self.current.contains_key(source) || self.previous.contains_key(source)
    }

    /// The stack built from `source` in this batch or the previous one.
    pub fn get(&mut self, source: &StackSource) -> Option<Arc<SymbolizedStack>> {
        if let Some(stack) = self.current.get(source) {
            return Some(stack.clone());
        }
        let (source, stack) = self.previous.remove_entry(source)?;
        self.reused += 1;
        self.current.insert(source, stack.clone());
        Some(stack)
    }

    /// Holds `stack`, built from `source`, for the next batch if a later
    /// batch may take it as it is: every frame it shows named from a file or
    /// the kernel (a placeholder may be named once its file or mapping is
    /// read) and no `moving_code`.
    pub fn keep(&mut self, source: StackSource, stack: &Arc<SymbolizedStack>, moving_code: bool) {
        if !moving_code
            && self.current.len() < MAX_HELD
            && stack.locations.iter().all(|location| location.resolved)
        {
            self.current.insert(source, stack.clone());
        }
    }

    /// Drops the stacks held for a process instance whose mappings were read
    /// again (or that exited): the same addresses may now be in other files.
    pub fn forget(&mut self, pid: u32, instance: u32) {
        let other = |source: &StackSource, _: &mut Arc<SymbolizedStack>| {
            (source.pid, source.instance) != (pid, instance)
        };
        self.previous.retain(other);
        self.current.retain(other);
    }

    /// Ends a batch: what it did not use is dropped.
    pub fn end_batch(&mut self) {
        self.previous = std::mem::take(&mut self.current);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(pid: u32, user: &[u64]) -> StackSource {
        StackSource {
            pid,
            instance: 1,
            ends_in_switch: false,
            kernel: None,
            user: Some(user.into()),
        }
    }

    /// A stack of one frame, named or a placeholder.
    fn stack(name: &str, resolved: bool) -> Arc<SymbolizedStack> {
        let mut stack = SymbolizedStack::placeholder(name);
        stack.locations[0].resolved = resolved;
        Arc::new(stack)
    }

    #[test]
    fn a_stack_is_reused_by_content_in_the_next_batch_and_dropped_after_one_without_it() {
        let mut built = BuiltStacks::default();
        let first = stack("first", true);
        built.keep(source(7, &[1, 2, 3]), &first, false);
        built.end_batch();

        // Another Arc of the same addresses: the same stack.
        assert!(built.holds(&source(7, &[1, 2, 3])));
        let again = built
            .get(&source(7, &[1, 2, 3]))
            .expect("held from the previous batch");
        assert!(Arc::ptr_eq(&again, &first));
        assert_eq!(built.reused, 1);
        assert!(built.get(&source(8, &[1, 2, 3])).is_none(), "another process's");
        assert!(built.get(&source(7, &[1, 2])).is_none(), "other addresses'");
        built.end_batch();
        assert!(built.holds(&source(7, &[1, 2, 3])), "used in the batch before");

        built.end_batch();
        assert!(
            !built.holds(&source(7, &[1, 2, 3])),
            "a batch without it drops it"
        );
        assert_eq!(built.reused, 1);
    }

    #[test]
    fn a_stack_that_may_name_differently_later_is_not_kept() {
        let mut built = BuiltStacks::default();
        built.keep(source(7, &[1]), &stack("[unknown] a.out+0x1", false), false);
        built.keep(source(7, &[2]), &stack("[jit] named now", true), true);
        built.keep(source(7, &[3]), &stack("main", true), false);
        built.end_batch();
        assert!(!built.holds(&source(7, &[1])), "a placeholder");
        assert!(!built.holds(&source(7, &[2])), "JIT or Python code");
        assert!(built.holds(&source(7, &[3])));
    }

    #[test]
    fn a_process_whose_mappings_were_read_again_has_its_stacks_built_afresh() {
        let mut built = BuiltStacks::default();
        built.keep(source(7, &[1]), &stack("old_library_function", true), false);
        built.keep(source(8, &[1]), &stack("main", true), false);
        built.end_batch();
        built.forget(7, 1);
        assert!(!built.holds(&source(7, &[1])));
        assert!(built.holds(&source(8, &[1])), "another process keeps its own");
    }

    #[test]
    fn a_wait_and_a_cpu_sample_of_the_same_addresses_are_apart() {
        let mut built = BuiltStacks::default();
        built.keep(source(7, &[1]), &stack("cpu", true), false);
        built.end_batch();
        let wait = StackSource {
            ends_in_switch: true,
            ..source(7, &[1])
        };
        assert!(
            built.get(&wait).is_none(),
            "trimmed of its switch frames: another stack"
        );
    }
}
