//! Room in a full store, by shares (issue 30): one user's storm used to
//! evict everyone's oldest samples, and everyone's history shrank to what the
//! storm left. Each non-root user now keeps `store_user_share_percent` of the
//! bound, root and the system services the rest; any of them may borrow
//! beyond its part while the store has room. Once it is full, whoever is
//! most over their share loses their own oldest samples (a drain's worth at
//! a time), so everyone else's history stays at the retention.

use super::{ENTRY_BYTES, Owner, StackId, Store};
use crate::shares::Losses;

/// Why an owner lost samples, in the order of the metric's `reason` label.
pub const LOSS_REASONS: [&str; 3] = ["over_share", "store_full", "refused"];
/// Its oldest samples went: it was over its share of a full store.
pub const OVER_SHARE: usize = 0;
/// The oldest drain went: the store was full with nobody over their share.
pub const STORE_FULL: usize = 1;
/// A new sample found no room (only its owner's newest drain was left).
pub const REFUSED: usize = 2;

pub type StoreLosses = Losses<{ LOSS_REASONS.len() }>;

impl Store {
    /// Makes room for `extra` more bytes charged to `owner`; false if there
    /// is none for it.
    pub(super) fn make_room(&mut self, owner: Owner, extra: usize) -> bool {
        while self.bytes() + extra > self.config.max_bytes {
            if self.over_share(owner, extra) > 0 {
                // Over its share, an owner makes room from its own oldest
                // only (never its newest drain, which it is adding to): it
                // cannot take from anyone, even someone further over.
                if self.evict_oldest_of(owner, true) {
                    continue;
                }
                return false;
            }
            // Within its share: those over theirs give room back, the
            // furthest over first.
            let victims = self.over_share_owners(owner);
            let anyone_over = !victims.is_empty();
            if victims
                .into_iter()
                .any(|victim| self.evict_oldest_of(victim, false))
            {
                continue;
            }
            // Its own oldest next.
            if self.evict_oldest_of(owner, true) {
                continue;
            }
            // Someone is over their share with nothing left to evict (its
            // bytes are stacks others' entries still use): the oldest drain
            // would take everyone's history for it. Refused instead.
            if anyone_over {
                return false;
            }
            // Nobody over their share (the shares overcommit the bound, or
            // the drains' own overhead fills it): the oldest drain goes, as
            // before shares.
            if self.buckets.len() <= 1 {
                return false;
            }
            let count = self.pop_oldest(Some(STORE_FULL));
            self.stats.samples_evicted += count;
        }
        true
    }

    /// How far `who` is over its share, counting `extra` more for `owner`.
    fn over_share(&self, who: Owner, extra: usize) -> u64 {
        let bytes = self.owner_bytes.get(&who).copied().unwrap_or(0) + extra;
        (bytes as u64).saturating_sub(self.shares.of(who))
    }

    /// The owners over their shares but `owner`, the furthest over first.
    fn over_share_owners(&self, owner: Owner) -> Vec<Owner> {
        let mut over: Vec<(u64, Owner)> = self
            .owner_bytes
            .keys()
            .filter(|&&who| who != owner)
            .map(|&who| (self.over_share(who, 0), who))
            .filter(|&(over, _)| over > 0)
            .collect();
        over.sort_unstable_by(|a, b| b.cmp(a));
        over.into_iter().map(|(_, who)| who).collect()
    }

    /// Evicts `victim`'s entries from the oldest drain holding any (not the
    /// newest if `keep_newest`); false if there were none.
    fn evict_oldest_of(&mut self, victim: Owner, keep_newest: bool) -> bool {
        let candidates = self.buckets.len() - usize::from(keep_newest && !self.buckets.is_empty());
        let Some(index) = self
            .buckets
            .iter()
            .take(candidates)
            .position(|bucket| bucket.owners.contains_key(&victim))
        else {
            return false;
        };
        let bucket = &mut self.buckets[index];
        bucket.owners.remove(&victim);
        let mut count = 0;
        let mut stacks: Vec<StackId> = Vec::new();
        bucket.entries.retain(|key, totals| {
            if Owner::from(key.readable_by) != victim {
                return true;
            }
            count += totals.count;
            stacks.push(key.stack);
            false
        });
        self.entry_count -= stacks.len();
        self.uncharge(victim, stacks.len() * ENTRY_BYTES);
        for id in stacks {
            self.release_stack(id);
        }
        self.stats.samples_evicted += count;
        self.stats.losses.add(victim, OVER_SHARE, count);
        // An oldest drain left empty only marks where the next one's samples
        // began, which the retention no longer reaches for anyone.
        // (Never the newest: the drain being ingested goes there.)
        if index == 0 && self.buckets.len() > 1 && self.buckets[0].entries.is_empty() {
            self.buckets.pop_front();
        }
        true
    }

    /// Drops the oldest drain; its samples are counted as lost for `reason`
    /// (none: they aged out). Returns how many samples it held.
    pub(super) fn pop_oldest(&mut self, reason: Option<usize>) -> u64 {
        let Some(bucket) = self.buckets.pop_front() else {
            return 0;
        };
        let mut count = 0;
        self.entry_count -= bucket.entries.len();
        for (owner, entries) in bucket.owners {
            self.uncharge(owner, entries * ENTRY_BYTES);
        }
        for (key, value) in bucket.entries {
            count += value.count;
            if let Some(reason) = reason {
                self.stats
                    .losses
                    .add(Owner::from(key.readable_by), reason, value.count);
            }
            self.release_stack(key.stack);
        }
        count
    }

    pub(super) fn charge(&mut self, owner: Owner, bytes: usize) {
        *self.owner_bytes.entry(owner).or_default() += bytes;
    }

    fn uncharge(&mut self, owner: Owner, bytes: usize) {
        if let Some(charged) = self.owner_bytes.get_mut(&owner) {
            *charged = charged.saturating_sub(bytes);
            if *charged == 0 {
                self.owner_bytes.remove(&owner);
            }
        }
    }

    /// Drops a reference to a stack, uncharging it if that freed it.
    pub(super) fn release_stack(&mut self, id: StackId) {
        if let Some((owner, bytes)) = self.stacks.release(id) {
            self.uncharge(owner, bytes);
        }
    }
}
