use super::*;

fn queued(start_ms: u64, bytes: usize) -> Queued {
    Queued {
        window: Window {
            start_ms,
            end_ms: start_ms + 15_000,
        },
        part: 0,
        samples: start_ms / 1000,
        message: Bytes::from(vec![7; bytes]),
    }
}

/// A spool directory in a parent of ours alone (as the spool requires).
fn temp_dir(name: &str) -> PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    let parent = std::env::temp_dir().join(format!("profilerd-spool-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&parent);
    fs::DirBuilder::new().mode(0o700).create(&parent).unwrap();
    parent.join("spool")
}

#[test]
fn the_oldest_windows_make_room() {
    let (mut spool, dropped) = Spool::open(250, None).unwrap();
    assert!(dropped.is_empty());
    for start in [1_000, 2_000] {
        assert!(spool.push(queued(start, 100)).is_empty());
    }
    let dropped = spool.push(queued(3_000, 100));
    assert_eq!(
        dropped.iter().map(|q| q.window.start_ms).collect::<Vec<_>>(),
        vec![1_000]
    );
    assert_eq!((spool.len(), spool.bytes()), (2, 200));
    assert_eq!(spool.oldest().unwrap().window.start_ms, 2_000);
    let too_large = spool.push(queued(4_000, 251));
    assert_eq!(
        too_large.len(),
        1,
        "a window larger than the bound is given up alone"
    );
    assert_eq!(spool.len(), 2);
    assert_eq!(spool.pop().unwrap().window.start_ms, 2_000);
    assert_eq!(spool.bytes(), 100);
}

#[test]
fn windows_on_disk_outlive_the_spool_until_sent() {
    let dir = temp_dir("restart");
    {
        let (mut spool, _) = Spool::open(1000, Some(dir.clone())).unwrap();
        spool.push(queued(2_000, 10));
        spool.push(queued(1_000, 10));
        spool.push(queued(3_000, 10));
        assert_eq!(
            spool.pop().unwrap().window.start_ms,
            2_000,
            "sent: gone from disk too"
        );
    }
    fs::write(dir.join(".5000-6000-0-1.pb.partial"), b"half").unwrap();
    fs::write(dir.join("notes.txt"), b"?").unwrap();
    let (spool, dropped) = Spool::open(1000, Some(dir.clone())).unwrap();
    assert!(dropped.is_empty());
    let mut reopened = spool;
    let first = reopened.pop().unwrap();
    assert_eq!(
        (first.window.start_ms, first.samples, first.message.len()),
        (1_000, 1, 10)
    );
    assert_eq!(reopened.pop().unwrap().window.start_ms, 3_000);
    assert!(reopened.is_empty());
    let left: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert!(
        left.is_empty(),
        "expected every file sent or removed, found {left:?}"
    );
    let mode = fs::metadata(&dir).unwrap().permissions();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o700);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_smaller_bound_after_a_restart_keeps_the_newest() {
    let dir = temp_dir("smaller");
    {
        let (mut spool, _) = Spool::open(1000, Some(dir.clone())).unwrap();
        for start in [1_000, 2_000, 3_000] {
            spool.push(queued(start, 100));
        }
    }
    let (spool, dropped) = Spool::open(150, Some(dir.clone())).unwrap();
    assert_eq!(
        dropped.iter().map(|q| q.window.start_ms).collect::<Vec<_>>(),
        vec![1_000, 2_000]
    );
    assert_eq!(spool.oldest().unwrap().window.start_ms, 3_000);
    assert_eq!(
        fs::read_dir(&dir).unwrap().count(),
        1,
        "dropped windows leave the disk too"
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn names_parse_strictly() {
    assert_eq!(
        parse_name("1-2-0-3.pb"),
        Some((
            Window {
                start_ms: 1,
                end_ms: 2
            },
            0,
            3
        ))
    );
    for bad in [
        "1-2-3.pb",
        "1-2-0-3-4.pb",
        "2-1-0-3.pb",
        "a-2-0-3.pb",
        "1-2-0-3.pbx",
        ".1-2-0-3.pb.partial",
        "1-2-4294967296-3.pb",
    ] {
        assert_eq!(parse_name(bad), None, "{bad}");
    }
}

#[test]
fn the_requests_of_one_window_are_kept_apart_and_in_order() {
    let dir = temp_dir("parts");
    {
        let (mut spool, _) = Spool::open(1000, Some(dir.clone())).unwrap();
        for part in [0, 1, 2] {
            spool.push(Queued {
                part,
                samples: u64::from(part) + 10,
                ..queued(1_000, 10)
            });
        }
    }
    let (mut spool, _) = Spool::open(1000, Some(dir.clone())).unwrap();
    let parts: Vec<_> = std::iter::from_fn(|| spool.pop())
        .map(|q| (q.part, q.samples))
        .collect();
    assert_eq!(
        parts,
        vec![(0, 10), (1, 11), (2, 12)],
        "every request of the window, in order"
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_directory_others_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("shared");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    let err = Spool::open(1000, Some(dir.join("target")))
        .err()
        .expect("a world-writable spool directory must be refused");
    assert!(err.to_string().contains("writable by it alone"), "{err}");
    fs::remove_dir_all(&dir).unwrap();
}
