//! Shares, not a commons (issue 30): a bounded resource that one user can
//! fill (the unwind tables' kernel memory, the sample store) is divided so
//! that one user's load cannot take another's part.
//!
//! Every uid but root's is a user with a share of its own (a service account
//! as much as a login: either can be made to storm). Root, and processes
//! whose owner is unknown, are the privileged part: they keep what the
//! users' share leaves. A party may borrow beyond its share while there is
//! room nobody else needs; once the resource is full, whoever is over their
//! share loses first. What each loses is counted, per uid and reason (counts
//! only: no name, path or stack of anyone).

use std::collections::BTreeMap;

/// Whose part a table or a sample is charged to (a process's: see
/// `collect::ReadableBy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    /// Root, or an owner the daemon could not tell (treated as the system).
    Privileged,
    User(u32),
}

impl Owner {
    /// The `uid` label of the loss metrics.
    pub fn label(self) -> String {
        match self {
            Owner::Privileged => "privileged".to_owned(),
            Owner::User(uid) => uid.to_string(),
        }
    }
}

/// Default of `unwind_table_user_share_percent` and `store_user_share_percent`:
/// one user alone may still use all of a resource nobody else needs (it
/// borrows), so a single-user machine behaves as before; under contention a
/// user keeps half and root and the system services the other half.
pub const DEFAULT_USER_SHARE_PERCENT: u64 = 50;

/// How a bounded amount is divided: each user may hold `user` units before
/// it is the first to lose; the privileged part is the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shares {
    total: u64,
    user: u64,
}

impl Shares {
    /// `user_percent` of `total` for each user (clamped to 100).
    pub fn new(total: u64, user_percent: u64) -> Self {
        let user = (u128::from(total) * u128::from(user_percent.min(100)) / 100) as u64;
        Self { total, user }
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// What `owner` may hold before it loses first.
    pub fn of(&self, owner: Owner) -> u64 {
        match owner {
            Owner::User(_) => self.user,
            Owner::Privileged => self.total - self.user,
        }
    }
}

/// Distinct owners counted one by one; the others share one `other` series,
/// so the metric stays bounded whatever uids appear.
pub const MAX_COUNTED_OWNERS: usize = 64;

/// What each owner lost, per reason: `N` reasons, named at encoding time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Losses<const N: usize> {
    by_owner: BTreeMap<Owner, [u64; N]>,
    other: [u64; N],
}

impl<const N: usize> Default for Losses<N> {
    fn default() -> Self {
        Self {
            by_owner: BTreeMap::new(),
            other: [0; N],
        }
    }
}

impl<const N: usize> Losses<N> {
    pub fn add(&mut self, owner: Owner, reason: usize, count: u64) {
        if reason >= N || count == 0 {
            return;
        }
        let slot = if self.by_owner.contains_key(&owner) || self.by_owner.len() < MAX_COUNTED_OWNERS {
            self.by_owner.entry(owner).or_insert([0; N])
        } else {
            &mut self.other
        };
        slot[reason] += count;
    }

    /// (uid label, reason index, count) for every non-zero count.
    pub fn series(&self) -> Vec<(String, usize, u64)> {
        let owners = self
            .by_owner
            .iter()
            .map(|(owner, counts)| (owner.label(), counts))
            .chain(std::iter::once(("other".to_owned(), &self.other)));
        let mut series = Vec::new();
        for (label, counts) in owners {
            for (reason, &count) in counts.iter().enumerate() {
                if count > 0 {
                    series.push((label.clone(), reason, count));
                }
            }
        }
        series
    }

    #[cfg(test)]
    pub fn of(&self, owner: Owner, reason: usize) -> u64 {
        self.by_owner.get(&owner).map_or(0, |counts| counts[reason])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_share_is_a_percentage_and_the_rest_is_privileged() {
        let shares = Shares::new(1000, 30);
        assert_eq!(shares.of(Owner::User(1000)), 300);
        assert_eq!(shares.of(Owner::Privileged), 700);
        let all = Shares::new(1000, 250);
        assert_eq!(all.of(Owner::User(1)), 1000, "clamped to the whole");
        assert_eq!(all.of(Owner::Privileged), 0);
    }

    #[test]
    fn losses_are_bounded_in_owners() {
        let mut losses = Losses::<2>::default();
        for uid in 0..(MAX_COUNTED_OWNERS as u32 + 10) {
            losses.add(Owner::User(1000 + uid), 1, 2);
        }
        losses.add(Owner::User(1000), 0, 5);
        losses.add(Owner::User(1000), 0, 0);
        let series = losses.series();
        assert_eq!(
            series.len(),
            MAX_COUNTED_OWNERS + 2,
            "one per owner, one more for uid 1000, and other"
        );
        assert!(series.contains(&("other".to_owned(), 1, 20)));
        assert!(series.contains(&("1000".to_owned(), 0, 5)));
        assert_eq!(losses.of(Owner::User(1000), 1), 2);
    }
}
