//! Unit, cgroup and container filters against what the store holds: a
//! filter that selects nothing the caller may see is a 404 (a unit that
//! never had a sampled task, or only tasks the caller may not see), and
//! container prefixes become whole ids.

use axum::http::StatusCode;

use super::{HttpError, ServeState, params::Quoted};
use crate::{profile::Filter, store::Visible};

/// Checks `filter`'s unit, cgroup and container parts and expands its
/// container prefixes; a no-op for filters without them.
pub(super) async fn resolve(
    state: &ServeState,
    filter: &mut Filter,
    visible: Visible,
) -> Result<(), HttpError> {
    if !filter.by_cgroup() {
        return Ok(());
    }
    let known = state.pipeline.store().cgroups(visible).await?;
    let retention = state.max_seconds;
    let not_found = |what: String| {
        HttpError::new(
            StatusCode::NOT_FOUND,
            format!("{what} has no samples in the last {retention} seconds (the retention)"),
        )
    };
    for unit in &filter.units {
        if !known.iter().any(|cgroup| cgroup.unit.as_deref() == Some(unit)) {
            return Err(not_found(format!("unit: {unit}")));
        }
    }
    for prefix in &filter.cgroups {
        if !known.iter().any(|cgroup| cgroup.is_under(prefix)) {
            return Err(not_found(format!(
                "cgroup: nothing under {}",
                Quoted::new(prefix)
            )));
        }
    }
    let mut ids = Vec::new();
    for prefix in &filter.containers {
        let mut matching: Vec<&str> = known
            .iter()
            .filter_map(|cgroup| cgroup.container_id.as_deref())
            .filter(|id| id.starts_with(prefix.as_str()))
            .collect();
        matching.sort_unstable();
        matching.dedup();
        match matching.as_slice() {
            [] => return Err(not_found(format!("container: {prefix}"))),
            [id] => ids.push((*id).to_owned()),
            several => {
                return Err(HttpError::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "container: {prefix} is the prefix of {} containers' ids; give more of the id",
                        several.len()
                    ),
                ));
            }
        }
    }
    ids.dedup();
    filter.containers = ids;
    Ok(())
}
