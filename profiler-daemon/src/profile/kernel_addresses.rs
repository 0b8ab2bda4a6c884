//! Kernel frames without their addresses, for a reader the kernel would not
//! show them to: what /proc/kallsyms does for that reader (names kept,
//! addresses zero). A kernel text address tells the kernel's random offset
//! (KASLR) to whoever reads it.

use std::{collections::HashMap, sync::Arc};

use super::Profile;
use crate::symbolize::{FrameKind, Line, SymbolizedStack};

/// The name of a kernel frame that did not resolve, once its address is gone.
const UNKNOWN_KERNEL_FRAME: &str = "[unknown] [kernel.kallsyms]";

impl Profile {
    /// Sets every kernel frame's address to 0 and drops the address from the
    /// names of kernel frames that did not resolve; user frames are left
    /// as they are. Stacks shared by samples stay shared.
    pub fn hide_kernel_addresses(&mut self) {
        let placeholder = Line::named(UNKNOWN_KERNEL_FRAME.into());
        let mut hidden: HashMap<*const SymbolizedStack, Arc<SymbolizedStack>> = HashMap::new();
        for sample in &mut self.samples {
            if !sample
                .stack
                .locations
                .iter()
                .any(|location| location.kind == FrameKind::Kernel)
            {
                continue;
            }
            let stack = hidden
                .entry(Arc::as_ptr(&sample.stack))
                .or_insert_with(|| {
                    let mut locations = sample.stack.locations.clone();
                    for location in locations
                        .iter_mut()
                        .filter(|location| location.kind == FrameKind::Kernel)
                    {
                        location.address = 0;
                        if !location.resolved {
                            location.lines = placeholder.clone();
                        }
                    }
                    Arc::new(SymbolizedStack { locations })
                })
                .clone();
            sample.stack = stack;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        collect::ReadableBy,
        kind::{ProfileType, SampleKind},
        profile::Window,
        symbolize::{Location, Mapping, SymbolizedSample},
    };

    fn location(kind: FrameKind, address: u64, name: &str, resolved: bool) -> Location {
        Location {
            kind,
            address,
            mapping: Some(Arc::new(Mapping {
                start: 0,
                limit: u64::MAX,
                file_offset: 0,
                path: "[kernel.kallsyms]".into(),
                build_id: None,
            })),
            lines: Line::named(name.into()),
            resolved,
        }
    }

    fn sample(stack: &Arc<SymbolizedStack>) -> SymbolizedSample {
        SymbolizedSample {
            kind: SampleKind::Cpu,
            pid: 1,
            tid: 1,
            comm: "c".into(),
            readable_by: ReadableBy::User(1000),
            thread_name: "t".into(),
            stack: stack.clone(),
            count: 1,
            amount: 1,
            cgroup: None,
            ns_pid: None,
        }
    }

    #[test]
    fn kernel_frames_keep_their_names_and_lose_their_addresses() {
        let mixed = Arc::new(SymbolizedStack {
            locations: [
                location(FrameKind::Kernel, 0xffff_ffff_8136_963d, "handle_softirqs", true),
                location(
                    FrameKind::Kernel,
                    0xffff_ffff_8100_0001,
                    "[unknown] [kernel.kallsyms]+0xffffffff81000001",
                    false,
                ),
                location(FrameKind::User, 0x5555_0000_1234, "main", true),
            ]
            .into(),
        });
        let user_only = Arc::new(SymbolizedStack {
            locations: [location(FrameKind::User, 0x5555_0000_1234, "main", true)].into(),
        });
        let mut profile = Profile {
            window: Window::ALL,
            frequency: 99,
            alloc_interval: 0,
            profile_type: ProfileType::Cpu,
            samples: vec![sample(&mixed), sample(&mixed), sample(&user_only)],
        };
        profile.hide_kernel_addresses();
        let stack = &profile.samples[0].stack;
        assert!(
            Arc::ptr_eq(stack, &profile.samples[1].stack),
            "a shared stack stays shared"
        );
        assert!(
            Arc::ptr_eq(&profile.samples[2].stack, &user_only),
            "a stack without kernel frames is untouched"
        );
        let names: Vec<&str> = stack
            .locations
            .iter()
            .map(|location| &*location.lines[0].function.name)
            .collect();
        assert_eq!(names, ["handle_softirqs", UNKNOWN_KERNEL_FRAME, "main"]);
        let addresses: Vec<u64> = stack.locations.iter().map(|location| location.address).collect();
        assert_eq!(addresses, [0, 0, 0x5555_0000_1234]);
        assert_eq!(
            mixed.locations[0].address, 0xffff_ffff_8136_963d,
            "the stored stack is not changed"
        );
    }
}
