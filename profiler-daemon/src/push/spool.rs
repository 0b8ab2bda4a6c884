//! A target's windows not yet accepted, oldest first, bounded in bytes; with
//! a directory, each also on disk until accepted, so a restart sends what
//! the last run could not.
//!
//! On disk a request is one file, `START-END-PART-SAMPLES.pb` (its window
//! in Unix ms, its place among the window's requests, its sample count),
//! holding the request message. Files are written
//! to a temporary name and renamed, so a crash leaves whole files or none.

use std::{
    collections::VecDeque,
    fs,
    io::Write,
    os::unix::fs::{DirBuilderExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use bytes::Bytes;

use crate::profile::Window;

/// A request of a window waiting to be pushed (a window is one request,
/// or for Pyroscope one per series).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queued {
    pub window: Window,
    /// Its place among its window's requests.
    pub part: u32,
    pub samples: u64,
    pub message: Bytes,
}

impl Queued {
    fn file_name(&self) -> String {
        format!(
            "{}-{}-{}-{}.pb",
            self.window.start_ms, self.window.end_ms, self.part, self.samples
        )
    }
}

/// What made room: the windows given up, oldest first.
pub type Dropped = Vec<Queued>;

pub struct Spool {
    queue: VecDeque<Queued>,
    /// Of the queue and of the window taken to be sent, if any.
    bytes: usize,
    max_bytes: usize,
    dir: Option<PathBuf>,
}

impl Spool {
    /// A spool of at most `max_bytes` of messages; with `dir` (created
    /// 0700 if missing: windows reveal code and process names), the files
    /// left there are queued first. Unreadable files are logged and removed.
    pub fn open(max_bytes: usize, dir: Option<PathBuf>) -> std::io::Result<(Self, Dropped)> {
        let mut spool = Spool {
            queue: VecDeque::new(),
            bytes: 0,
            max_bytes,
            dir,
        };
        let mut dropped = Vec::new();
        if let Some(dir) = spool.dir.clone() {
            fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
            // Its parent too (the configured spool directory): whoever can
            // write there can swap this one.
            if let Some(parent) = dir.parent() {
                check_owned(parent)?;
            }
            check_owned(&dir)?;
            for queued in load(&dir, max_bytes)? {
                dropped.extend(spool.push_in_memory(queued));
            }
        }
        Ok((spool, dropped))
    }

    /// Queues `queued` (on disk too, with a directory); returns the oldest
    /// windows given up to stay within the bound (possibly this one, if it
    /// alone is larger than the bound).
    pub fn push(&mut self, queued: Queued) -> Dropped {
        if let Some(dir) = &self.dir
            && queued.message.len() <= self.max_bytes
            && let Err(err) = write(dir, &queued)
        {
            // Kept in memory all the same: only a restart would lose it.
            tracing::warn!(
                "push spool: writing {} in {}: {err}",
                queued.file_name(),
                dir.display()
            );
        }
        self.push_in_memory(queued)
    }

    fn push_in_memory(&mut self, queued: Queued) -> Dropped {
        if queued.message.len() > self.max_bytes {
            self.remove_file(&queued);
            return vec![queued];
        }
        self.bytes += queued.message.len();
        self.queue.push_back(queued);
        let mut dropped = Vec::new();
        // Queued windows only: one being sent is not given up mid-send.
        while self.bytes > self.max_bytes {
            let Some(oldest) = self.queue.pop_front() else {
                break;
            };
            self.forget(&oldest);
            dropped.push(oldest);
        }
        dropped
    }

    pub fn oldest(&self) -> Option<&Queued> {
        self.queue.front()
    }

    /// Takes the oldest window to send it: out of the queue, so that making
    /// room never drops it, but still counted against the bound and still
    /// on disk until [`Spool::done`].
    pub fn take(&mut self) -> Option<Queued> {
        self.queue.pop_front()
    }

    /// A taken window to be sent again later: oldest again.
    pub fn put_back(&mut self, queued: Queued) {
        self.queue.push_front(queued);
    }

    /// A taken window accepted, or refused for good.
    pub fn done(&mut self, queued: &Queued) {
        self.forget(queued);
    }

    /// Takes the oldest window and forgets it.
    pub fn pop(&mut self) -> Option<Queued> {
        let oldest = self.take()?;
        self.done(&oldest);
        Some(oldest)
    }

    fn forget(&mut self, queued: &Queued) {
        self.bytes -= queued.message.len();
        self.remove_file(queued);
    }

    fn remove_file(&self, queued: &Queued) {
        if let Some(dir) = &self.dir {
            let path = dir.join(queued.file_name());
            if let Err(err) = fs::remove_file(&path)
                && err.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!("push spool: removing {}: {err}", path.display());
            }
        }
    }

    /// Windows queued, not counting one taken.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn on_disk(&self) -> bool {
        self.dir.is_some()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

fn write(dir: &Path, queued: &Queued) -> std::io::Result<()> {
    let name = queued.file_name();
    let partial = dir.join(format!(".{name}.partial"));
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&partial)?;
    file.write_all(&queued.message)?;
    file.sync_data()?;
    fs::rename(&partial, dir.join(name))
}

/// The directory must be ours alone: whoever else could write in it could
/// plant requests we would send as ours, or a link where we write.
fn check_owned(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = fs::symlink_metadata(dir)?;
    let euid = nix::unistd::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != euid || meta.mode() & 0o022 != 0 {
        return Err(std::io::Error::other(format!(
            "{} must be a directory owned by uid {euid} and writable by it alone",
            dir.display()
        )));
    }
    Ok(())
}

/// The windows a previous run left, oldest first; none larger than the
/// bound is read.
fn load(dir: &Path, max_bytes: usize) -> std::io::Result<Vec<Queued>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name();
        let parsed = name.to_str().and_then(parse_name);
        // Not following links; and nothing larger than the spool's bound.
        let is_file = entry
            .metadata()
            .is_ok_and(|meta| meta.is_file() && meta.len() <= max_bytes as u64);
        match parsed {
            Some((window, part, samples)) if is_file => match fs::read(&path) {
                Ok(message) => found.push(Queued {
                    window,
                    part,
                    samples,
                    message: Bytes::from(message),
                }),
                Err(err) => tracing::warn!("push spool: reading {}: {err}", path.display()),
            },
            _ => {
                // Ours only: a partial write, or something that is not a window.
                tracing::warn!("push spool: removing {}, not a queued window", path.display());
                let _ = if is_file { fs::remove_file(&path) } else { Ok(()) };
            }
        }
    }
    found.sort_by_key(|queued| (queued.window.start_ms, queued.window.end_ms, queued.part));
    Ok(found)
}

fn parse_name(name: &str) -> Option<(Window, u32, u64)> {
    let stem = name.strip_suffix(".pb")?;
    let mut parts = stem.split('-').map(|part| part.parse::<u64>().ok());
    let (start_ms, end_ms) = (parts.next()??, parts.next()??);
    let (part, samples) = (u32::try_from(parts.next()??).ok()?, parts.next()??);
    (parts.next().is_none() && start_ms < end_ms).then_some((Window { start_ms, end_ms }, part, samples))
}

#[cfg(test)]
mod tests;
