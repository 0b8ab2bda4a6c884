//! Whether uprobes are attached: the daemon's perf links and the
//! breakpoints in the traced process's own code.

use std::{
    collections::HashSet,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use crate::elf;

/// The allocator functions the daemon probes, by their exported names.
pub const ALLOCATOR_FUNCTIONS: [&str; 7] = [
    "malloc",
    "calloc",
    "realloc",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "free",
];

/// Allocator entry points of `pid`'s libc that hold a breakpoint now: the
/// int3 (0xcc) the kernel writes over the first instruction byte of a
/// probed function in each process it traces (a uretprobe too: it enters
/// by the same breakpoint), and puts back when the last probe goes. Read
/// from the process's memory against the library file: what the process
/// runs, whoever holds the probe, and after whatever death of the tracer.
pub fn breakpoints(pid: u32) -> Vec<String> {
    let code = code_mappings(pid);
    let libc = code
        .iter()
        .find(|mapping| is_libc(&mapping.path))
        .unwrap_or_else(|| {
            panic!(
                "{pid} maps no libc: {:?}",
                code.iter().map(|m| &m.path).collect::<Vec<_>>()
            )
        })
        .path
        .clone();
    let image = std::fs::read(&libc).unwrap_or_else(|err| panic!("reading {libc}: {err}"));
    let memory = std::fs::File::open(format!("/proc/{pid}/mem"))
        .unwrap_or_else(|err| panic!("opening the memory of {pid}: {err}"));
    let mut probed = Vec::new();
    for function in ALLOCATOR_FUNCTIONS {
        let Some(offset) = elf::dynamic_function_file_offset(&image, function) else {
            continue;
        };
        let mapping = code
            .iter()
            .find(|m| m.path == libc && (m.offset..m.offset + (m.end - m.start)).contains(&offset))
            .unwrap_or_else(|| {
                panic!("{function} of {libc} at file offset {offset:#x} is in no code mapping of {pid}")
            });
        let address = mapping.start + (offset - mapping.offset);
        let mut byte = [0u8];
        memory
            .read_exact_at(&mut byte, address)
            .unwrap_or_else(|err| panic!("reading {function} at {address:#x} in {pid}: {err}"));
        let original = image[usize::try_from(offset).expect("an offset within the file")];
        if byte[0] == 0xcc && original != 0xcc {
            probed.push(format!("{function} ({libc}+{offset:#x})"));
        }
    }
    probed
}

/// The libc a process maps, as it names it and as the host reaches it.
#[derive(Clone, Debug)]
pub struct MappedLibc {
    /// The path in the process's /proc/PID/maps (in its own mount namespace).
    pub path: String,
    /// /proc/PID/map_files/START-END of its first mapping: the very file
    /// the process maps, whatever the namespace.
    pub map_files: PathBuf,
}

/// The libc `pid` maps (libc.so.* or libc-*), from its first mapping of it.
pub fn mapped_libc(pid: u32) -> MappedLibc {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_else(|err| panic!("reading the mappings of {pid}: {err}"));
    let libc = maps
        .lines()
        .filter_map(Mapping::parse)
        .find(|mapping| is_libc(&mapping.path))
        .unwrap_or_else(|| panic!("{pid} maps no libc:\n{maps}"));
    MappedLibc {
        map_files: PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", libc.start, libc.end)),
        path: libc.path,
    }
}

/// Whether a mapped file is libc (libc.so.* or libc-*).
fn is_libc(path: &str) -> bool {
    Path::new(path)
        .file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.starts_with("libc.so") || name.starts_with("libc-"))
}

/// The executable mappings of a process.
fn code_mappings(pid: u32) -> Vec<Mapping> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_else(|err| panic!("reading the mappings of {pid}: {err}"));
    maps.lines()
        .filter_map(Mapping::parse)
        .filter(|m| m.executable)
        .collect()
}

struct Mapping {
    start: u64,
    end: u64,
    offset: u64,
    executable: bool,
    path: String,
}

impl Mapping {
    /// `start-end perms offset dev inode path`.
    fn parse(line: &str) -> Option<Self> {
        let mut fields = line.split_whitespace();
        let (start, end) = fields.next()?.split_once('-')?;
        let perms = fields.next()?;
        let offset = fields.next()?;
        let path = fields.nth(2)?;
        Some(Self {
            start: u64::from_str_radix(start, 16).ok()?,
            end: u64::from_str_radix(end, 16).ok()?,
            offset: u64::from_str_radix(offset, 16).ok()?,
            executable: perms.contains('x'),
            path: path.to_owned(),
        })
    }
}

/// One uprobe a process holds attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Uprobe {
    /// "uprobe" or "uretprobe".
    pub kind: String,
    /// The probed file and offset, as the kernel says.
    pub file: String,
    pub offset: String,
    /// The BPF link's id, for a probe attached through a link (aya's way
    /// on kernels that have perf links).
    pub link_id: Option<u64>,
}

/// The uprobes `pid` holds attached: its uprobe_multi links (one entry per
/// offset), the perf links among its file descriptors whose fdinfo says
/// `event_type: uprobe` or `uretprobe`, and
/// the perf events `bpftool perf list` shows it holding (probes attached
/// without a link; bpftool lists no link-held perf event).
pub fn uprobes_of(pid: u32) -> Vec<Uprobe> {
    let mut probes = Vec::new();
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return probes;
    };
    for entry in entries.filter_map(Result::ok) {
        let Ok(info) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let field = |key: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
                .map(|value| value.trim().to_owned())
        };
        if field("link_type").as_deref() == Some("uprobe_multi") {
            // One link, many offsets: a line `COOKIE OFFSET REF_CTR_OFFSET`
            // each, after the header `cookie offset ref_ctr_offset`.
            let offsets = info
                .lines()
                .skip_while(|line| !line.starts_with("cookie"))
                .skip(1)
                .filter_map(|line| line.split_whitespace().nth(1).map(str::to_owned));
            for offset in offsets {
                probes.push(Uprobe {
                    kind: "uprobe_multi".into(),
                    file: field("path").unwrap_or_default(),
                    offset,
                    link_id: field("link_id").and_then(|id| id.parse().ok()),
                });
            }
            continue;
        }
        if field("link_type").as_deref() != Some("perf") {
            continue;
        }
        let Some(kind) = field("event_type").filter(|kind| kind == "uprobe" || kind == "uretprobe") else {
            continue;
        };
        probes.push(Uprobe {
            kind,
            file: field("name").unwrap_or_default(),
            offset: field("offset").unwrap_or_default(),
            link_id: field("link_id").and_then(|id| id.parse().ok()),
        });
    }
    for entry in bpftool(&["perf", "list"]).as_array().into_iter().flatten() {
        let kind = entry["fd_type"].as_str().unwrap_or_default();
        if entry["pid"].as_u64() == Some(u64::from(pid)) && (kind == "uprobe" || kind == "uretprobe") {
            probes.push(Uprobe {
                kind: kind.to_owned(),
                file: entry["filename"].as_str().unwrap_or_default().to_owned(),
                offset: entry["offset"].to_string(),
                link_id: None,
            });
        }
    }
    probes
}

/// The ids of every BPF link the kernel holds now (`bpftool link show`).
pub fn link_ids() -> HashSet<u64> {
    bpftool(&["link", "show"])
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|link| link["id"].as_u64())
        .collect()
}

/// `bpftool -j ARGS`, parsed.
pub fn bpftool(args: &[&str]) -> serde_json::Value {
    let output = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .expect("running bpftool (scripts/setup-tests.sh installs it)");
    assert!(
        output.status.success(),
        "bpftool {args:?} failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|err| panic!("bpftool -j {args:?} printed no JSON: {err}"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::allocations::{AllocSites, MIB, Options};
    /// [`breakpoints`] sees an int3 over malloc's first byte: written by
    /// hand (as the kernel writes a uprobe's) into a stopped alloc_sites,
    /// which is killed before it could run into it.
    #[test]
    fn sees_a_breakpoint_at_malloc() {
        let mut workload = AllocSites::start(Options::all(60.0, MIB, MIB));
        workload.wait_until_run(Duration::from_millis(100));
        let pid = workload.pid();
        assert_eq!(breakpoints(pid), Vec::<String>::new());
        crate::cpu::pause(pid);
        let code = code_mappings(pid);
        let libc = code
            .iter()
            .find(|m| m.path.contains("/libc.so"))
            .expect("a libc mapping");
        let image = std::fs::read(&libc.path).expect("libc");
        let offset = elf::dynamic_function_file_offset(&image, "malloc").expect("malloc in libc");
        let mapping = code
            .iter()
            .find(|m| m.path == libc.path && (m.offset..m.offset + (m.end - m.start)).contains(&offset))
            .expect("malloc's mapping");
        let memory = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .expect("opening the workload's memory for writing");
        memory
            .write_all_at(&[0xcc], mapping.start + offset - mapping.offset)
            .expect("writing an int3");
        let probed = breakpoints(pid);
        assert_eq!(probed.len(), 1, "{probed:?}");
        assert!(probed[0].starts_with("malloc ("), "{probed:?}");
    }
}
