//! Whose files the worker reads first in a batch (issue 30): a batch spends
//! at most about one deadline in the worker and defers the files left over,
//! so one user's many (or slow) files, read first, left everyone else's
//! frames unresolved. Files now take turns by owner: root and the system
//! services first, then one file of each user in a rotating order, round
//! after round, until the budget is spent.

use std::collections::BTreeMap;

use crate::shares::Owner;

/// `items` in the order they are served: one per owner a round, the
/// privileged first, the users starting at `rotation` (modulo their number).
pub fn in_turns<T>(items: Vec<(Owner, T)>, rotation: usize) -> Vec<T> {
    let mut by_owner: BTreeMap<Owner, std::collections::VecDeque<T>> = BTreeMap::new();
    for (owner, item) in items {
        by_owner.entry(owner).or_default().push_back(item);
    }
    let mut privileged = by_owner.remove(&Owner::Privileged).unwrap_or_default();
    let mut users: Vec<_> = by_owner.into_values().collect();
    if !users.is_empty() {
        let start = rotation % users.len();
        users.rotate_left(start);
    }
    let mut order = Vec::new();
    loop {
        let mut served = false;
        if let Some(item) = privileged.pop_front() {
            order.push(item);
            served = true;
        }
        for queue in &mut users {
            if let Some(item) = queue.pop_front() {
                order.push(item);
                served = true;
            }
        }
        if !served {
            return order;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_take_turns_root_first_users_rotating() {
        let items = vec![
            (Owner::User(1001), "a1"),
            (Owner::User(1001), "a2"),
            (Owner::User(1001), "a3"),
            (Owner::User(1002), "b1"),
            (Owner::Privileged, "r1"),
            (Owner::Privileged, "r2"),
        ];
        assert_eq!(in_turns(items.clone(), 0), ["r1", "a1", "b1", "r2", "a2", "a3"]);
        assert_eq!(in_turns(items, 1), ["r1", "b1", "a1", "r2", "a2", "a3"]);
        assert!(in_turns::<u8>(Vec::new(), 3).is_empty());
    }
}
