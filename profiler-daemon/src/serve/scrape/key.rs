//! What makes two scrapes' answers the same bytes.

use crate::{
    kind::{KindSet, ProfileType},
    profile::Filter,
    profile::Window,
    serve::{access::Scope, params::Span},
};

/// How an answer is written; part of the key, since each is its own bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// gzipped pprof (`/pprof`, `/debug/pprof/profile`).
    Pprof,
    /// `/threads`: JSON.
    Threads,
    /// `/folded`.
    Folded,
    /// `/top`.
    Top { json: bool, limit: usize },
    /// `/flamegraph.svg`.
    Flamegraph { icicle: bool },
    /// `/`, whose links ask for the same `seconds` (or `start` and `end`);
    /// `kinds` (those recorded) decides which types it offers.
    Index { span: Span, kinds: KindSet },
}

/// Two requests with equal keys get the same answer: the same window (so
/// the same drains, hence the same samples), the same samples kept (the
/// same filter and profile type: a CPU scrape never gets an off-CPU
/// answer), for the same viewer scope, in the same format.
///
/// The scope is part of the key so that an answer computed for someone who
/// sees every process is never handed to someone who sees only their own
/// (nor one user's answer to another user), and one with kernel addresses
/// never to someone the kernel hides them from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShareKey {
    pub window: Window,
    /// Normalized ([`Filter::normalized`]).
    pub filter: Filter,
    pub scope: Scope,
    pub profile_type: ProfileType,
    pub format: Format,
}

impl ShareKey {
    pub fn new(
        window: Window,
        filter: Filter,
        scope: Scope,
        profile_type: ProfileType,
        format: Format,
    ) -> Self {
        Self {
            window,
            filter: filter.normalized(),
            scope,
            profile_type,
            format,
        }
    }

    /// The drain the window ends at: answers of older drains are stale once
    /// a newer one is served.
    pub fn generation(&self) -> u64 {
        self.window.end_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Visible;

    /// An unprivileged user's scope, kernel addresses hidden.
    fn user(uid: u32) -> Scope {
        Scope {
            visible: Visible::User(uid),
            kernel_addresses: false,
        }
    }

    fn filter(pids: &[u32], tids: &[u32], comms: &[&str]) -> Filter {
        Filter {
            pids: pids.to_vec(),
            tids: tids.to_vec(),
            comms: comms.iter().map(|comm| (*comm).to_owned()).collect(),
            ..Filter::default()
        }
    }

    const WINDOW: Window = Window {
        start_ms: 1_000,
        end_ms: 11_001,
    };

    #[test]
    fn filters_that_keep_the_same_samples_share_a_key() {
        let a = ShareKey::new(
            WINDOW,
            filter(&[3, 1, 2, 1], &[9, 8], &["b", "a"]),
            Scope::ALL,
            ProfileType::Cpu,
            Format::Pprof,
        );
        let b = ShareKey::new(
            WINDOW,
            filter(&[1, 2, 3], &[8, 9, 9], &["a", "b", "a"]),
            Scope::ALL,
            ProfileType::Cpu,
            Format::Pprof,
        );
        assert_eq!(a, b);
        assert_eq!(a.filter, filter(&[1, 2, 3], &[8, 9], &["a", "b"]));
    }

    #[test]
    fn scope_window_filter_type_and_format_each_separate_keys() {
        let base = ShareKey::new(
            WINDOW,
            filter(&[1], &[], &[]),
            Scope::ALL,
            ProfileType::Cpu,
            Format::Pprof,
        );
        let variants = [
            ShareKey::new(
                WINDOW,
                filter(&[1], &[], &[]),
                user(1000),
                ProfileType::Cpu,
                Format::Pprof,
            ),
            ShareKey::new(
                Window {
                    end_ms: WINDOW.end_ms + 1,
                    ..WINDOW
                },
                filter(&[1], &[], &[]),
                Scope::ALL,
                ProfileType::Cpu,
                Format::Pprof,
            ),
            ShareKey::new(
                WINDOW,
                filter(&[2], &[], &[]),
                Scope::ALL,
                ProfileType::Cpu,
                Format::Pprof,
            ),
            ShareKey::new(
                WINDOW,
                filter(&[], &[1], &[]),
                Scope::ALL,
                ProfileType::Cpu,
                Format::Pprof,
            ),
            ShareKey::new(
                WINDOW,
                filter(&[1], &[], &[]),
                Scope::ALL,
                ProfileType::Cpu,
                Format::Folded,
            ),
            ShareKey::new(
                WINDOW,
                filter(&[1], &[], &[]),
                Scope::ALL,
                ProfileType::Cpu,
                Format::Top {
                    json: false,
                    limit: 50,
                },
            ),
        ];
        for variant in &variants {
            assert_ne!(&base, variant);
        }
        // Nor do two profile types of one window.
        for profile_type in [ProfileType::OffCpu, ProfileType::Wall] {
            assert_ne!(
                base,
                ShareKey::new(
                    WINDOW,
                    filter(&[1], &[], &[]),
                    Scope::ALL,
                    profile_type,
                    Format::Pprof
                )
            );
        }
        // Nor does a user the kernel shows its addresses with one it hides them from.
        assert_ne!(
            ShareKey::new(
                WINDOW,
                Filter::default(),
                user(1000),
                ProfileType::Cpu,
                Format::Folded
            ),
            ShareKey::new(
                WINDOW,
                Filter::default(),
                Scope {
                    kernel_addresses: true,
                    ..user(1000)
                },
                ProfileType::Cpu,
                Format::Folded
            )
        );
        // Two unprivileged users never share either.
        assert_ne!(
            ShareKey::new(
                WINDOW,
                Filter::default(),
                user(1000),
                ProfileType::Cpu,
                Format::Pprof
            ),
            ShareKey::new(
                WINDOW,
                Filter::default(),
                user(1001),
                ProfileType::Cpu,
                Format::Pprof
            )
        );
    }
}
