//! Issue 27, perf maps of hostile owners. `/tmp/perf-PID.map` lives in a
//! directory every user writes, and the daemon reading it is root. Node
//! processes of the unprivileged test user (their JIT code in anonymous
//! executable memory, no perf map of their own) are given, each, a map the
//! user (or root, for the user) put there: their own (used), root's
//! private one, another user's, a symbolic link (to root's file, which
//! anyone may read: links are not followed whatever they lead to), a
//! FIFO, a 4 GiB sparse file, and one of absurd lines and a 1 MiB name;
//! then the user's own is truncated and rewritten.
//! The daemon answers as usual, names what the user's own files say, and
//! shows nothing of a file the user could not read, to anyone (the test
//! asks as root, who sees every process).

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use profilerd_tests::{
    artifacts_dir,
    attacker::{Killed, attacker},
    daemon::{Daemon, go_pprof, metric, parse_raw},
    serial,
};

/// A busy loop that V8 compiles (on-stack replacement) into JIT code.
const BUSY: &str = "let x = 0; for (;;) { for (let i = 0; i < 1e6; i++) x = (x * 31 + i) | 0; }";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Map {
    /// The user's own file: its names are shown.
    Own,
    /// Root's, mode 0600: the user could not read it.
    RootOnly,
    /// Another user's (nobody's), mode 0644.
    OtherUser,
    /// The user's symbolic link to a file of root's (readable by anyone).
    Symlink,
    Fifo,
    /// 4 GiB of nothing, the user's.
    Sparse,
    /// The user's: absurd lines and a 1 MiB name, then one good line.
    Absurd,
}

const MAPS: [Map; 7] = [
    Map::Own,
    Map::RootOnly,
    Map::OtherUser,
    Map::Symlink,
    Map::Fifo,
    Map::Sparse,
    Map::Absurd,
];

impl Map {
    /// The name its lines give the JIT code.
    fn name(self) -> String {
        format!("hostile_map_{self:?}_name")
    }

    /// Whether the profile may show its name.
    fn shown(self) -> bool {
        matches!(self, Map::Own | Map::Absurd)
    }
}

/// The anonymous executable ranges of `pid` (its JIT code), as perf map
/// lines naming them `name`.
fn lines_naming_jit_code(pid: u32, name: &str) -> String {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("the node process's maps");
    let mut lines = String::new();
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != 5 || !fields[1].contains('x') {
            continue;
        }
        let (start, end) = fields[0].split_once('-').expect("a range");
        let (start, end) = (
            u64::from_str_radix(start, 16).unwrap(),
            u64::from_str_radix(end, 16).unwrap(),
        );
        lines.push_str(&format!("{start:x} {:x} {name}\n", end - start));
    }
    assert!(
        !lines.is_empty(),
        "node {pid} should have JIT code by now:\n{maps}"
    );
    lines
}

fn chown(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))
        .unwrap_or_else(|err| panic!("chown {}: {err}", path.display()));
}

/// Puts `map` at /tmp/perf-PID.map for the user's node `pid`.
fn plant(map: Map, pid: u32, secret: &Path) -> PathBuf {
    let user = attacker();
    let path = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    let _ = std::fs::remove_file(&path);
    let named = lines_naming_jit_code(pid, &map.name());
    // Made whole under another name, then renamed into place: the daemon
    // never sees it half made (root's and 0644 before its chown, say).
    let partial = PathBuf::from(format!("/tmp/perf-{pid}.map.partial"));
    let write = |text: &str, mode: u32, uid: u32, gid: u32| {
        std::fs::write(&partial, text).expect("writing the map");
        std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(mode)).expect("chmod");
        chown(&partial, uid, gid);
        std::fs::rename(&partial, &path).expect("renaming the map into place");
    };
    match map {
        Map::Own => write(&named, 0o644, user.uid, user.gid),
        Map::RootOnly => write(&named, 0o600, 0, 0),
        Map::OtherUser => write(&named, 0o644, 65534, 65534),
        Map::Symlink => {
            // Root's and readable by anyone: what a map followed through the
            // link would pass the owner check with.
            std::fs::write(secret, &named).expect("writing root's file");
            std::fs::set_permissions(secret, std::fs::Permissions::from_mode(0o644)).expect("chmod");
            std::os::unix::fs::symlink(secret, &partial).expect("the symbolic link");
            chown(&partial, user.uid, user.gid);
            std::fs::rename(&partial, &path).expect("renaming the link into place");
        }
        Map::Fifo => {
            let status = user
                .command("mkfifo")
                .arg(&path)
                .status()
                .expect("running mkfifo as the user");
            assert!(status.success(), "the user's mkfifo: {status}");
        }
        Map::Sparse => {
            let file = std::fs::File::create(&path).expect("the sparse file");
            file.set_len(4 << 30).expect("4 GiB");
            chown(&path, user.uid, user.gid);
        }
        Map::Absurd => {
            let mut text = String::from("zz 10 bad\n1000 0 empty\nffffffffffffff00 1000 wraps\n");
            text.push_str(&format!("1000 10 {}\n", "n".repeat(1 << 20)));
            text.push_str(&named);
            write(&text, 0o644, user.uid, user.gid);
        }
    }
    path
}

#[test]
fn hostile_perf_maps_harm_nothing_and_show_only_what_the_user_could_read() {
    let _serial = serial();
    let user = attacker();
    let daemon = Daemon::start(&[]);
    let nodes: Vec<(Map, Killed)> = MAPS
        .iter()
        .map(|&map| {
            let child = user
                .command("node")
                .args(["-e", BUSY])
                .current_dir("/tmp")
                .spawn()
                .expect("starting node as the unprivileged user");
            (map, Killed(child))
        })
        .collect();
    // Compiled into JIT code (on-stack replacement) within a second or so.
    std::thread::sleep(Duration::from_secs(2));
    let secret = PathBuf::from(format!("/root/profilerd-secret-{}.map", std::process::id()));
    let planted: Vec<PathBuf> = nodes
        .iter()
        .map(|(map, node)| plant(*map, node.0.id(), &secret))
        .collect();
    let pids: Vec<String> = nodes.iter().map(|(_, node)| node.0.id().to_string()).collect();
    let path = format!("/debug/pprof/profile?seconds=5&pid={}", pids.join(","));
    let asked = Instant::now();
    let file = artifacts_dir().join("jit-hostile.pb.gz");
    daemon.fetch_pprof(&path, &file);
    assert!(
        asked.elapsed() < Duration::from_secs(30),
        "the daemon should answer as usual beside hostile maps, took {:?}",
        asked.elapsed()
    );
    let samples = parse_raw(&go_pprof(&["-raw", &file.display().to_string()]));
    for (map, node) in &nodes {
        let pid = node.0.id().to_string();
        let mine: Vec<_> = samples
            .iter()
            .filter(|sample| sample.label("pid") == pid)
            .collect();
        let named = mine
            .iter()
            .filter(|sample| sample.functions.iter().any(|function| *function == map.name()))
            .count();
        let jit = mine
            .iter()
            .filter(|sample| sample.functions.iter().any(|function| function == "[jit]"))
            .count();
        eprintln!(
            "{map:?} (node {pid}): {} samples, {named} named from the map, {jit} as [jit]",
            mine.len()
        );
        assert!(!mine.is_empty(), "node {pid} ({map:?}) should be sampled");
        if map.shown() {
            assert!(
                named > 0,
                "the user's own map ({map:?}) names the user's JIT code"
            );
        } else {
            assert_eq!(
                named, 0,
                "{map:?}: nothing of a map the user could not read may show"
            );
            assert!(jit > 0, "{map:?}: the JIT code is shown as [jit]");
        }
    }
    let too_long = samples
        .iter()
        .flat_map(|sample| &sample.functions)
        .any(|function| function.len() > 8192);
    assert!(!too_long, "a 1 MiB name must not reach a profile");
    let metrics = daemon.get("/metrics").text();
    assert!(
        metric(&metrics, "profilerd_perf_maps_refused_total") >= 4,
        "root's, another user's, the link and the FIFO are refused (and counted)"
    );
    assert!(metric(&metrics, "profilerd_perf_map_bad_lines_total") >= 3);
    assert_eq!(
        daemon.get("/threads?seconds=5").status,
        200,
        "the daemon is unharmed"
    );

    // The user's own map truncated and written anew (a runtime restarting
    // its map, or a user playing): the old names go with it.
    let (_, own) = nodes
        .iter()
        .find(|(map, _)| *map == Map::Own)
        .expect("the Own node");
    let own_pid = own.0.id();
    let rewritten = "hostile_map_rewritten_name";
    std::fs::write(
        format!("/tmp/perf-{own_pid}.map"),
        lines_naming_jit_code(own_pid, rewritten),
    )
    .expect("rewriting the user's map");
    // Looked at again every 5 s while all its JIT code is named.
    std::thread::sleep(Duration::from_secs(6));
    let file = artifacts_dir().join("jit-hostile-rewritten.pb.gz");
    daemon.fetch_pprof(&format!("/debug/pprof/profile?seconds=3&pid={own_pid}"), &file);
    let functions: Vec<String> = parse_raw(&go_pprof(&["-raw", &file.display().to_string()]))
        .into_iter()
        .flat_map(|sample| sample.functions)
        .collect();
    assert!(
        functions.iter().any(|function| function == rewritten)
            && !functions.iter().any(|function| *function == Map::Own.name()),
        "after the map was truncated and rewritten, its new names and only those: {functions:?}"
    );
    drop(nodes);
    for path in planted {
        let _ = std::fs::remove_file(path);
    }
    let _ = std::fs::remove_file(&secret);
}
