use std::sync::Arc;

use super::*;
use crate::{
    kind::ProfileType,
    profile::Window,
    symbolize::{SymbolizedSample, SymbolizedStack},
};

fn stack(frames: &[&str]) -> Arc<SymbolizedStack> {
    crate::symbolize::user_stack(frames)
}

fn sample(kind: SampleKind, stack: &Arc<SymbolizedStack>, count: u64, amount: u64) -> SymbolizedSample {
    SymbolizedSample {
        kind,
        pid: 1,
        tid: 1,
        comm: "w".into(),
        readable_by: crate::collect::ReadableBy::Privileged,
        thread_name: "w".into(),
        stack: stack.clone(),
        count,
        amount,
        cgroup: None,
        ns_pid: None,
    }
}

#[test]
fn sites_add_up_allocations_frees_and_lifetimes_like_dhat() {
    let churn = stack(&["churn", "main"]);
    let leak = stack(&["leak", "main"]);
    let profile = Profile {
        window: Window::ALL,
        frequency: 99,
        alloc_interval: 0,
        profile_type: ProfileType::Alloc,
        samples: vec![
            sample(SampleKind::Alloc, &churn, 4, 4096),
            sample(SampleKind::AllocFreed, &churn, 3, 3072),
            sample(SampleKind::AllocLifetime, &churn, 3, 3_000_000),
            sample(SampleKind::Alloc, &leak, 2, 65_536),
        ],
    };
    let sites = sites(&profile, 10);
    assert_eq!(
        sites,
        [
            Site {
                name: "leak".into(),
                bytes: 65_536,
                blocks: 2,
                average_bytes: 32_768,
                live_bytes: 65_536,
                live_blocks: 2,
                average_lifetime_ns: None,
            },
            Site {
                name: "churn".into(),
                bytes: 4096,
                blocks: 4,
                average_bytes: 1024,
                live_bytes: 1024,
                live_blocks: 1,
                average_lifetime_ns: Some(1_000_000),
            },
        ]
    );
    let text = table(&profile, &sites);
    assert!(text.contains("1.000 ms  churn"), "{text}");
    assert!(
        text.lines().nth(4).is_some_and(|line| line.ends_with("  churn")),
        "{text}"
    );
}
