//! Group membership as the user database says (NSS: /etc/group, LDAP...),
//! not as some process's supplementary groups happen to be.
//!
//! nix's lookups are the reentrant ones (getgrnam_r, getpwuid_r), their
//! buffers doubled on ERANGE up to 1 MiB; getgrouplist's list grows up to
//! NGROUPS_MAX (65536). A lookup that fails reads as "unknown".

use std::ffi::{CStr, CString};

use nix::unistd::{Gid, Group, Uid, User, getgrouplist};

/// True when `uid` belongs to the group named `group` (as primary or
/// supplementary group). False when either is unknown.
pub fn is_member(uid: u32, group: &str) -> bool {
    let Some(gid) = group_id(group) else {
        return false;
    };
    let Some((name, primary)) = user(uid) else {
        return false;
    };
    primary == gid || group_list(&name, primary).contains(&gid)
}

fn group_id(name: &str) -> Option<Gid> {
    Group::from_name(name).ok().flatten().map(|group| group.gid)
}

/// The user's name and primary group. nix hands the name over as UTF-8
/// (lossily): a name that is not (no tool creates one) then finds no
/// supplementary group, a refusal rather than a grant.
fn user(uid: u32) -> Option<(CString, Gid)> {
    let user = User::from_uid(Uid::from_raw(uid)).ok().flatten()?;
    // An entry without a name is no one to look groups up for.
    let name = CString::new(user.name).ok().filter(|name| !name.is_empty())?;
    Some((name, user.gid))
}

/// The groups `name` is in, `primary` among them; none when there are more
/// than NGROUPS_MAX.
fn group_list(name: &CStr, primary: Gid) -> Vec<Gid> {
    getgrouplist(name, primary).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_in_its_primary_group_and_not_in_an_unknown_one() {
        assert!(is_member(0, "root"), "uid 0's primary group is root");
        assert!(!is_member(0, "no-such-group-for-profilerd"));
        assert!(!is_member(4_000_000_000, "root"), "an unknown uid is in no group");
    }
}
