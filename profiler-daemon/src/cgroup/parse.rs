//! What a cgroup v2 path says about its processes: the systemd unit they run
//! in and the container they belong to. Pure functions of the path.
//!
//! Paths are as /proc/PID/cgroup shows them: `/` is the root, components are
//! separated by `/`. Names below a delegated cgroup are chosen by whoever it
//! was delegated to (a user, a container): the rules below read the path from
//! the root and stop at the first unit and the first container, so a name
//! chosen inside a delegated subtree cannot pose as a unit or container
//! outside it.

/// Unit types that own a cgroup.
const UNIT_SUFFIXES: [&str; 6] = [".service", ".scope", ".slice", ".socket", ".mount", ".swap"];
/// systemd refuses longer unit names (UNIT_NAME_MAX - 1).
const MAX_UNIT_NAME: usize = 255;
/// Scopes container runtimes create under systemd's cgroup driver, as
/// `<prefix><id>.scope`. `crio-conmon-` and `libpod-conmon-` are the
/// runtimes' monitors, not containers, and do not match (their id part
/// starts with `conmon-`, which is not hex).
const CONTAINER_SCOPE_PREFIXES: [&str; 4] = ["docker-", "cri-containerd-", "crio-", "libpod-"];
/// Container ids of docker, containerd, cri-o and podman: 64 hex digits.
const CONTAINER_ID_LEN: usize = 64;

/// The systemd unit of a cgroup path: the first unit below the slices, or
/// the innermost slice when there is no unit (`None` for the root).
///
/// A unit of a user's manager (`user@UID.service`) is named with its
/// manager, `user@1000.service/app.service`: the user chooses those names,
/// and a user's `nginx.service` must not be taken for the system's.
pub fn unit_of(path: &str) -> Option<String> {
    let mut slice = None;
    let mut manager = None;
    for component in path.split('/').filter(|component| is_unit_name(component)) {
        if component.ends_with(".slice") {
            // Slices inside a user's manager are the user's; the manager names the unit.
            if manager.is_none() {
                slice = Some(component);
            }
            continue;
        }
        match manager {
            None if is_user_manager(component) => manager = Some(component),
            None => return Some(component.to_owned()),
            Some(manager) => return Some(format!("{manager}/{component}")),
        }
    }
    manager.or(slice).map(str::to_owned)
}

/// The container id of a cgroup path, if it follows the cgroup layout of
/// docker, containerd (Kubernetes), cri-o or podman: systemd driver scopes
/// (`docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`,
/// `libpod-<id>.scope`) or cgroupfs driver directories named by the bare id
/// (`/docker/<id>`, `/kubepods/burstable/pod<uid>/<id>`, `/libpod_parent/libpod-<id>`).
/// The outermost one wins: a container's own cgroups below cannot change it.
pub fn container_id_of(path: &str) -> Option<&str> {
    path.split('/').find_map(container_id_in)
}

fn container_id_in(component: &str) -> Option<&str> {
    if is_container_id(component) {
        return Some(component);
    }
    let id = match component.strip_suffix(".scope") {
        Some(scope) => CONTAINER_SCOPE_PREFIXES
            .iter()
            .find_map(|prefix| scope.strip_prefix(prefix))?,
        // podman's cgroupfs driver.
        None => component.strip_prefix("libpod-")?,
    };
    is_container_id(id).then_some(id)
}

fn is_container_id(id: &str) -> bool {
    id.len() == CONTAINER_ID_LEN
        && id
            .bytes()
            .all(|byte| byte.is_ascii_hexdigit() && !byte.is_ascii_uppercase())
}

/// `user@1000.service`: a user's service manager, whose subtree is the user's.
fn is_user_manager(name: &str) -> bool {
    name.strip_prefix("user@")
        .and_then(|rest| rest.strip_suffix(".service"))
        .is_some_and(|uid| !uid.is_empty() && uid.bytes().all(|byte| byte.is_ascii_digit()))
}

/// A name systemd could have given a unit: a known suffix after a non-empty
/// prefix of the characters unit names allow.
pub fn is_unit_name(name: &str) -> bool {
    let Some(suffix) = UNIT_SUFFIXES.iter().find(|suffix| name.ends_with(**suffix)) else {
        return false;
    };
    let prefix = &name[..name.len() - suffix.len()];
    name.len() <= MAX_UNIT_NAME
        && !prefix.is_empty()
        && prefix
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || b":-_.\\@".contains(&byte))
}

#[cfg(test)]
mod tests;
