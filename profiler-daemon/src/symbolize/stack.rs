//! The symbolize stage's output types, shaped like pprof's model: a stack is a
//! list of locations (leaf first), a location is an address in a mapping with
//! one line per function at that address (inlined ones innermost first).

use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FrameKind {
    User,
    Kernel,
}

/// A mapped object: an executable or library, or the kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mapping {
    pub start: u64,
    pub limit: u64,
    pub file_offset: u64,
    /// The path as the process saw it, or `[kernel.kallsyms]`.
    pub path: Arc<str>,
    /// GNU build id, lowercase hex.
    pub build_id: Option<Arc<str>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Function {
    /// Demangled name (Rust hashes removed), or `[unknown] module+0xoffset`.
    pub name: Arc<str>,
    /// The name as found in the symbol table (mangled).
    pub system_name: Arc<str>,
    pub filename: Option<Arc<str>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Line {
    pub function: Arc<Function>,
    /// 0 when unknown.
    pub line: u32,
}

impl Line {
    /// A frame of one function known by `name` only (no file, no line): a
    /// placeholder, or what a perf map says.
    pub fn named(name: Arc<str>) -> Arc<[Line]> {
        Arc::new([Line {
            function: Arc::new(Function {
                name: name.clone(),
                system_name: name,
                filename: None,
            }),
            line: 0,
        }])
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub kind: FrameKind,
    /// The address as sampled (a return address for non-leaf frames).
    pub address: u64,
    pub mapping: Option<Arc<Mapping>>,
    /// Innermost first; never empty (unresolved frames get a placeholder).
    pub lines: Arc<[Line]>,
    /// False when `lines` is a placeholder.
    pub resolved: bool,
}

/// Hashes what equal locations share and what tells most apart cheaply:
/// the kind, the sampled address and the line numbers, not the names
/// (equality still compares everything). The store interns every sampled
/// stack by content at every drain: hashing each frame's function, file and
/// mapping names was a fifth of the daemon's CPU with two busy CPUs. The
/// line numbers matter for Python frames, whose address is their code
/// object's whatever the line: without them, every stack of one function's
/// lines would share a hash. Two locations at the same address in different
/// files collide, and equality tells them apart.
impl std::hash::Hash for Location {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.kind.hash(state);
        self.address.hash(state);
        state.write_usize(self.lines.len());
        for line in self.lines.iter() {
            state.write_u32(line.line);
        }
    }
}

/// A symbolized call stack: kernel locations (if any) then user ones, leaf first.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SymbolizedStack {
    pub locations: Box<[Location]>,
}

impl SymbolizedStack {
    /// A stack of one frame that names what has no stack (e.g. CPU a thread
    /// used where no sample landed, before any of its samples).
    pub fn placeholder(name: &str) -> Self {
        Self {
            locations: Box::new([Location {
                kind: FrameKind::User,
                address: 0,
                mapping: None,
                lines: Line::named(name.into()),
                resolved: true,
            }]),
        }
    }

    /// A stack of one user frame, the function `name` (for tests of what
    /// reads stacks).
    #[cfg(test)]
    pub fn of_one_function(name: &str) -> std::sync::Arc<Self> {
        let mut stack = Self::placeholder(name);
        stack.locations[0].address = 0x1000;
        std::sync::Arc::new(stack)
    }

    /// Function names root first, inlined frames expanded, as
    /// (name, kind, inlined) triples: the order a flame graph reads.
    pub fn frames_root_first(&self) -> impl Iterator<Item = (&str, FrameKind, bool)> {
        self.locations.iter().rev().flat_map(|location| {
            let outermost = location.lines.len().saturating_sub(1);
            location
                .lines
                .iter()
                .enumerate()
                .rev()
                .map(move |(index, line)| (&*line.function.name, location.kind, index != outermost))
        })
    }

    /// Drops the leaf kernel frames an off-CPU stack gets from where it was
    /// taken (the switch program, the tracepoint, `__schedule`), so it
    /// starts where the thread gave up the CPU (`schedule`,
    /// `__cond_resched`...). Their number varies (the tracepoint's
    /// trampoline is not always a frame), so they are matched by name.
    pub fn trim_switch_frames(&mut self) {
        let taken_by_the_switch = |location: &Location| {
            location.kind == FrameKind::Kernel
                && location.lines.last().is_some_and(|line| {
                    let name = &*line.function.name;
                    name.starts_with("bpf_prog_")
                        || name.starts_with("bpf_trace_run")
                        || name.starts_with("__traceiter_sched_switch")
                        || name == "__schedule"
                })
        };
        let keep = self
            .locations
            .iter()
            .position(|location| !taken_by_the_switch(location))
            .unwrap_or(self.locations.len());
        if keep > 0 {
            self.locations = self.locations[keep..].into();
        }
    }

    /// Approximate heap bytes held by this stack (for the store's bound).
    pub fn approx_bytes(&self) -> usize {
        size_of::<Self>() + self.locations.len() * (size_of::<Location>() + 48)
    }
}

/// One symbolized entry of a drain: `count` samples (or waits) of one kind,
/// of one thread with one stack.
#[derive(Clone, Debug)]
pub struct SymbolizedSample {
    pub kind: crate::kind::SampleKind,
    pub pid: u32,
    pub tid: u32,
    /// Process name.
    pub comm: Arc<str>,
    /// Who may read the process, as read with its mappings; privileged
    /// when they could not be read (only root and the access group see those).
    pub readable_by: crate::collect::ReadableBy,
    pub thread_name: Arc<str>,
    pub stack: Arc<SymbolizedStack>,
    /// Samples (CPU) or waits (off-CPU), weighted by the sampling rate.
    pub count: u64,
    /// Nanoseconds of the kind: CPU time the thread consumed, attributed to
    /// these samples (each carries the thread's CPU time since its previous
    /// sample); or time spent waiting off-CPU.
    pub amount: u64,
    /// The thread's cgroup, when it could be named.
    pub cgroup: Option<Arc<crate::cgroup::Cgroup>>,
    /// The process's pid in its own pid namespace, when that is another.
    pub ns_pid: Option<u32>,
}

/// For tests: a stack of user functions, leaf first, one line each.
#[cfg(test)]
pub fn user_stack(names: &[&str]) -> Arc<SymbolizedStack> {
    Arc::new(SymbolizedStack {
        locations: names
            .iter()
            .map(|name| Location {
                kind: FrameKind::User,
                address: 0x1000,
                mapping: None,
                lines: Arc::new([Line {
                    function: Arc::new(Function {
                        name: (*name).into(),
                        system_name: (*name).into(),
                        filename: None,
                    }),
                    line: 0,
                }]),
                resolved: true,
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(name: &str) -> Line {
        Line {
            function: Arc::new(Function {
                name: name.into(),
                system_name: name.into(),
                filename: None,
            }),
            line: 0,
        }
    }

    fn location(kind: FrameKind, names: &[&str]) -> Location {
        Location {
            kind,
            address: 0,
            mapping: None,
            lines: names.iter().map(|name| line(name)).collect(),
            resolved: true,
        }
    }

    #[test]
    fn switch_frames_are_trimmed_from_the_leaf_only() {
        let mut stack = SymbolizedStack {
            locations: vec![
                location(FrameKind::Kernel, &["bpf_prog_0123456789abcdef_on_switch"]),
                location(FrameKind::Kernel, &["bpf_trace_run4"]),
                location(FrameKind::Kernel, &["__traceiter_sched_switch"]),
                location(FrameKind::Kernel, &["__schedule"]),
                location(FrameKind::Kernel, &["schedule"]),
                location(FrameKind::Kernel, &["__schedule"]),
                location(FrameKind::User, &["main"]),
            ]
            .into(),
        };
        stack.trim_switch_frames();
        let names: Vec<_> = stack.frames_root_first().map(|(name, _, _)| name).collect();
        assert_eq!(names, vec!["main", "__schedule", "schedule"]);
        let mut already = stack.clone();
        already.trim_switch_frames();
        assert_eq!(already, stack, "a stack that starts at schedule stays as it is");
    }

    #[test]
    fn root_first_expands_inlined_outermost_first() {
        // Leaf location: kernel; then a user location where `inner` is inlined into `outer`.
        let stack = SymbolizedStack {
            locations: vec![
                location(FrameKind::Kernel, &["do_sys_read"]),
                location(FrameKind::User, &["inner", "outer"]),
                location(FrameKind::User, &["main"]),
            ]
            .into(),
        };
        let frames: Vec<_> = stack.frames_root_first().collect();
        assert_eq!(
            frames,
            vec![
                ("main", FrameKind::User, false),
                ("outer", FrameKind::User, false),
                ("inner", FrameKind::User, true),
                ("do_sys_read", FrameKind::Kernel, false),
            ]
        );
    }
}
