//! Python frames of a stack (slots the sampler marked, see
//! `profiler_common::python`): named from the code objects in the
//! process's memory, with the layout the table manager found for it.
//! They sit under a mapping of their own, `[python]`, so pprof tools tell
//! them from native frames; their function is the code object's qualified
//! name (its name before 3.11), their file `co_filename`, their line the
//! line being run.

use std::{collections::HashMap, sync::Arc};

use super::stack::{FrameKind, Function, Line, Location, Mapping};
use crate::python::{
    layout::Layout,
    names::{Limits, PythonNameStats, PythonNames},
    prefetch::PythonNews,
    reader::{Reader, ReaderMemory},
};

/// Layouts kept per pid (instances found of it, newest last).
const MAX_INSTANCES_PER_PID: usize = 4;

pub struct PythonFrames {
    /// (pid, instance) -> its interpreter's layout.
    /// pid -> (instance, layout) as found, newest last (a few kept).
    layouts: HashMap<u32, Vec<(u32, Layout)>>,
    /// Reads through `reader`: a process whose pages never come in costs
    /// the symbolizer one deadline, not the rest of its life.
    names: PythonNames<ReaderMemory>,
    /// Processes that exited, forgotten after the next batch (its samples
    /// may still hold their frames), and those forgotten at the end of this one.
    exited: Vec<(u32, u32)>,
    retiring: Vec<(u32, u32)>,
    reader: Reader,
    mapping: Arc<Mapping>,
}

impl Default for PythonFrames {
    fn default() -> Self {
        let reader = Reader::daemon();
        let open = {
            let reader = reader.clone();
            move |pid| reader.open(pid)
        };
        Self {
            layouts: HashMap::new(),
            names: PythonNames::with_memory(open, Limits::default()),
            exited: Vec::new(),
            retiring: Vec::new(),
            reader,
            mapping: Arc::new(Mapping {
                start: 0,
                limit: u64::MAX,
                file_offset: 0,
                path: "[python]".into(),
                build_id: None,
            }),
        }
    }
}

impl PythonFrames {
    pub fn news(&mut self, news: PythonNews) {
        match news {
            PythonNews::Found(detected) => {
                let found = self.layouts.entry(detected.pid).or_default();
                found.retain(|(instance, _)| *instance != detected.instance);
                if found.len() == MAX_INSTANCES_PER_PID {
                    found.remove(0);
                }
                found.push((detected.instance, detected.layout));
            }
            PythonNews::Code {
                pid,
                instance,
                address,
                code,
            } => self.names.read_ahead(pid, instance, address, *code),
        }
    }

    /// The process exited: its names go after the batch that follows,
    /// which may hold its last samples.
    pub fn exited(&mut self, pid: u32, instance: u32) {
        self.exited.push((pid, instance));
    }

    /// At the end of a batch: forgets the processes that exited before it.
    pub fn end_batch(&mut self) {
        let exited = std::mem::take(&mut self.exited);
        for (pid, instance) in std::mem::replace(&mut self.retiring, exited) {
            if let Some(found) = self.layouts.get_mut(&pid) {
                found.retain(|(known, _)| *known != instance);
                if found.is_empty() {
                    self.layouts.remove(&pid);
                }
            }
            self.names.exited(pid, instance);
        }
    }

    pub fn stats(&self) -> PythonNameStats {
        PythonNameStats {
            reader: self.reader.stats(),
            ..self.names.stats()
        }
    }

    /// The location of the Python frame in `slot`.
    pub fn location(&mut self, pid: u32, instance: u32, slot: u64) -> Location {
        let (code, _, _) = profiler_common::python::decode_frame(slot);
        let frame = match layout_of(&self.layouts, pid, instance) {
            Some(layout) => Some(self.names.resolve(pid, instance, layout, slot)),
            None => None,
        };
        let (name, filename, line, resolved): (Arc<str>, _, _, _) = match frame {
            Some(frame) => (frame.function, frame.filename, frame.line, frame.resolved),
            // The process exited before its layout arrived (or never had one).
            None => (format!("[unknown python code {code:#x}]").into(), None, 0, false),
        };
        Location {
            kind: FrameKind::User,
            address: code,
            mapping: Some(self.mapping.clone()),
            lines: Arc::new([Line {
                function: Arc::new(Function {
                    name: name.clone(),
                    system_name: name,
                    filename,
                }),
                line,
            }]),
            resolved,
        }
    }
}

/// The layout of `pid`'s interpreter: the one found for this instance,
/// else the newest found for the pid. The table manager labels what it
/// finds with the instance of the snapshot that made it look, which may
/// be one of the pid's before an exec (a snapshot read late, during
/// symbolization); what it found is the process's image now, so the
/// newest is the best guess, and a wrong one only costs names (the code
/// objects' keys are checked).
fn layout_of(layouts: &HashMap<u32, Vec<(u32, Layout)>>, pid: u32, instance: u32) -> Option<&Layout> {
    let found = layouts.get(&pid)?;
    found
        .iter()
        .find(|(known, _)| *known == instance)
        .or(found.last())
        .map(|(_, layout)| layout)
}
