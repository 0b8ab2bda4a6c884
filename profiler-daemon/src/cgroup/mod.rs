//! The cgroups of sampled tasks: the sampler records each task's cgroup v2
//! id; [`CgroupResolver`] names it (the id is the inode of the cgroup's
//! directory in the cgroup v2 hierarchy), and [`parse`] reads the systemd unit
//! and the container id from the name.

mod parse;
mod resolver;

use std::sync::Arc;

pub use parse::{container_id_of, is_unit_name, unit_of};
pub use resolver::{CgroupResolver, CgroupStats, MAX_PATH_BYTES, read_process_cgroup, v2_root};

/// What a sample's cgroup says about it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cgroup {
    /// As /proc/PID/cgroup shows it: `/system.slice/nginx.service`, `/` for the root.
    pub path: Arc<str>,
    /// See [`unit_of`].
    pub unit: Option<Arc<str>>,
    /// See [`container_id_of`].
    pub container_id: Option<Arc<str>>,
}

impl Cgroup {
    pub fn from_path(path: &str) -> Self {
        Self {
            path: path.into(),
            unit: unit_of(path).map(Into::into),
            container_id: container_id_of(path).map(Into::into),
        }
    }

    /// True when this cgroup is `prefix` or lies below it, component by
    /// component (`/system.slice` is not a prefix of `/system.slice2`).
    /// `prefix` is normalized as [`normalize_prefix`] does.
    pub fn is_under(&self, prefix: &str) -> bool {
        prefix == "/"
            || self
                .path
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }
}

/// A cgroup path prefix as a reader may write it (`system.slice/`,
/// `/system.slice`) in the form paths have: one leading `/`, no trailing one.
pub fn normalize_prefix(prefix: &str) -> String {
    let trimmed = prefix.trim_matches('/');
    format!("/{trimmed}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_whole_components() {
        let cgroup = Cgroup::from_path("/system.slice/nginx.service");
        assert_eq!(cgroup.unit.as_deref(), Some("nginx.service"));
        assert_eq!(cgroup.container_id, None);
        for prefix in ["/", "/system.slice", "/system.slice/nginx.service"] {
            assert!(cgroup.is_under(prefix), "{prefix}");
        }
        for prefix in ["/system", "/system.slice/nginx", "/user.slice"] {
            assert!(!cgroup.is_under(prefix), "{prefix}");
        }
        assert_eq!(normalize_prefix("system.slice/"), "/system.slice");
        assert_eq!(normalize_prefix("/"), "/");
        assert_eq!(normalize_prefix(""), "/");
    }
}
