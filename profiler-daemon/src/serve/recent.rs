//! The last N seconds (or a stored window) of the store, answered for every
//! endpoint that reads it: the profile, the views and the index all ask
//! here, with their format; and the checks every such request shares.

use axum::{
    http::StatusCode,
    response::{IntoResponse, Response},
};

use super::{
    HttpError, ServeState,
    access::Scope,
    params::{self, Limits, ProfileParams, Span},
    scrape::{Format, key::ShareKey},
};
use tokio::sync::watch;

use crate::{kind::ProfileType, procfs::ProcRoot, profile::Window, store::Visible};

/// Largest pid + 1 on 64-bit Linux (PID_MAX_LIMIT), if pid_max cannot be read.
const PID_MAX_LIMIT: u32 = 1 << 22;

/// The last `seconds` seconds, including what was sampled up to a drain
/// that serves a request arriving now, or the window `start` to `end` as
/// stored (nothing drains for it: see [`params::stored_part`]), of the
/// processes `scope` allows (kernel addresses too), written as `format`:
/// shared with every request of the same scope that asks for the same (see
/// [`super::scrape`]). 404 if a
/// requested pid neither runs nor has samples, as far as the caller may know.
pub(super) async fn recent(
    state: &ServeState,
    mut params: ProfileParams,
    scope: Scope,
    format: Format,
) -> Result<Response, HttpError> {
    let visible = scope.visible;
    // /threads reports every kind, whether off-CPU is on or not.
    if format != Format::Threads {
        state.check_type(params.profile_type)?;
    }
    let window = match params.span {
        Span::Last(seconds) => Window::last(seconds, state.scrapes.drained(&state.pipeline).await?),
        Span::Between(window) => {
            params::stored_part(window, state.pipeline.last_stored().map(|stored| stored.time_ms))
        }
    };
    super::cgroup_filter::resolve(state, &mut params.filter, visible).await?;
    for &pid in &params.filter.pids {
        let Err(reason) = process_runs(state.pipeline.proc_root(), pid, visible) else {
            continue;
        };
        // A process that exited within the window still has its samples.
        let store = state.pipeline.store();
        if !store.has_pid(pid, window, visible, params.profile_type).await? {
            return Err(HttpError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "{reason}, and it has no {} samples in {}",
                    params.profile_type.title(),
                    params.span
                ),
            ));
        }
    }
    let key = ShareKey::new(window, params.filter, scope, params.profile_type, format);
    let answer = state.scrapes.answer(state.pipeline.store(), key).await?;
    Ok(answer.into_response())
}

impl ServeState {
    pub(super) fn limits(&self) -> Limits {
        Limits {
            pid_max: read_pid_max(),
            max_seconds: self.max_seconds,
        }
    }

    /// A profile type is answered only when all of its kinds are recorded:
    /// an off-CPU or wall profile without waits would look like threads
    /// never wait.
    pub(super) fn check_type(&self, profile_type: ProfileType) -> Result<(), HttpError> {
        profile_type.available(self.pipeline.kinds()).map_err(|off| {
            HttpError::new(
                StatusCode::CONFLICT,
                format!(
                    "type {profile_type}: its samples are not recorded in this daemon; {}",
                    off.how_to_enable()
                ),
            )
        })
    }
}

/// Ok if `pid` is a running process the caller may see; otherwise why not,
/// for the message. /proc also resolves thread ids, which are not processes.
/// A process the caller may not see is answered as one that does not run.
pub(super) fn process_runs(proc: &ProcRoot, pid: u32, visible: Visible) -> Result<(), String> {
    let not_running = || format!("pid: no process {pid} is running");
    let Ok(status) = proc.read(pid, "status") else {
        return Err(not_running());
    };
    // The kernel's rule, as for the samples: a set-uid program the caller
    // started is not the caller's to see.
    if !visible.allows(crate::collect::readable_by_status(proc, pid, &status)) {
        return Err(not_running());
    }
    let tgid = status
        .lines()
        .find_map(|line| line.strip_prefix("Tgid:"))
        .and_then(|tgid| tgid.trim().parse::<u32>().ok());
    match tgid {
        Some(tgid) if tgid != pid => Err(format!(
            "pid: {pid} is a thread of process {tgid}, not a process (use tid={pid} or pid={tgid})"
        )),
        _ => Ok(()),
    }
}

fn read_pid_max() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(PID_MAX_LIMIT)
}

/// Resolves once the server is shutting down.
pub(super) async fn stopping(mut stopping: watch::Receiver<bool>) {
    if stopping.wait_for(|&stop| stop).await.is_err() && !*stopping.borrow() {
        // No server owns the sender (a router used on its own): never stops.
        std::future::pending::<()>().await;
    }
}
