use super::*;
use crate::collect::parse_maps_line;

/// No process has this pid: map_files cannot be opened, so the path is.
const NO_SUCH_PID: u32 = u32::MAX;

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("profilerd-mapped-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn line_for(path: &str, dev: u64, inode: u64) -> MapsLine<'_> {
    MapsLine {
        start: 0x1000,
        end: 0x2000,
        executable: true,
        offset: 0,
        dev,
        inode,
        path,
    }
}

#[test]
fn by_path_a_symlink_a_fifo_and_another_inode_are_refused() {
    let dir = scratch("refusals");
    let target = dir.join("target");
    std::fs::write(&target, b"\x7fELF not really").expect("target file");
    let meta = std::fs::metadata(&target).expect("stat");
    let files = OpenFiles::new(16);

    let link = dir.join("link (deleted)");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let link_text = link.to_str().expect("utf-8");
    assert!(
        files
            .open(
                &ProcRoot::default(),
                NO_SUCH_PID,
                &line_for(link_text, meta.dev(), meta.ino())
            )
            .is_none()
    );
    let plain_link = dir.join("link");
    std::os::unix::fs::symlink(&target, &plain_link).expect("symlink");
    let plain_text = plain_link.to_str().expect("utf-8");
    assert!(
        files
            .open(
                &ProcRoot::default(),
                NO_SUCH_PID,
                &line_for(plain_text, meta.dev(), meta.ino())
            )
            .is_none(),
        "a symlink must not be followed, even to the right inode"
    );
    assert_eq!(files.stats.refused(Refusal::OpenFailed), 2);

    let fifo = dir.join("fifo");
    let fifo_text = fifo.to_str().expect("utf-8");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let fifo_meta = std::fs::metadata(&fifo).expect("stat fifo");
    let started = std::time::Instant::now();
    assert!(
        files
            .open(
                &ProcRoot::default(),
                NO_SUCH_PID,
                &line_for(fifo_text, fifo_meta.dev(), fifo_meta.ino())
            )
            .is_none()
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(1),
        "opening a FIFO must not block"
    );
    assert_eq!(files.stats.refused(Refusal::NotRegular), 1);

    let target_text = target.to_str().expect("utf-8");
    assert!(
        files
            .open(
                &ProcRoot::default(),
                NO_SUCH_PID,
                &line_for(target_text, meta.dev(), meta.ino() + 1)
            )
            .is_none()
    );
    assert!(
        files
            .open(
                &ProcRoot::default(),
                NO_SUCH_PID,
                &line_for(target_text, meta.dev() + 1, meta.ino())
            )
            .is_none()
    );
    assert_eq!(files.stats.refused(Refusal::IdentityMismatch), 2);

    let file = files
        .open(
            &ProcRoot::default(),
            NO_SUCH_PID,
            &line_for(target_text, meta.dev(), meta.ino()),
        )
        .expect("the right regular file opens by path");
    assert_eq!((file.key.dev, file.key.inode), (meta.dev(), meta.ino()));
    assert_eq!(files.stats.open.load(Ordering::Relaxed), 1);
    drop(file);
    assert_eq!(
        files.stats.open.load(Ordering::Relaxed),
        0,
        "the last holder closes it"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn descriptors_stay_within_the_bound_and_evicted_ones_reopen_while_mapped() {
    let dir = scratch("bound");
    let mut mapped = Vec::new();
    for index in 0..40 {
        let path = dir.join(format!("lib{index}.so"));
        std::fs::write(&path, vec![0xc3u8; 4096]).expect("file");
        let file = File::open(&path).expect("open");
        // SAFETY: a fresh private read-only mapping of a 4 KiB file; it is
        // unmapped below and never dereferenced.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        assert_ne!(address, libc::MAP_FAILED, "mmap {}", path.display());
        mapped.push((address, path));
    }
    let maps = std::fs::read_to_string("/proc/self/maps").expect("our maps");
    let lines: Vec<_> = maps
        .lines()
        .filter_map(parse_maps_line)
        .filter(|line| line.path.starts_with(dir.to_str().expect("utf-8")))
        .collect();
    assert_eq!(lines.len(), 40, "every mapping is listed");
    let files = OpenFiles::new(16);
    let held: Vec<_> = lines
        .iter()
        .map(|line| {
            files
                .open(&ProcRoot::default(), std::process::id(), line)
                .expect("our own mapping opens")
        })
        .collect();
    let open = files.stats.open.load(Ordering::Relaxed);
    assert!(open <= 16, "{open} descriptors held past the bound of 16");
    assert!(files.stats.evicted.load(Ordering::Relaxed) >= 24);
    // The first ones were closed; our process still maps them: they reopen.
    let reopened = held[0]
        .descriptor()
        .expect("an evicted file reopens through its mapping");
    drop(reopened);
    assert_eq!(files.stats.reopened.load(Ordering::Relaxed), 1);
    for (address, _) in mapped {
        // SAFETY: mapped above with this length, not used since.
        unsafe { libc::munmap(address, 4096) };
    }
    // Unmapped: an evicted file can no longer be reopened.
    assert!(
        held[1].descriptor().is_none(),
        "no mapping is left to reopen it through"
    );
    drop(held);
    assert_eq!(files.stats.open.load(Ordering::Relaxed), 0);
    let _ = std::fs::remove_dir_all(&dir);
}
