//! Separate debug files that only root can have put in place: found by
//! build id, never by a name another user chose.

use std::{
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

/// Where distributions install separate debug files, `.build-id/xx/rest.debug`.
pub const SYSTEM_DEBUG_DIR: &str = "/usr/lib/debug";

/// `/usr/lib/debug/.build-id/xx/rest.debug` when it is a regular file owned
/// by root: a path no user controls, matched by build id only.
pub fn system_debug_file(build_id: &[u8]) -> Option<PathBuf> {
    let (first, rest) = build_id.split_first()?;
    if rest.len() < 4 {
        return None;
    }
    let name: String = rest.iter().map(|byte| format!("{byte:02x}")).collect();
    let path = Path::new(SYSTEM_DEBUG_DIR)
        .join(".build-id")
        .join(format!("{first:02x}"))
        .join(format!("{name}.debug"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
        .ok()?;
    let meta = file.metadata().ok()?;
    (meta.is_file() && meta.uid() == 0).then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_ids_too_short_find_no_debug_file() {
        assert_eq!(system_debug_file(&[]), None);
        assert_eq!(system_debug_file(&[1, 2]), None);
    }
}
