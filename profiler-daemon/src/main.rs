//! `profilerd`: the daemon, `record` and `check-config` (see
//! [`profilerd::entry`]).

use std::process::ExitCode;

/// glibc malloc arenas the process may use. By default glibc gives each
/// new thread an arena of its own, up to 8 per CPU: the scrape computations
/// and connection tasks that run on tokio's blocking threads (a new thread
/// whenever the others are busy) then leave freed memory scattered over a
/// dozen arenas, where it stays mapped beside the store's long-lived
/// buckets. Measured under 150 scraping clients, that held 50-100 MB more
/// than an unscraped daemon; with 2 arenas (one per async worker) the
/// difference stays within the scrape memory budget. An operator's
/// `MALLOC_ARENA_MAX` is left as given.
#[cfg(target_env = "gnu")]
const MALLOC_ARENAS: libc::c_int = 2;

#[cfg(target_env = "gnu")]
fn limit_malloc_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    // SAFETY: called first thing in main, before this process starts any
    // thread, so no other thread can be allocating while glibc changes the
    // setting; mallopt takes no pointer. A failure (0) leaves glibc's default.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    }
}

#[cfg(not(target_env = "gnu"))]
fn limit_malloc_arenas() {}

fn main() -> ExitCode {
    limit_malloc_arenas();
    profilerd::entry::run()
}
