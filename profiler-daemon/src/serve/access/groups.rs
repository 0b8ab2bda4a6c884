//! Group membership as the user database says (NSS: /etc/group, LDAP...),
//! not as some process's supplementary groups happen to be.

use std::ffi::{CStr, CString};

/// Buffers for the reentrant lookups start here and double on ERANGE, up to
/// the most an entry could sensibly need.
const FIRST_BUFFER: usize = 4096;
const MAX_BUFFER: usize = 1 << 20;
/// Groups one user may be in (NGROUPS_MAX is 65536).
const MAX_GROUPS: usize = 65_536;

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

fn group_id(name: &str) -> Option<u32> {
    let name = CString::new(name).ok()?;
    let mut buffer = vec![0u8; FIRST_BUFFER];
    loop {
        // SAFETY: all-zero bytes are a valid `group` (plain integers and null pointers).
        let mut entry: libc::group = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::group = std::ptr::null_mut();
        // SAFETY: `name` is NUL-terminated; `entry`, `buffer` (with its true
        // length) and `found` are valid for writes for the whole call.
        let status = unsafe {
            libc::getgrnam_r(
                name.as_ptr(),
                &mut entry,
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                &mut found,
            )
        };
        match status {
            0 if found.is_null() => return None,
            0 => return Some(entry.gr_gid),
            libc::ERANGE if buffer.len() < MAX_BUFFER => buffer.resize(buffer.len() * 2, 0),
            _ => return None,
        }
    }
}

/// The user's name and primary group.
fn user(uid: u32) -> Option<(CString, u32)> {
    let mut buffer = vec![0u8; FIRST_BUFFER];
    loop {
        // SAFETY: all-zero bytes are a valid `passwd` (plain integers and null pointers).
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: `entry`, `buffer` (with its true length) and `found` are
        // valid for writes for the whole call.
        let status = unsafe {
            libc::getpwuid_r(
                uid,
                &mut entry,
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                &mut found,
            )
        };
        match status {
            0 if found.is_null() || entry.pw_name.is_null() => return None,
            0 => {
                // SAFETY: on success pw_name points to a NUL-terminated
                // string inside `buffer`, which is still alive.
                let name = unsafe { CStr::from_ptr(entry.pw_name) }.to_owned();
                return Some((name, entry.pw_gid));
            }
            libc::ERANGE if buffer.len() < MAX_BUFFER => buffer.resize(buffer.len() * 2, 0),
            _ => return None,
        }
    }
}

fn group_list(name: &CStr, primary: u32) -> Vec<u32> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut count = libc::c_int::try_from(groups.len()).unwrap_or(libc::c_int::MAX);
        // SAFETY: `name` is NUL-terminated; `groups` holds `count` writable
        // entries, and `count` is valid for writes.
        let status = unsafe { libc::getgrouplist(name.as_ptr(), primary, groups.as_mut_ptr(), &mut count) };
        let count = usize::try_from(count).unwrap_or(0);
        if status >= 0 {
            groups.truncate(count.min(groups.len()));
            return groups;
        }
        // Too small: `count` says how many there are.
        let wanted = count.max(groups.len() * 2);
        if wanted > MAX_GROUPS {
            return Vec::new();
        }
        groups.resize(wanted, 0);
    }
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
