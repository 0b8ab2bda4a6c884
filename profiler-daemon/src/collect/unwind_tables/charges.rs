//! Whose tables a placement may evict (issue 30): three processes of one
//! user with huge tables used to evict, by usefulness, the tables of a root
//! process that runs in bursts (whose usage decays between them), and its
//! stacks ended at its own functions. Usefulness is right between equals,
//! not between a user and everyone else.
//!
//! A loaded table is charged, whole, to every owner ([`Owner`]) one of whose
//! tracked processes maps its file: shared libraries count against each of
//! their users. An owner may place tables beyond its share while there is
//! free room; when there is none, a placement may evict:
//! - tables no tracked process maps any more, and tables charged to the
//!   placing owner alone: the least useful per chunk of room first, and only those less than
//!   half as useful as the newcomer (between equals, as before);
//! - if the placing owner stays within its share, tables whose every other
//!   owner is over its share (reclaimed, whatever their use: the owner over
//!   its share borrowed that room); but a table root's processes map only
//!   when it is idle (no sample through it for about ten drains): a root
//!   process that runs in bursts keeps its tables however much root holds;
//! - nothing else: a placement that finds no room is refused and counted.

use std::collections::HashMap;

use crate::shares::{Losses, Owner, Shares};

/// Why an owner lost a table, in the order of the metric's `reason` label.
pub const LOSS_REASONS: [&str; 4] = ["evicted_own", "evicted_unused", "reclaimed", "refused"];
/// Evicted by a more useful table of its own owner.
pub const EVICTED_OWN: usize = 0;
/// No tracked process mapped it any more; a more useful table took its room.
pub const EVICTED_UNUSED: usize = 1;
/// Its owner was over its share; someone within theirs took the room back.
pub const RECLAIMED: usize = 2;
/// Found no room it was allowed to take.
pub const REFUSED: usize = 3;

pub type TableLosses = Losses<{ LOSS_REASONS.len() }>;

/// Usage below which a table is idle: 1 sample ~10 drains ago, 15 ~14 ago.
pub const IDLE_USAGE: f64 = 1e-3;

/// May a table go to make room, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// If less than half as useful as the newcomer; the loss's reason.
    IfLessUseful(usize),
    /// Whatever its use: its other owners are over their shares.
    Reclaim,
    /// As `Reclaim`, but only if idle: root is among its other owners.
    ReclaimIfIdle,
    Kept,
}

/// The owners' charges while one table is placed.
#[derive(Debug)]
pub struct Charges {
    shares: Shares,
    /// Chunks of loaded tables charged to each owner.
    used: HashMap<Owner, u64>,
    placing: Owner,
    /// The chunks being placed.
    need: u64,
}

impl Charges {
    /// `used`: each owner's charged chunks before `placing` places `need`.
    pub fn new(shares: Shares, used: HashMap<Owner, u64>, placing: Owner, need: u64) -> Self {
        Self {
            shares,
            used,
            placing,
            need,
        }
    }

    /// Whose table is being placed.
    pub fn placing(&self) -> Owner {
        self.placing
    }

    fn used(&self, owner: Owner) -> u64 {
        self.used.get(&owner).copied().unwrap_or(0)
    }

    fn over_share(&self, owner: Owner) -> bool {
        self.used(owner) > self.shares.of(owner)
    }

    /// Whether the placing owner is within its share with the new table.
    pub fn placing_within_share(&self) -> bool {
        self.used(self.placing) + self.need <= self.shares.of(self.placing)
    }

    /// May a table charged to `owners` (sorted, deduplicated) make room?
    pub fn verdict(&self, owners: &[Owner]) -> Verdict {
        if owners.is_empty() {
            return Verdict::IfLessUseful(EVICTED_UNUSED);
        }
        if owners == [self.placing] {
            return Verdict::IfLessUseful(EVICTED_OWN);
        }
        let others_over = owners
            .iter()
            .filter(|&&owner| owner != self.placing)
            .all(|&owner| self.over_share(owner));
        if others_over && self.placing_within_share() {
            if owners.contains(&Owner::Privileged) && self.placing != Owner::Privileged {
                Verdict::ReclaimIfIdle
            } else {
                Verdict::Reclaim
            }
        } else {
            Verdict::Kept
        }
    }

    /// Takes an evicted table's chunks off its owners' charges.
    pub fn evicted(&mut self, owners: &[Owner], chunks: u64) {
        for owner in owners {
            if let Some(used) = self.used.get_mut(owner) {
                *used = used.saturating_sub(chunks);
            }
        }
    }
}

/// A loaded table that might make room.
#[derive(Clone, Copy, Debug)]
pub struct Candidate<K> {
    pub key: K,
    pub verdict: Verdict,
    /// Its samples (see [`super::usage`]).
    pub usage: f64,
    /// The room it holds.
    pub chunks: u32,
}

impl<K> Candidate<K> {
    /// Samples per chunk of room: what keeping it buys. A table of 100 rows
    /// under a busy program must not go for one a hundred times its size
    /// that is only twice as used (it frees one chunk of the hundred).
    fn density(&self) -> f64 {
        self.usage / f64::from(self.chunks.max(1))
    }
}

/// The table to evict among `candidates` for a newcomer of `need` chunks
/// with `worth` samples: reclaimed room first (the least useful per chunk of
/// it), then the least useful per chunk of the rest, if less than half as
/// useful per chunk as the newcomer (tables of about equal use must not take
/// turns evicting each other). Returns the key and the reason.
pub fn choose<K: Copy>(
    candidates: impl IntoIterator<Item = Candidate<K>>,
    worth: f64,
    need: u32,
) -> Option<(K, usize)> {
    let mut reclaim: Option<(K, f64)> = None;
    let mut useful: Option<(K, usize, f64)> = None;
    for candidate in candidates {
        let density = candidate.density();
        let reclaimable = match candidate.verdict {
            Verdict::Reclaim => true,
            Verdict::ReclaimIfIdle => candidate.usage < IDLE_USAGE,
            Verdict::IfLessUseful(reason) => {
                if useful.is_none_or(|(_, _, least)| density < least) {
                    useful = Some((candidate.key, reason, density));
                }
                false
            }
            Verdict::Kept => false,
        };
        if reclaimable && reclaim.is_none_or(|(_, least)| density < least) {
            reclaim = Some((candidate.key, density));
        }
    }
    if let Some((key, _)) = reclaim {
        return Some((key, RECLAIMED));
    }
    let newcomer = worth / f64::from(need.max(1));
    useful
        .filter(|&(_, _, density)| density * 2.0 < newcomer)
        .map(|(key, reason, _)| (key, reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: Owner = Owner::Privileged;
    const ALICE: Owner = Owner::User(1001);
    const BOB: Owner = Owner::User(1002);

    /// A candidate of one chunk.
    fn c(key: u32, verdict: Verdict, usage: f64) -> Candidate<u32> {
        Candidate {
            key,
            verdict,
            usage,
            chunks: 1,
        }
    }

    /// 100 chunks, 50 per user.
    fn charges(used: &[(Owner, u64)], placing: Owner, need: u64) -> Charges {
        Charges::new(
            Shares::new(100, 50),
            used.iter().copied().collect(),
            placing,
            need,
        )
    }

    #[test]
    fn a_user_never_evicts_roots_tables_or_shared_ones_whatever_their_use() {
        let alice = charges(&[(ROOT, 30), (ALICE, 70)], ALICE, 10);
        assert_eq!(alice.verdict(&[ROOT]), Verdict::Kept);
        assert_eq!(
            alice.verdict(&[ROOT, ALICE]),
            Verdict::Kept,
            "libc, shared with root"
        );
        assert_eq!(alice.verdict(&[ALICE]), Verdict::IfLessUseful(EVICTED_OWN));
        assert_eq!(alice.verdict(&[]), Verdict::IfLessUseful(EVICTED_UNUSED));
        // Even the most useful newcomer evicts only her own, never root's idle table.
        let candidates = [
            c(1, alice.verdict(&[ROOT]), 0.0),
            c(2, alice.verdict(&[ALICE]), 5.0),
        ];
        assert_eq!(choose(candidates, 1e9, 1), Some((2, EVICTED_OWN)));
        assert_eq!(
            choose([c(1, alice.verdict(&[ROOT]), 0.0)], 1e9, 1),
            None,
            "refused"
        );
    }

    #[test]
    fn root_reclaims_from_a_user_over_share_whatever_its_use() {
        let root = charges(&[(ROOT, 10), (ALICE, 90)], ROOT, 5);
        assert!(root.placing_within_share());
        assert_eq!(root.verdict(&[ALICE]), Verdict::Reclaim);
        assert_eq!(root.verdict(&[ROOT, ALICE]), Verdict::Reclaim);
        // A root burst is worth little between bursts; the user's busy table much more.
        let candidates = [
            c(1, root.verdict(&[ALICE]), 500.0),
            c(2, root.verdict(&[ALICE]), 300.0),
        ];
        assert_eq!(
            choose(candidates, 1.0, 1),
            Some((2, RECLAIMED)),
            "the least useful of it"
        );
        // Back within her share, her tables are hers again.
        let root = charges(&[(ROOT, 10), (ALICE, 50)], ROOT, 5);
        assert_eq!(root.verdict(&[ALICE]), Verdict::Kept);
    }

    #[test]
    fn users_reclaim_from_each_other_only_within_their_own_share() {
        let bob = charges(&[(ALICE, 80), (BOB, 10)], BOB, 20);
        assert_eq!(bob.verdict(&[ALICE]), Verdict::Reclaim);
        assert_eq!(bob.verdict(&[ALICE, BOB]), Verdict::Reclaim);
        let greedy_bob = charges(&[(ALICE, 80), (BOB, 45)], BOB, 20);
        assert!(!greedy_bob.placing_within_share());
        assert_eq!(
            greedy_bob.verdict(&[ALICE]),
            Verdict::Kept,
            "both over: no taking turns"
        );
        assert_eq!(greedy_bob.verdict(&[BOB]), Verdict::IfLessUseful(EVICTED_OWN));
    }

    #[test]
    fn root_over_its_part_is_reclaimed_by_a_user_within_hers_only_where_idle() {
        let alice = charges(&[(ROOT, 90), (ALICE, 5)], ALICE, 5);
        let verdict = alice.verdict(&[ROOT]);
        assert_eq!(verdict, Verdict::ReclaimIfIdle);
        // A root process in bursts: little use between them, but some.
        assert_eq!(choose([c(1, verdict, 0.5)], 1e9, 1), None);
        assert_eq!(
            choose([c(1, verdict, 0.5), c(2, verdict, 0.0)], 1.0, 1),
            Some((2, RECLAIMED))
        );
        let root_within = charges(&[(ROOT, 40), (ALICE, 5)], ALICE, 5);
        assert_eq!(root_within.verdict(&[ROOT]), Verdict::Kept);
    }

    #[test]
    fn between_equals_usefulness_decides_as_before() {
        let alice = charges(&[(ALICE, 70)], ALICE, 10);
        let verdict = alice.verdict(&[ALICE]);
        assert_eq!(
            choose([c(1, verdict, 10.0)], 15.0, 1),
            None,
            "not twice as useful"
        );
        assert_eq!(choose([c(1, verdict, 10.0)], 25.0, 1), Some((1, EVICTED_OWN)));
    }

    #[test]
    fn evictions_update_the_charges() {
        let mut root = charges(&[(ROOT, 10), (ALICE, 60)], ROOT, 5);
        assert_eq!(root.verdict(&[ALICE]), Verdict::Reclaim);
        root.evicted(&[ALICE], 10);
        assert_eq!(root.verdict(&[ALICE]), Verdict::Kept, "at her share now");
    }

    #[test]
    fn a_small_busy_table_outweighs_a_large_newcomer_used_a_little_more() {
        // A 1-chunk table of a busy program (150 samples) against a library
        // of 40 chunks with 233: the library is worth 6 samples a chunk.
        let own = Verdict::IfLessUseful(EVICTED_OWN);
        let small = Candidate {
            key: 1,
            verdict: own,
            usage: 150.0,
            chunks: 1,
        };
        assert_eq!(choose([small], 233.0, 40), None);
        // A large table barely used goes for it.
        let large = Candidate {
            key: 2,
            verdict: own,
            usage: 20.0,
            chunks: 60,
        };
        assert_eq!(choose([small, large], 233.0, 40), Some((2, EVICTED_OWN)));
    }
}
