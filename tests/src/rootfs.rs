//! The Debian root file system the systemd tests boot: debootstrap'ed once
//! per machine into /var/cache/profilerd-tests and reused (nspawn runs it
//! with a volatile overlay, so it stays pristine).

use std::{
    fs::File,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::Command,
};

/// Where the rootfs and the tests' machine-wide locks live.
pub const CACHE: &str = "/var/cache/profilerd-tests";
/// The Debian release booted (the host's own, so its mirror serves it).
pub const SUITE: &str = "bookworm";

/// /var/cache/profilerd-tests/rootfs: a minimal bookworm with systemd, built
/// once by debootstrap (~35 s to 3 min) and reused.
pub fn cached_rootfs() -> PathBuf {
    let cache = Path::new(CACHE);
    let rootfs = cache.join("rootfs");
    let stamp = rootfs.join(".profilerd-tests-complete");
    if stamp.exists() {
        return rootfs;
    }
    let _lock = FileLock::acquire(&cache.join("rootfs.lock"));
    if stamp.exists() {
        return rootfs;
    }
    let partial = cache.join(format!("rootfs.partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    let mirror = debian_mirror();
    eprintln!(
        "building {} with debootstrap from {mirror} (once)",
        rootfs.display()
    );
    let output = Command::new("debootstrap")
        .args(["--variant=minbase", "--include=systemd,dbus,systemd-sysv", SUITE])
        .arg(&partial)
        .arg(&mirror)
        .output()
        .expect("running debootstrap (package debootstrap; scripts/setup.sh installs it)");
    assert!(
        output.status.success(),
        "debootstrap {SUITE} from {mirror} failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .join("\n")
    );
    std::fs::write(partial.join(".profilerd-tests-complete"), "").expect("marking the rootfs complete");
    let _ = std::fs::remove_dir_all(&rootfs);
    std::fs::rename(&partial, &rootfs).expect("moving the rootfs into place");
    rootfs
}

/// The Debian mirror this machine's apt uses for the suite.
fn debian_mirror() -> String {
    let mut candidates = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/etc/apt/sources.list.d") {
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path.extension().is_some_and(|ext| ext == "sources") {
                candidates.push(std::fs::read_to_string(path).unwrap_or_default());
            }
        }
    }
    // deb822 stanzas: the one whose Suites has exactly the suite.
    for text in &candidates {
        for stanza in text.split("\n\n") {
            let field = |name: &str| {
                stanza
                    .lines()
                    .find_map(|line| line.strip_prefix(name))
                    .map(str::trim)
                    .unwrap_or("")
            };
            if field("Suites:").split_whitespace().any(|suite| suite == SUITE)
                && let Some(uri) = field("URIs:").split_whitespace().next()
            {
                return uri.to_owned();
            }
        }
    }
    // One-line format: deb URI SUITE COMPONENTS...
    let list = std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default();
    for line in list.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"deb") && words.get(2) == Some(&SUITE) {
            return words[1].to_owned();
        }
    }
    "http://deb.debian.org/debian".to_owned()
}

/// An exclusive flock(2), released when dropped (the descriptor closes).
pub struct FileLock {
    _file: File,
}

impl FileLock {
    pub fn acquire(path: &Path) -> Self {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|err| panic!("creating {}: {err}", dir.display()));
        }
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .unwrap_or_else(|err| panic!("opening {}: {err}", path.display()));
        const LOCK_EX: i32 = 2;
        // SAFETY: flock(2) on a descriptor we own.
        let rc = unsafe { flock(file.as_raw_fd(), LOCK_EX) };
        assert_eq!(rc, 0, "locking {}", path.display());
        Self { _file: file }
    }
}

unsafe extern "C" {
    fn flock(fd: i32, operation: i32) -> i32;
}
