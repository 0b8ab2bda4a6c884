//! What the Python tests share: the CPython interpreters of this machine
//! (Debian's /usr/bin/python3.11, required, and pyenv's 3.8 to 3.13 where
//! present), the workloads in tests/workloads/python, and the Python view
//! of a decoded profile's samples.
//!
//! The daemon's contract (issue 24): a Python frame is a location under a
//! mapping whose file is `[python]`, one line per location, whose function
//! is the code object's qualified name (`co_qualname`, 3.11+; `co_name`
//! before, which has no qualified names), its file `co_filename` and its
//! line the one being run. Native frames stay as they are around them.

use std::path::{Path, PathBuf};

use crate::pprof::{Frame, Sample};

/// The mapping Python frames are under.
pub const PYTHON_MAPPING: &str = "[python]";

/// Debian's CPython: the interpreter a real user of this machine runs.
pub const DEBIAN_PYTHON: &str = "/usr/bin/python3.11";

/// The pyenv versions the tests run where present (3.8 to 3.14; machines
/// of this kind carry 3.6-3.13, and 3.14 where one was built).
const PYENV_MINORS: std::ops::RangeInclusive<u32> = 8..=14;

/// A workload under tests/workloads/python.
pub fn script(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("workloads/python")
        .join(name);
    assert!(path.exists(), "no workload {}", path.display());
    path.display().to_string()
}

/// One CPython on this machine.
#[derive(Clone, Debug)]
pub struct Interpreter {
    /// `debian-3.11.2`, `pyenv-3.8.18`: for messages.
    pub label: String,
    pub path: PathBuf,
    pub major: u32,
    pub minor: u32,
    /// Whether its interpreter loop's static functions have symbols
    /// (`list_sort_impl`, `builtin_sorted`): pyenv's builds keep them,
    /// Debian's stripped binary has its dynamic symbols only.
    pub has_symbols: bool,
}

impl Interpreter {
    pub fn path_str(&self) -> &str {
        self.path.to_str().expect("a UTF-8 interpreter path")
    }

    /// What the daemon names a code object whose qualified name is
    /// `qualname`: that, from 3.11 on; before, `co_name`, its last part.
    pub fn name(&self, qualname: &str) -> String {
        if (self.major, self.minor) >= (3, 11) {
            qualname.to_owned()
        } else {
            qualname.rsplit('.').next().unwrap_or(qualname).to_owned()
        }
    }
}

/// Debian's /usr/bin/python3.11 (package python3.11, which
/// scripts/setup-tests.sh installs).
pub fn debian() -> Interpreter {
    let path = PathBuf::from(DEBIAN_PYTHON);
    assert!(
        path.exists(),
        "{DEBIAN_PYTHON} is missing: scripts/setup-tests.sh installs it (package python3.11)"
    );
    let version = std::process::Command::new(&path)
        .args(["-c", "import platform; print(platform.python_version())"])
        .output()
        .unwrap_or_else(|err| panic!("running {DEBIAN_PYTHON}: {err}"));
    let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
    Interpreter {
        label: format!("debian-{version}"),
        path,
        major: 3,
        minor: 11,
        has_symbols: false,
    }
}

/// pyenv's CPython 3.8 to 3.14 under $PYENV_ROOT (or /root/.pyenv), the
/// newest patch release of each minor version present, oldest first.
pub fn pyenv() -> Vec<Interpreter> {
    let root = std::env::var_os("PYENV_ROOT").map_or_else(|| PathBuf::from("/root/.pyenv"), PathBuf::from);
    let Ok(entries) = std::fs::read_dir(root.join("versions")) else {
        return Vec::new();
    };
    let mut found: Vec<(u32, u32, u32, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let mut parts = name.split('.').map(str::parse::<u32>);
            let (major, minor, patch) = (parts.next()?.ok()?, parts.next()?.ok()?, parts.next()?.ok()?);
            let binary = entry.path().join(format!("bin/python{major}.{minor}"));
            (major == 3 && PYENV_MINORS.contains(&minor) && parts.next().is_none() && binary.exists())
                .then_some((major, minor, patch, binary))
        })
        .collect();
    found.sort();
    // The newest patch release of each minor version.
    found.reverse();
    found.dedup_by_key(|(major, minor, _, _)| (*major, *minor));
    found.reverse();
    found
        .into_iter()
        .map(|(major, minor, patch, path)| Interpreter {
            label: format!("pyenv-{major}.{minor}.{patch}"),
            path,
            major,
            minor,
            has_symbols: true,
        })
        .collect()
}

/// Debian's, then every pyenv one present.
pub fn all() -> Vec<Interpreter> {
    let mut all = vec![debian()];
    all.extend(pyenv());
    all
}

pub fn is_python(frame: &Frame) -> bool {
    frame.mapping == PYTHON_MAPPING
}

/// A sample's frames, root first.
pub fn root_first(sample: &Sample) -> Vec<&Frame> {
    sample.frames.iter().rev().collect()
}

/// A sample's Python frames' names, root first.
pub fn python_names(sample: &Sample) -> Vec<&str> {
    sample
        .frames
        .iter()
        .rev()
        .filter(|frame| is_python(frame))
        .map(|frame| frame.function.as_str())
        .collect()
}

/// Whether the sample holds a Python frame named `name`.
pub fn holds(sample: &Sample, name: &str) -> bool {
    sample
        .frames
        .iter()
        .any(|frame| is_python(frame) && frame.function == name)
}

/// Index (root first) of the innermost Python frame named `name`.
pub fn innermost(frames: &[&Frame], name: &str) -> Option<usize> {
    frames
        .iter()
        .rposition(|frame| is_python(frame) && frame.function == name)
}

/// A stack for a message, root first: native frames by name (the
/// kernel's suffixed `_[k]`, as folded output does), Python ones as
/// `py:NAME:LINE`; `(no stack)` for a sample without frames.
pub fn describe(sample: &Sample) -> String {
    let mut text = Vec::new();
    for frame in root_first(sample) {
        let shown = if is_python(frame) {
            format!("py:{}:{}", frame.function, frame.line)
        } else if frame.mapping == "[kernel.kallsyms]" {
            format!("{}_[k]", frame.function)
        } else if frame.function.is_empty() {
            format!(
                "[{}+{:#x}]",
                frame.mapping.rsplit('/').next().unwrap_or(""),
                frame.address
            )
        } else {
            frame.function.clone()
        };
        text.push(shown);
    }
    if text.is_empty() {
        return "(no stack)".to_owned();
    }
    text.join(";")
}

/// The `limit` heaviest samples among `samples` that fail `keep`, one per
/// line with its count, for a failure message.
pub fn offending<'a>(
    samples: impl IntoIterator<Item = &'a Sample>,
    keep: impl Fn(&Sample) -> bool,
    limit: usize,
) -> String {
    let mut counts: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    for sample in samples.into_iter().filter(|sample| !keep(sample)) {
        *counts.entry(describe(sample)).or_default() += sample.count();
    }
    let mut bad: Vec<(String, u64)> = counts.into_iter().collect();
    bad.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut text: String = bad
        .iter()
        .take(limit)
        .map(|(stack, count)| format!("  {stack} {count}\n"))
        .collect();
    if bad.len() > limit {
        text.push_str(&format!("  ... and {} more stacks\n", bad.len() - limit));
    }
    if text.is_empty() {
        text.push_str("  (none)\n");
    }
    text
}

/// Sum of the counts of `samples` that satisfy `keep`.
pub fn count<'a>(samples: impl IntoIterator<Item = &'a Sample>, keep: impl Fn(&Sample) -> bool) -> u64 {
    samples
        .into_iter()
        .filter(|sample| keep(sample))
        .map(Sample::count)
        .sum()
}

/// The lines `first..=last` a function spans in a source file: from its
/// `def` line to its last line indented deeper than the `def`.
pub fn function_lines(source: &str, function: &str) -> (i64, i64) {
    let lines: Vec<&str> = source.lines().collect();
    let def = format!("def {function}(");
    let start = lines
        .iter()
        .position(|line| line.trim_start().starts_with(&def))
        .unwrap_or_else(|| panic!("no `def {function}` in the source"));
    let indent = lines[start].len() - lines[start].trim_start().len();
    let mut end = start;
    for (at, line) in lines.iter().enumerate().skip(start + 1) {
        if line.trim().is_empty() {
            continue;
        }
        if line.len() - line.trim_start().len() <= indent {
            break;
        }
        end = at;
    }
    (start as i64 + 1, end as i64 + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_before_and_after_qualified_names() {
        let old = Interpreter {
            label: "x".into(),
            path: PathBuf::new(),
            major: 3,
            minor: 10,
            has_symbols: true,
        };
        let new = Interpreter {
            minor: 11,
            ..old.clone()
        };
        assert_eq!(old.name("Ledger.settle.<locals>.one_round"), "one_round");
        assert_eq!(
            new.name("Ledger.settle.<locals>.one_round"),
            "Ledger.settle.<locals>.one_round"
        );
        assert_eq!(old.name("<module>"), "<module>");
    }

    #[test]
    fn finds_a_function_s_lines() {
        let source = "import x\n\ndef f(a):\n    b = 1\n\n    return b\n\n\nclass C:\n    def g(self):\n        pass\n    def h(self):\n        pass\n";
        assert_eq!(function_lines(source, "f"), (3, 6));
        assert_eq!(function_lines(source, "g"), (10, 11));
    }
}
