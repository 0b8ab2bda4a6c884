//! Folded stacks, as stackcollapse-perf writes them: `comm;root;...;leaf VALUE`,
//! kernel frames suffixed `_[k]`, inlined ones `_[i]`; one line per distinct
//! stack, sorted, so the output is stable and diffable. VALUE is
//! [`Profile::value`]: samples for CPU profiles, nanoseconds for off-CPU and
//! wall ones.

use std::{collections::BTreeMap, io};

use super::Profile;
use crate::symbolize::{FrameKind, SymbolizedSample};

/// The folded line (without count) for one sample.
pub fn folded_stack(sample: &SymbolizedSample) -> String {
    let mut line = sanitize(&sample.comm);
    for (name, kind, inlined) in sample.stack.frames_root_first() {
        line.push(';');
        line.push_str(&sanitize(name));
        match (kind, inlined) {
            (FrameKind::Kernel, _) => line.push_str("_[k]"),
            (FrameKind::User, true) => line.push_str("_[i]"),
            (FrameKind::User, false) => {}
        }
    }
    line
}

/// Folded lines with their values, merged and sorted.
pub fn folded_lines(profile: &Profile) -> BTreeMap<String, u64> {
    let mut lines = BTreeMap::new();
    for sample in &profile.samples {
        *lines.entry(folded_stack(sample)).or_default() += profile.value(sample);
    }
    lines
}

pub fn write(profile: &Profile, out: &mut impl io::Write) -> io::Result<()> {
    for (stack, count) in folded_lines(profile) {
        writeln!(out, "{stack} {count}")?;
    }
    Ok(())
}

/// `;` separates frames and a newline ends the record: neither may appear in a name.
fn sanitize(name: &str) -> String {
    name.replace([';', '\n'], ":")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        kind::{ProfileType, SampleKind},
        profile::Window,
        symbolize::{Function, Line, Location, SymbolizedStack},
    };

    fn location(kind: FrameKind, names: &[&str]) -> Location {
        Location {
            kind,
            address: 0,
            mapping: None,
            lines: names
                .iter()
                .map(|name| Line {
                    function: Arc::new(Function {
                        name: (*name).into(),
                        system_name: (*name).into(),
                        filename: None,
                    }),
                    line: 0,
                })
                .collect(),
            resolved: true,
        }
    }

    #[test]
    fn writes_comm_first_root_to_leaf_with_suffixes_and_merges() {
        let stack = Arc::new(SymbolizedStack {
            locations: vec![
                location(FrameKind::Kernel, &["read_zero"]),
                location(FrameKind::User, &["inlined;helper", "read_loop"]),
                location(FrameKind::User, &["main"]),
            ]
            .into(),
        });
        let sample = |tid, count| SymbolizedSample {
            kind: SampleKind::Cpu,
            pid: 7,
            tid,
            comm: "zero reader".into(),
            readable_by: crate::collect::ReadableBy::Privileged,
            thread_name: "t".into(),
            stack: stack.clone(),
            count,
            amount: count * 1_000,
            cgroup: None,
            ns_pid: None,
        };
        let mut profile = Profile {
            window: Window::ALL,
            frequency: 99,
            alloc_interval: 0,
            profile_type: ProfileType::Cpu,
            samples: vec![sample(7, 3), sample(8, 4)],
        };
        let folded = |profile: &Profile| {
            let mut out = Vec::new();
            write(profile, &mut out).expect("writing to a Vec");
            String::from_utf8(out).expect("utf-8")
        };
        assert_eq!(
            folded(&profile),
            "zero reader;main;read_loop;inlined:helper_[i];read_zero_[k] 7\n"
        );
        profile.profile_type = ProfileType::OffCpu;
        assert_eq!(
            folded(&profile),
            "zero reader;main;read_loop;inlined:helper_[i];read_zero_[k] 7000\n",
            "off-CPU lines count nanoseconds"
        );
    }
}
