//! The installed Chromium as a large real workload: headless, rendering a
//! generated page, bounded in time, every process it starts known by pid.

use std::{
    collections::{BTreeSet, HashMap},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// The browser binary itself (not the /usr/bin wrapper script).
pub const BINARY: &str = "/usr/lib/chromium/chromium";

/// A table of `rows` styled rows: parsing, style and layout in Blink's C++
/// code, seconds of CPU on one CPU, little JavaScript (a JIT has no tables).
pub fn write_page(dir: &Path, rows: usize) -> PathBuf {
    let mut page = String::from("<html><body><table>");
    for i in 0..rows {
        page.push_str(&format!(
            "<tr><td style=\"padding:{}px\">cell {i}</td><td><b>{}</b> <i>x</i></td></tr>",
            i % 7,
            i * 7
        ));
    }
    page.push_str("</table></body></html>");
    let file = dir.join("page.html");
    std::fs::write(&file, page).expect("writing the page");
    file
}

/// A running headless Chromium, in a process group of its own: killed whole
/// when dropped, and its scratch directory (profile, page) removed.
pub struct Chromium {
    child: Child,
    scratch: PathBuf,
    /// Every process seen in its group, and the CPU each was last seen at.
    seen: HashMap<u32, Duration>,
}

impl Chromium {
    /// `chromium --dump-dom PAGE`: loads the page, prints it, exits. Its
    /// profile goes in `scratch`, which is removed when it is dropped.
    pub fn dump_dom(page: &Path, scratch: &Path) -> Self {
        let profile = scratch.join("chromium-profile");
        std::fs::create_dir_all(&profile).expect("a profile directory");
        let child = Command::new(BINARY)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("--dump-dom")
            .arg(format!("file://{}", page.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|err| panic!("starting {BINARY} (apt-get install chromium): {err}"));
        Self {
            child,
            scratch: scratch.to_owned(),
            seen: HashMap::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until it exits, up to `limit` (then kills it: the test goes on
    /// with what ran), calling `each` every 100 ms meanwhile. Returns whether
    /// it exited by itself.
    pub fn wait(&mut self, limit: Duration, mut each: impl FnMut()) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            self.look();
            if self.child.try_wait().ok().flatten().is_some() {
                return true;
            }
            if Instant::now() > deadline {
                self.kill();
                return false;
            }
            each();
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Its processes so far (the browser and every process of its group).
    pub fn pids(&self) -> BTreeSet<u32> {
        self.seen.keys().copied().collect()
    }

    /// CPU its processes ran, as last seen (a lower bound: what a process
    /// ran after the last look before it exited is not in it).
    pub fn cpu_seen(&self) -> Duration {
        self.seen.values().sum()
    }

    fn look(&mut self) {
        let group = self.child.id();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        for entry in entries.filter_map(Result::ok) {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|name| name.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // Field 5 (pgrp) after the parenthesised comm, which may hold anything.
            let pgrp = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(2))
                .and_then(|pgrp| pgrp.parse::<u32>().ok());
            if pgrp == Some(group) {
                let cpu = cpu_if_alive(pid);
                let known = self.seen.entry(pid).or_default();
                *known = (*known).max(cpu);
            }
        }
    }

    fn kill(&mut self) {
        // SAFETY: kill(2) takes no pointers; the group is the one this child
        // leads (process_group(0)), not reaped yet, so the id is still ours.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// CPU time of `pid` (its live threads' schedstat), zero if it is gone: a
/// process of the browser may exit at any moment.
fn cpu_if_alive(pid: u32) -> Duration {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Duration::ZERO;
    };
    let ns: u64 = tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(ns)
}

/// Function names at the root of a whole stack: the entry of the program
/// (or of the dynamic loader, while it loads libraries) and of a thread.
/// Compared without leading underscores and glibc's internal `GI_` prefix.
const ROOTS: &[&str] = &[
    "start",
    "libc_start_main",
    "libc_start_call_main",
    "dl_start",
    "dl_start_user",
    "start_thread",
    "clone3",
    "clone",
];

/// Whether a stack (root first) starts at a program's or a thread's entry.
pub fn starts_at_an_entry(frames: &[String]) -> bool {
    frames.first().is_some_and(|root| {
        let name = root.trim_start_matches('_');
        let name = name.strip_prefix("GI_").unwrap_or(name).trim_start_matches('_');
        let name = name.split('@').next().unwrap_or(name);
        ROOTS.contains(&name)
    })
}

/// The number of FDEs (functions with unwind information) of an ELF file,
/// from its `.eh_frame_hdr` search table; None without one.
pub fn fde_count(binary: &str) -> Option<u64> {
    let image = std::fs::read(binary).ok()?;
    let sections = crate::elf::sections(&image);
    let header = sections.iter().find(|section| section.name == ".eh_frame_hdr")?;
    let bytes = image.get(header.offset..header.offset + 12)?;
    // version 1, eh_frame_ptr encoding (4 bytes: udata4 or sdata4, maybe
    // pc-relative), fde_count encoding (udata4), table encoding, then
    // eh_frame_ptr and the count.
    let four_bytes = |encoding: u8| matches!(encoding & 0x0f, 0x03 | 0x0b);
    if bytes[0] != 1 || !four_bytes(bytes[1]) || bytes[2] != 0x03 {
        return None;
    }
    Some(u64::from(u32::from_le_bytes([
        bytes[8], bytes[9], bytes[10], bytes[11],
    ])))
}
