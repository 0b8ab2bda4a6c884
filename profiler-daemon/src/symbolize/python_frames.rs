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
    detect::Detected,
    layout::Layout,
    names::{Limits, PythonNameStats, PythonNames},
    reader::{Reader, ReaderMemory},
};

pub struct PythonFrames {
    /// (pid, instance) -> its interpreter's layout.
    layouts: HashMap<(u32, u32), Layout>,
    /// Reads through `reader`: a process whose pages never come in costs
    /// the symbolizer one deadline, not the rest of its life.
    names: PythonNames<ReaderMemory>,
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
    pub fn found(&mut self, detected: Detected) {
        self.layouts
            .insert((detected.pid, detected.instance), detected.layout);
    }

    pub fn exited(&mut self, pid: u32, instance: u32) {
        self.layouts.remove(&(pid, instance));
        self.names.exited(pid, instance);
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
        let frame = match self.layouts.get(&(pid, instance)) {
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
