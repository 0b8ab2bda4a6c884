//! A CPython process's entry for the sampler's Python walk, written with
//! its unwind entry (before it: the walk looks the Python one up only when
//! the unwind entry says so).

use std::sync::atomic::Ordering;

use profiler_common::maps;

use super::{FileId, TableCompiler, TableManager, process_entry::load_bias};
use crate::{
    collect::SnapshotMapping,
    error::Chain,
    python::{
        detect::{self, Detected},
        memory::Memory as _,
        reader::Reader,
    },
};

/// A process's interpreter as written for the sampler.
#[derive(Clone, Copy, Debug)]
pub struct Found {
    pub written: bool,
}

impl<C: TableCompiler> TableManager<C> {
    /// Writes the process's entry if one of its files is a CPython
    /// interpreter (once per process instance); true when the sampler has it.
    pub(super) fn python_entry(&mut self, pid: u32, instance: u32, mappings: &[SnapshotMapping]) -> bool {
        let Some(python_map) = self.maps.python.as_mut() else {
            return false;
        };
        let Some(process) = self.processes.get_mut(&pid) else {
            return false;
        };
        if let Some(found) = process.python {
            return found.written;
        }
        // The interpreter's file, and the bias of its code's mapping.
        let found = mappings.iter().find_map(|mapping| {
            let file = mapping.file.as_ref()?;
            let table = self.files.get(&FileId {
                key: file.key,
                version: file.version,
            })?;
            let symbols = table.python?;
            let bias = load_bias(mapping.start, mapping.offset, &table.segments)?;
            let eval = symbols.eval_start.checked_add(bias)?;
            (mapping.start <= eval && eval < mapping.end).then_some((symbols, bias))
        });
        let Some((symbols, bias)) = found else {
            return false;
        };
        // Through the daemon's reader: the process's owner chooses what backs
        // its `_PyRuntime` (a FUSE page that never comes would hang this
        // thread, and every process's tables with it).
        let memory = Reader::daemon().open(pid);
        let written = match detect::entry(&symbols, bias, |address, bytes| {
            memory.read(address, bytes).map_err(std::io::Error::other)
        }) {
            Ok((entry, layout)) => match python_map.insert(&pid, &entry, 0) {
                Ok(()) => {
                    self.python_stats.count(Some(layout.version), "walked");
                    if let Some(tell) = self.on_python.as_mut() {
                        tell(Detected {
                            pid,
                            instance,
                            layout,
                        });
                    }
                    true
                }
                Err(err) => {
                    self.stats.map_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(pid, "writing {}: {}", maps::PYTHON_PROCESSES, Chain(&err));
                    false
                }
            },
            Err(err) => {
                self.python_stats.count(symbols.version(), err.outcome());
                tracing::debug!(pid, "CPython frames not walked: {err}");
                false
            }
        };
        if let Some(process) = self.processes.get_mut(&pid) {
            process.python = Some(Found { written });
        }
        written
    }
}
