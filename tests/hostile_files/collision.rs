//! The inode-collision symlink: a user's deleted mapping whose inode
//! number is another file's, and a symlink where its path was.

use std::{os::unix::fs::MetadataExt as _, time::Duration};

use profilerd_tests::{
    artifacts_dir,
    attacker::attacker,
    daemon::go_pprof,
    elf,
    hostile::{Attack, Scratch, Watched},
    serial,
};

use super::{ATTACK_SECONDS, assert_counted, command};

/// The two tmpfs of the inode-collision attack: root's (fresh, so its
/// inode numbers are small and known) holding a 0700 directory with a
/// root-only binary and a directory anyone may write; and the attacker's,
/// where it creates files until one gets the target's inode number.
struct Collision {
    user_fs: Scratch,
    /// Mounted as long as the test runs.
    _root_fs: Scratch,
    secret: std::path::PathBuf,
    public: std::path::PathBuf,
}

fn collision_filesystems() -> Collision {
    let root_fs = Scratch::mount("rootfs", "0755");
    let user_fs = Scratch::mount("userfs", "1777");
    let secret_dir = root_fs.path().join("secret");
    std::fs::create_dir(&secret_dir).expect("the secret directory");
    std::fs::set_permissions(&secret_dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("chmod 0700");
    let secret = secret_dir.join("root_secret");
    std::fs::copy(env!("WORKLOAD_ROOT_SECRET"), &secret).expect("installing the root-only binary");
    let public = root_fs.path().join("public");
    std::fs::create_dir(&public).expect("a public directory");
    std::fs::set_permissions(&public, std::os::unix::fs::PermissionsExt::from_mode(0o1777))
        .expect("chmod 1777");
    Collision {
        user_fs,
        _root_fs: root_fs,
        secret,
        public,
    }
}

/// Issue 14: pointed at a FIFO, the inode-collision symlink hung the watcher
/// and the symbolizer in open().
#[test]
fn an_inode_collision_symlink_to_a_fifo_does_not_hang_the_daemon() {
    let _serial = serial();
    let attacker = attacker();
    let fs = collision_filesystems();
    let dir = attacker.workdir(fs.user_fs.path(), "collide");
    let fifo = fs.public.join("fifo");

    let mut watched = Watched::start(&[]);
    let mut attack = Attack::spawn(
        "inode collision with a FIFO",
        command(
            attacker,
            env!("WORKLOAD_INODE_COLLIDE"),
            &[
                dir.to_str().expect("utf-8"),
                "0",
                ATTACK_SECONDS,
                fifo.to_str().expect("utf-8"),
            ],
        ),
    );
    let trap = attack.wait_for("mapped inode", Duration::from_secs(10));
    eprintln!("attacker: {trap}");
    watched.during_attack(&mut attack, Duration::from_secs(15));
    assert!(
        watched.samples_of(attack.pid(), 30) > 0,
        "the attacker's process was sampled"
    );
    assert_read_its_own_file(&watched, &attack, &trap);
}

/// The daemon read what the attacker really mapped (its own file, which is
/// code but no ELF: a read error, counted, and `[unknown] FILE+0xOFFSET`
/// frames named after that file), not what the path now leads to.
fn assert_read_its_own_file(watched: &Watched, attack: &Attack, trap: &str) {
    let path = trap
        .rsplit_once(" from ")
        .map(|(_, path)| path.trim())
        .unwrap_or_else(|| panic!("the attacker should say which file it mapped: {trap:?}"));
    let name = path.rsplit('/').next().unwrap_or(path);
    let folded = watched
        .daemon
        .get(&format!("/folded?pid={}&seconds=60", attack.pid()))
        .text();
    let own = format!("[unknown] {name} (deleted)+0x");
    assert!(
        folded.contains(&own),
        "the attacker's frames should be {own}..., from the file it mapped; got:\n{folded}"
    );
    assert_counted(
        &watched.metrics(),
        &["profilerd_symbol_source_errors_total"],
        "the attacker's own (non-ELF) file was read and found unreadable",
    );
}

/// Issue 14: the same trick pointed at a root-only binary showed that
/// binary's function names, source path and build id in the user's profile.
#[test]
fn an_inode_collision_symlink_does_not_reveal_a_root_only_binary() {
    let _serial = serial();
    let attacker = attacker();
    let fs = collision_filesystems();
    let dir = attacker.workdir(fs.user_fs.path(), "collide");
    let image = std::fs::read(&fs.secret).expect("the root-only binary");
    // The attacker runs its code where the secret function's is: a daemon
    // that reads the root-only file instead of the mapping names it.
    let offset = elf::function_file_offset(&image, "root_only_secret_function");
    let inode = std::fs::metadata(&fs.secret).expect("the root-only binary").ino();
    let build_id = elf::build_id(&image).expect("the root-only binary has a build id");
    let secret_dir = fs
        .secret
        .parent()
        .expect("a directory")
        .to_str()
        .expect("utf-8")
        .to_owned();
    // Nothing a user could not know without reading the file.
    let forbidden = [
        "root_only_secret_function",
        "root_only_key_derivation",
        "root_secret.c",
        build_id.as_str(),
        secret_dir.as_str(),
    ];

    let mut watched = Watched::start(&[]);
    let mut attack = Attack::spawn(
        "inode collision with a 0700 binary",
        command(
            attacker,
            env!("WORKLOAD_INODE_COLLIDE"),
            &[
                dir.to_str().expect("utf-8"),
                &offset.to_string(),
                ATTACK_SECONDS,
                fs.secret.to_str().expect("utf-8"),
                &inode.to_string(),
            ],
        ),
    );
    let trap = attack.wait_for("mapped inode", Duration::from_secs(10));
    eprintln!("attacker: {trap}");
    watched.during_attack(&mut attack, Duration::from_secs(15));

    let samples = watched.samples_of(attack.pid(), 30);
    assert!(
        samples >= 50,
        "the attacker ran code from the mapping for 15 s: {samples} samples"
    );
    let profile = artifacts_dir().join("inode_collision.pb.gz");
    watched.daemon.fetch_pprof("/pprof?seconds=60", &profile);
    let views = [
        (
            "/pprof (go tool pprof -raw)",
            go_pprof(&["-raw", "-symbolize=none", profile.to_str().expect("utf-8")]),
        ),
        ("/folded", watched.daemon.get("/folded?seconds=60").text()),
        ("/top", watched.daemon.get("/top?seconds=60&limit=100000").text()),
    ];
    let leaks: Vec<String> = views
        .iter()
        .flat_map(|(view, text)| {
            forbidden.iter().filter_map(move |needle| {
                let at = text.find(needle)?;
                let start = text[..at].rfind('\n').map_or(0, |n| n + 1);
                let end = text[at..].find('\n').map_or(text.len(), |n| at + n);
                Some(format!("{view} shows {needle:?}: {}", text[start..end].trim()))
            })
        })
        .collect();
    assert!(
        leaks.is_empty(),
        "the root-only binary leaked into the profiles:\n{}",
        leaks.join("\n")
    );
    assert_read_its_own_file(&watched, &attack, &trap);
}
