use std::os::unix::fs::MetadataExt;

use super::*;

/// A directory tree to walk, removed when dropped.
struct Tree(PathBuf);

impl Tree {
    fn new(name: &str) -> Self {
        // tmpfs: its directory listings carry the inode numbers stat gives,
        // as cgroupfs's do (overlay file systems' need not).
        let dir = Path::new("/dev/shm").join(format!("profilerd-cgroup-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the test tree");
        Self(dir)
    }

    fn mkdir(&self, relative: &str) -> u64 {
        let path = self.0.join(relative);
        std::fs::create_dir_all(&path).unwrap_or_else(|err| panic!("creating {}: {err}", path.display()));
        std::fs::metadata(&path).expect("stat").ino()
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_walk_names_this_process_cgroup_as_proc_does() {
    let root = v2_root(&ProcRoot::default()).expect("a cgroup v2 hierarchy");
    let Some((id, path)) = read_process_cgroup(&ProcRoot::default(), std::process::id(), &root) else {
        panic!("reading our own cgroup under {}", root.display());
    };
    let mut resolver = CgroupResolver::new(ProcRoot::default(), Some(&root));
    let named = resolver.resolve([(id, 0)]);
    let cgroup = named
        .get(&id)
        .unwrap_or_else(|| panic!("cgroup {id} ({path}) not found by the walk: {:?}", resolver.stats));
    assert_eq!(&*cgroup.path, path);
    assert_eq!(resolver.stats.walks, 1);
    // Known now: no second walk.
    assert!(resolver.resolve([(id, 0)]).contains_key(&id));
    assert_eq!(resolver.stats.walks, 1);
}

#[test]
fn a_learned_cgroup_stays_named_after_removal() {
    let tree = Tree::new("removed");
    let id = tree.mkdir("system.slice/run-r1.scope");
    let mut resolver = CgroupResolver::new(ProcRoot::default(), Some(&tree.0));
    resolver.learn(id, "/system.slice/run-r1.scope");
    std::fs::remove_dir(tree.0.join("system.slice/run-r1.scope")).expect("removing the scope");
    let named = resolver.resolve([(id, 0)]);
    assert_eq!(
        named.get(&id).and_then(|cgroup| cgroup.unit.as_deref()),
        Some("run-r1.scope")
    );
    assert_eq!(resolver.stats.walks, 0, "a known id needs no walk");
}

#[test]
fn walks_are_bounded_in_depth_and_rate() {
    let tree = Tree::new("deep");
    let shallow = tree.mkdir("a.slice/b.service");
    let deep_path: String = (0..MAX_DEPTH + 4).map(|level| format!("d{level}/")).collect();
    let deep = tree.mkdir(&deep_path);
    let mut resolver = CgroupResolver::new(ProcRoot::default(), Some(&tree.0));
    let named = resolver.resolve([(shallow, 0), (deep, 0)]);
    assert_eq!(
        named.get(&shallow).map(|cgroup| &*cgroup.path),
        Some("/a.slice/b.service")
    );
    assert!(
        !named.contains_key(&deep),
        "a cgroup below the depth bound is not named"
    );
    assert_eq!(resolver.stats.unresolved, 1);
    assert!(resolver.stats.walks_truncated >= 1, "{:?}", resolver.stats);
    // A new cgroup right after: no walk before the interval has passed.
    let fresh = tree.mkdir("c.service");
    assert!(resolver.resolve([(fresh, 0)]).is_empty());
    assert_eq!(resolver.stats.walks, 1);
}

#[test]
fn names_stay_within_the_memory_bound() {
    let mut resolver = CgroupResolver::new(ProcRoot::default(), None);
    let long = format!("/user.slice/{}", "x".repeat(MAX_PATH_BYTES - 20));
    let entries = MAX_BYTES / (ENTRY_BYTES + long.len()) * 2;
    for id in 0..entries as u64 {
        resolver.learn(id, &format!("{long}{id}"));
        assert!(
            resolver.bytes() <= MAX_BYTES,
            "after {id} entries: {} bytes",
            resolver.bytes()
        );
    }
    assert!(resolver.stats.evicted > 0);
    // The newest is kept.
    let last = entries as u64 - 1;
    assert!(resolver.resolve([(last, 0)]).contains_key(&last));
}

#[test]
fn the_walk_finds_a_new_real_cgroup_by_its_id() {
    let root = v2_root(&ProcRoot::default()).expect("a cgroup v2 hierarchy");
    let parent = root.join(format!("profilerd-resolver-test-{}", std::process::id()));
    let child = parent.join("b.service");
    std::fs::create_dir_all(&child).unwrap_or_else(|err| panic!("creating {}: {err}", child.display()));
    let id = std::fs::metadata(&child).expect("stat").ino();
    let named = CgroupResolver::new(ProcRoot::default(), Some(&root)).resolve([(id, 0)]);
    let _ = std::fs::remove_dir(&child);
    let _ = std::fs::remove_dir(&parent);
    let cgroup = named.get(&id).expect("the new cgroup found by the walk");
    assert!(cgroup.path.ends_with("/b.service"), "{}", cgroup.path);
    assert_eq!(cgroup.unit.as_deref(), Some("b.service"));
}

#[test]
fn a_process_that_moved_is_named_from_its_proc_entry_without_a_walk() {
    let root = v2_root(&ProcRoot::default()).expect("a cgroup v2 hierarchy");
    let me = std::process::id();
    let (id, path) = read_process_cgroup(&ProcRoot::default(), me, &root).expect("our own cgroup");
    let mut resolver = CgroupResolver::new(ProcRoot::default(), Some(&root));
    let named = resolver.resolve([(id, me)]);
    assert_eq!(named.get(&id).map(|cgroup| &*cgroup.path), Some(&*path));
    assert_eq!(resolver.stats.walks, 0, "named from /proc/{me}/cgroup");
    // A pid in another cgroup does not name this id: the walk does.
    let mut resolver = CgroupResolver::new(ProcRoot::default(), Some(&root));
    assert!(resolver.resolve([(u64::MAX, me)]).is_empty());
    assert_eq!(resolver.stats.walks, 1);
}

#[test]
fn a_process_cgroup_is_read_through_the_proc_root() {
    use crate::procfs::fixture::FixtureProc;
    let fixture = FixtureProc::new("cgroup");
    let hierarchy = fixture.path().join("hierarchy");
    std::fs::create_dir_all(hierarchy.join("system.slice/app.service")).expect("a cgroup directory");
    fixture.write(10, "cgroup", "0::/system.slice/app.service\n");
    fixture.write(11, "cgroup", "0::/../../outside.scope\n");
    fixture.write(12, "cgroup", "1:name=systemd:/old\n");
    let proc = fixture.root();
    let id = std::fs::metadata(hierarchy.join("system.slice/app.service"))
        .expect("the directory")
        .ino();
    assert_eq!(
        read_process_cgroup(&proc, 10, &hierarchy),
        Some((id, "/system.slice/app.service".to_owned()))
    );
    assert_eq!(
        read_process_cgroup(&proc, 11, &hierarchy),
        None,
        "outside our namespace"
    );
    assert_eq!(read_process_cgroup(&proc, 12, &hierarchy), None, "v1 only");
    assert_eq!(read_process_cgroup(&proc, 13, &hierarchy), None, "absent");
    let unit = Cgroup::from_path("/system.slice/app.service");
    assert_eq!(unit.unit.as_deref(), Some("app.service"));
}
