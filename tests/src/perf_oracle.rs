//! The oracle of the unwinding tests: `perf record --call-graph dwarf` on
//! the same processes, at the same time as the daemon. perf copies 32 KB of
//! user stack with each sample and unwinds it afterwards from .eh_frame
//! (libdw): an independent unwinder on the same workload. Its stacks come
//! back as [`Stacks`], measured by the same code as the daemon's.

use std::{
    collections::HashMap,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::stacks::{Stack, Stacks};

/// Bytes of user stack perf copies per sample: deeper than any workload here.
const STACK_COPY: u32 = 32768;

/// A running `perf record -p PIDS -- sleep SECONDS`.
pub struct PerfRecord {
    child: Option<Child>,
    data: PathBuf,
    seconds: u64,
    started: Instant,
}

impl PerfRecord {
    /// Starts recording `pids` at `frequency` Hz for `seconds`; the processes
    /// must already run (perf attaches to them).
    pub fn start(pids: &[u32], frequency: u32, seconds: u64) -> Self {
        let data = std::env::temp_dir().join(format!(
            "profilerd-test-perf-{}-{}.data",
            std::process::id(),
            pids.first().copied().unwrap_or_default()
        ));
        let list: Vec<String> = pids.iter().map(u32::to_string).collect();
        let child = Command::new("perf")
            .args(["record", "--quiet"])
            .arg(format!("--call-graph=dwarf,{STACK_COPY}"))
            .args(["-F", &frequency.to_string(), "-p", &list.join(",")])
            .arg("-o")
            .arg(&data)
            .args(["--", "sleep", &seconds.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running perf (Debian: apt-get install linux-perf)");
        Self {
            child: Some(child),
            data,
            seconds,
            started: Instant::now(),
        }
    }

    /// Waits for the recording to end (its `sleep`).
    pub fn finish_recording(mut self) -> Recorded {
        let mut child = self.child.take().expect("perf record runs until finished");
        // perf stops on its own after `seconds`; a minute more is a hang.
        let deadline = self.started + Duration::from_secs(self.seconds + 60);
        let status = loop {
            if let Some(status) = child.try_wait().expect("waiting for perf record") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("perf record did not end within a minute of its window");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        }
        assert!(
            status.success(),
            "perf record failed ({status}); it needs root or kernel.perf_event_paranoid <= 1:\n{stderr}"
        );
        Recorded {
            data: std::mem::take(&mut self.data),
        }
    }
}

impl Drop for PerfRecord {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if !self.data.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.data);
        }
    }
}

/// A finished recording, deleted when dropped.
pub struct Recorded {
    data: PathBuf,
}

impl Recorded {
    /// Reads the recording with `perf script` (where perf unwinds).
    pub fn script(self) -> PerfProfile {
        let started = Instant::now();
        let output = Command::new("perf")
            .args(["script", "--no-inline", "-F", "comm,pid,tid,ip,sym,dso", "-i"])
            .arg(&self.data)
            .stderr(Stdio::null())
            .output()
            .expect("running perf script");
        assert!(output.status.success(), "perf script failed: {}", output.status);
        PerfProfile {
            by_pid: parse_script(&String::from_utf8_lossy(&output.stdout)),
            script_seconds: started.elapsed().as_secs_f64(),
        }
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.data);
    }
}

/// What perf saw.
pub struct PerfProfile {
    by_pid: HashMap<u32, Stacks>,
    /// Wall time of `perf script` (its unwinding happens there).
    pub script_seconds: f64,
}

impl PerfProfile {
    /// The user stacks of process `pid` (empty if perf saw none).
    pub fn of(&self, pid: u32) -> Stacks {
        self.by_pid.get(&pid).cloned().unwrap_or_default()
    }
}

/// `perf script -F comm,pid,tid,ip,sym,dso`: per sample a header line
/// `COMM PID/TID`, then one line per frame, leaf first, `ADDR SYM (DSO)`,
/// and a blank line. Kernel frames are left out (the kernel stack is not
/// what is compared). Returns each process's stacks, merged.
pub fn parse_script(text: &str) -> HashMap<u32, Stacks> {
    let mut by_pid: HashMap<u32, Stacks> = HashMap::new();
    for block in text.split("\n\n") {
        let mut lines = block.lines().filter(|line| !line.trim().is_empty());
        let Some(header) = lines.next() else { continue };
        let Some(pid) = header
            .split_whitespace()
            .last()
            .and_then(|ids| ids.split('/').next())
            .and_then(|pid| pid.parse().ok())
        else {
            continue;
        };
        let mut frames: Vec<String> = lines
            .filter_map(|line| {
                let (_address, rest) = line.trim().split_once(' ')?;
                let (symbol, dso) = rest.rsplit_once(" (")?;
                (dso != "[kernel.kallsyms])").then(|| symbol.trim().to_owned())
            })
            .collect();
        frames.reverse();
        by_pid.entry(pid).or_default().0.push(Stack { frames, count: 1 });
    }
    by_pid
        .into_iter()
        .map(|(pid, stacks)| (pid, stacks.merged()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_perf_script() {
        let text = "cxx_sort 25583/25583 \n\t            171f level_three (/tmp/cxx_sort)\n\t            1748 level_two (/tmp/cxx_sort)\n\t            10c0 main (/tmp/cxx_sort)\n\ncxx_sort 25583/25584 \n\tffffffff81000e06 asm_sysvec_apic_timer_interrupt ([kernel.kallsyms])\n\t            14e7 std::__introsort_loop<long, level_three::{lambda(unsigned int, unsigned int)#1}> (/tmp/cxx_sort)\n\t            10c0 main (/tmp/cxx_sort)\n\nWeb Content 7/7 \n\t 0 [unknown] ([unknown])\n";
        let by_pid = parse_script(text);
        let mut stacks = by_pid[&25583].0.clone();
        stacks.sort_by_key(|stack| stack.frames.len());
        assert_eq!(
            stacks[0].frames,
            [
                "main",
                "std::__introsort_loop<long, level_three::{lambda(unsigned int, unsigned int)#1}>"
            ]
        );
        assert_eq!(stacks[1].frames, ["main", "level_two", "level_three"]);
        assert_eq!(by_pid[&7].0[0].frames, ["[unknown]"]);
    }
}
