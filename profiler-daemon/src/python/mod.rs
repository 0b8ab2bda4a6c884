//! CPython: which processes run it, where their interpreter keeps its
//! state (the sampler walks their frames, see profiler-ebpf's `python`),
//! and the names of the code objects their stacks hold.
//!
//! - [`layout`]: the offsets of each version, from a table (3.8–3.12) or
//!   from the process's own `_Py_DebugOffsets` (3.13+).
//! - [`detect`]: from what the worker found in a mapped file (`_PyRuntime`,
//!   the eval loop, the version) to the sampler's [`PythonProcess`] entry.
//! - [`memory`], [`code`], [`lines`]: reading a code object out of the
//!   target process (hostile input: its owner controls every byte), and
//!   its line table.
//! - [`reader`]: reads of a process's memory that never hold the caller
//!   past a deadline (a page-in may block forever).
//! - [`names`]: the cache of code objects read, per process instance.
//! - [`metrics`]: what the above count, for /metrics.
//!
//! [`PythonProcess`]: profiler_common::python::PythonProcess

pub mod code;
pub mod detect;
pub mod layout;
pub mod lines;
pub mod memory;
pub mod metrics;
pub mod names;
pub mod prefetch;
pub mod reader;
