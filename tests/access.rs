//! Issue 15, access control: an unprivileged local user sees only their own
//! processes, root and the access group see every one. The user's requests
//! are made by curl running as that user, so the daemon identifies them from
//! the kernel as it would any client.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use profilerd_tests::{
    Workload,
    allocations::{AllocSites, MIB, Options},
    attacker::{Killed, USER, attacker},
    daemon::{Daemon, go_pprof, metric, parse_raw},
    serial,
};

const SPLIT: &str = env!("WORKLOAD_SPLIT");
const ROOT_SECRET: &str = env!("WORKLOAD_ROOT_SECRET");
/// The access group of this test's daemon (created here, never a real one).
const GROUP: &str = "profilerd-test-access";

/// A GET made by curl as the unprivileged user: (status, body).
fn get_as_user(url: &str) -> (u16, Vec<u8>) {
    let output = attacker()
        .command("curl")
        .args(["-sS", "--max-time", "60", "-o", "-", "-w", "%{http_code}", url])
        .output()
        .expect("running curl as the unprivileged user");
    assert!(
        output.status.success(),
        "curl {url} as {USER} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut body = output.stdout;
    let status = body.split_off(body.len().saturating_sub(3));
    let status = String::from_utf8_lossy(&status).parse().unwrap_or(0);
    (status, body)
}

fn text_as_user(url: &str) -> String {
    let (status, body) = get_as_user(url);
    let text = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(status, 200, "GET {url} as {USER}: {text}");
    text
}

/// Decodes a pprof body with go tool pprof: (pids, comms, functions).
fn decode_pprof(body: &[u8], name: &str) -> (Vec<String>, Vec<String>, Vec<String>) {
    let file = std::env::temp_dir().join(format!("profilerd-access-{}-{name}.pb.gz", std::process::id()));
    std::fs::write(&file, body).expect("saving the profile");
    let raw = go_pprof(&["-raw", file.to_str().expect("utf-8 path")]);
    let _ = std::fs::remove_file(&file);
    let samples = parse_raw(&raw);
    let pids = samples.iter().map(|s| s.label("pid").to_owned()).collect();
    let comms = samples.iter().map(|s| s.label("comm").to_owned()).collect();
    let functions = samples.iter().flat_map(|s| s.functions.clone()).collect();
    (pids, comms, functions)
}

fn group_admin(args: &[&str]) {
    let status = Command::new(args[0])
        .args(&args[1..])
        .status()
        .unwrap_or_else(|err| panic!("running {args:?}: {err}"));
    assert!(status.success(), "{args:?}: {status}");
}

/// What a user who sees only `user_pid`'s process must get everywhere, and
/// what must never show: the root workload's functions, pid and comm.
fn assert_only_own(daemon: &Daemon, user_pid: u32, root_pid: u32, how: &str) {
    let forbidden = |text: &str, what: &str| {
        for secret in ["root_only_", "root_secret", &format!("pid={root_pid}")] {
            assert!(
                !text.contains(secret),
                "{how}: {what} reveals {secret:?} of root's workload:\n{text}"
            );
        }
    };
    let folded = text_as_user(&daemon.url("/folded?seconds=30"));
    forbidden(&folded, "/folded");
    assert!(
        folded.contains("hot_a"),
        "{how}: /folded should show the user's own hot_a:\n{folded}"
    );
    assert!(
        folded.lines().all(|line| !line.starts_with("swapper")),
        "{how}: the idle task is root's, not the user's:\n{folded}"
    );

    let top = text_as_user(&daemon.url("/top?seconds=30"));
    forbidden(&top, "/top");
    assert!(top.contains("hot_a"), "{how}: /top should show hot_a:\n{top}");

    let index = text_as_user(&daemon.url("/?seconds=30"));
    forbidden(&index, "the index");
    assert!(
        !index.contains(&format!("<td>{root_pid}</td>")),
        "{how}: the index lists root's pid:\n{index}"
    );
    assert!(
        index.contains(&format!("<td>{user_pid}</td>")),
        "{how}: the index should list the user's pid"
    );

    let flame = text_as_user(&daemon.url("/flamegraph.svg?seconds=30"));
    forbidden(&flame, "the flame graph");

    let threads = text_as_user(&daemon.url("/threads?seconds=30"));
    forbidden(&threads, "/threads");
    let report: serde_json::Value = serde_json::from_str(&threads).expect("/threads is JSON");
    let pids: Vec<u64> = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter_map(|process| process["pid"].as_u64())
        .collect();
    assert!(
        pids.contains(&u64::from(user_pid)),
        "{how}: /threads should list {user_pid}: {pids:?}"
    );
    assert!(
        !pids.contains(&u64::from(root_pid)),
        "{how}: /threads lists root's pid: {pids:?}"
    );
    assert!(
        !pids.contains(&0),
        "{how}: /threads lists the idle task: {pids:?}"
    );

    for path in ["/pprof?seconds=30", "/debug/pprof/profile?seconds=2"] {
        let (status, body) = get_as_user(&daemon.url(path));
        assert_eq!(
            status,
            200,
            "{how}: GET {path}: {}",
            String::from_utf8_lossy(&body)
        );
        let (pids, comms, functions) = decode_pprof(&body, "user");
        assert!(
            !pids.contains(&root_pid.to_string()) && !comms.iter().any(|comm| comm == "root_secret"),
            "{how}: {path} has root's process: pids {pids:?}, comms {comms:?}"
        );
        assert!(
            !functions.iter().any(|name| name.starts_with("root_only_")),
            "{how}: {path} has root's functions"
        );
        assert!(
            functions.iter().any(|name| name == "hot_a"),
            "{how}: {path} should have hot_a"
        );
    }

    // A pid the user may not see is answered as one that never ran.
    let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .expect("reading pid_max")
        .trim()
        .parse()
        .expect("pid_max is a number");
    let never_ran = (1..pid_max)
        .rev()
        .find(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        .expect("a free pid");
    let (status, body) = get_as_user(&daemon.url(&format!("/pprof?pid={root_pid}&seconds=30")));
    let (never_status, never_body) = get_as_user(&daemon.url(&format!("/pprof?pid={never_ran}&seconds=30")));
    assert_eq!(
        (status, never_status),
        (404, 404),
        "{how}: pid of root's workload"
    );
    assert_eq!(
        String::from_utf8_lossy(&body).replace(&root_pid.to_string(), "P"),
        String::from_utf8_lossy(&never_body).replace(&never_ran.to_string(), "P"),
        "{how}: root's pid must get the answer of a pid that never ran"
    );
    let (status, _) = get_as_user(&daemon.url(&format!("/debug/pprof/profile?pid={root_pid}&seconds=1")));
    assert_eq!(status, 404, "{how}: /debug/pprof/profile of root's pid");
}

/// What root (or a group member) must see: both workloads.
fn assert_both(folded: &str, how: &str) {
    assert!(
        folded.contains("root_only_secret_function"),
        "{how}: root's workload missing:\n{folded}"
    );
    assert!(
        folded.contains("hot_a"),
        "{how}: the user's workload missing:\n{folded}"
    );
}

#[test]
fn a_user_sees_only_their_own_processes_root_and_the_group_see_all() {
    let _serial = serial();
    let user = attacker();
    let _ = Command::new("groupadd").args(["--system", GROUP]).output();
    // Not a member to start with, whatever an earlier run left.
    let _ = Command::new("gpasswd").args(["-d", USER, GROUP]).output();

    let (dir, mut own) = user.run_own_copy(Path::new(SPLIT), "access", "user_split", &["60"]);
    let user_pid = own.0.id();
    let root = Workload::spawn(ROOT_SECRET, &["60"]);
    let daemon = Daemon::start(&["--access-group", GROUP]);

    // Both workloads sampled (as root sees it), bounded in time.
    let started = Instant::now();
    loop {
        let folded = daemon.get("/folded?seconds=30").text();
        if folded.contains("root_only_secret_function") && folded.contains("hot_a") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "both workloads should be sampled within 30 s:\n{folded}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        own.0.try_wait().expect("polling").is_none(),
        "the user's workload still runs"
    );

    assert_only_own(&daemon, user_pid, root.pid(), "over loopback TCP");

    // Root over TCP sees both, through every view.
    assert_both(&daemon.get("/folded?seconds=30").text(), "root over TCP");
    let body = daemon.get("/pprof?seconds=30").body;
    let (_, comms, _) = decode_pprof(&body, "root");
    assert!(
        comms.iter().any(|comm| comm == "root_secret") && comms.iter().any(|comm| comm == "user_split"),
        "root's /pprof should hold both workloads: {comms:?}"
    );
    assert_eq!(
        daemon.get(&format!("/pprof?pid={user_pid}&seconds=30")).status,
        200
    );

    // A member of the access group sees both, from the next connection on.
    group_admin(&["gpasswd", "-a", USER, GROUP]);
    let folded = text_as_user(&daemon.url("/folded?seconds=30"));
    group_admin(&["gpasswd", "-d", USER, GROUP]);
    assert_both(&folded, "a member of the access group");

    // /metrics stays open to everyone.
    let (status, _) = get_as_user(&daemon.url("/metrics"));
    assert_eq!(status, 200, "/metrics is open");
    drop(root);
    drop(own);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `GET path` over the Unix socket with curl, as root or as the user: (status, body).
fn get_over_socket(socket: &Path, path: &str, as_user: bool) -> (u16, String) {
    let mut command = if as_user {
        attacker().command("curl")
    } else {
        Command::new("curl")
    };
    let output = command
        .args([
            "-sS",
            "--max-time",
            "60",
            "-o",
            "-",
            "-w",
            "%{http_code}",
            "--unix-socket",
        ])
        .arg(socket)
        .arg(format!("http://localhost{path}"))
        .output()
        .expect("running curl");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, status) = text.split_at(text.len().saturating_sub(3));
    (status.parse().unwrap_or(0), body.to_owned())
}

#[test]
fn over_the_unix_socket_a_user_sees_only_their_own_processes() {
    let _serial = serial();
    let user = attacker();
    let (dir, mut own) = user.run_own_copy(Path::new(SPLIT), "access-unix", "user_split", &["60"]);
    let user_pid = own.0.id();
    let root = Workload::spawn(ROOT_SECRET, &["60"]);
    let socket = std::env::temp_dir().join(format!("profilerd-access-{}.sock", std::process::id()));
    let listen = format!("unix:{}", socket.display());
    let mut daemon = Killed(
        Command::new(profilerd_tests::profilerd_bin())
            .args(["--listen", &listen, "--access-group", GROUP])
            .spawn()
            .expect("starting profilerd on a Unix socket"),
    );

    // Both workloads sampled, as root sees it over the socket. The user's
    // process is asked for by pid: other tests running beside this one have
    // their own hot_a, which says nothing of whether this one was sampled.
    let started = Instant::now();
    let users_own = format!("/folded?seconds=30&pid={user_pid}");
    loop {
        let (status, folded) = get_over_socket(&socket, "/folded?seconds=30", false);
        let (own_status, own) = get_over_socket(&socket, &users_own, false);
        if status == 200
            && folded.contains("root_only_secret_function")
            && own_status == 200
            && own.contains("hot_a")
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "root should see both workloads over {listen} within 40 s (status {status}):\n{folded}"
        );
        assert!(
            daemon.0.try_wait().expect("polling").is_none(),
            "profilerd exited (it needs root)"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&socket).expect("the socket").permissions(),
    );
    assert_eq!(
        mode & 0o777,
        0o666,
        "every local user may connect; the daemon filters"
    );

    let (status, folded) = get_over_socket(&socket, "/folded?seconds=30", true);
    assert_eq!(status, 200, "the user over {listen}: {folded}");
    assert!(
        folded.contains("hot_a"),
        "the user sees their own hot_a:\n{folded}"
    );
    for secret in ["root_only_", "root_secret"] {
        assert!(
            !folded.contains(secret),
            "the user over {listen} must not see {secret:?}:\n{folded}"
        );
    }
    let (status, _) = get_over_socket(&socket, &format!("/pprof?pid={}&seconds=30", root.pid()), true);
    assert_eq!(status, 404, "root's pid is not the user's to see");
    let (status, _) = get_over_socket(&socket, &format!("/pprof?pid={user_pid}&seconds=30"), true);
    assert_eq!(status, 200, "the user's own pid");

    // SIGTERM: the daemon removes its socket file.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(daemon.0.id() as i32, libc::SIGTERM) };
    let status = daemon.0.wait().expect("waiting for profilerd");
    assert!(status.success(), "profilerd should exit 0 on SIGTERM: {status}");
    assert!(!socket.exists(), "the socket file goes with the daemon");
    drop(root);
    let _ = own.0.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A GET as the unprivileged user with `Authorization: Bearer TOKEN`: (status, headers and body).
fn get_as_user_with_token(url: &str, token: &str) -> (u16, String) {
    let output = attacker()
        .command("curl")
        .args(["-sS", "-i", "--max-time", "60", "-H"])
        .arg(format!("Authorization: Bearer {token}"))
        .args(["-o", "-", "-w", "%{http_code}", url])
        .output()
        .expect("running curl as the unprivileged user");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, status) = text.split_at(text.len().saturating_sub(3));
    (status.parse().unwrap_or(0), body.to_owned())
}

#[test]
fn a_bearer_token_sees_every_process_and_a_wrong_one_gets_401() {
    let _serial = serial();
    let token_file = std::env::temp_dir().join(format!("profilerd-access-{}.token", std::process::id()));
    let token = "a-test-token-of-32-characters-00";
    std::fs::write(&token_file, format!("{token}\n")).expect("writing the token file");
    let root = Workload::spawn(ROOT_SECRET, &["60"]);
    let daemon = Daemon::start(&["--access-token-file", token_file.to_str().expect("utf-8 path")]);
    let url = daemon.url("/folded?seconds=30");
    let started = Instant::now();
    let folded = loop {
        let (status, text) = get_as_user_with_token(&url, token);
        if status == 200 && text.contains("root_only_secret_function") {
            break text;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the token holder should see root's workload within 30 s (status {status}):\n{text}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(folded.contains("root_secret"), "{folded}");

    let (status, text) = get_as_user_with_token(&url, "a-wrong-token-of-32-characters-0");
    assert_eq!(status, 401, "a wrong token: {text}");
    let lower = text.to_ascii_lowercase();
    assert!(
        lower.contains("www-authenticate: bearer") && lower.contains("x-go-pprof: 1"),
        "a 401 says how to authenticate, like the other errors:\n{text}"
    );
    assert!(!text.contains("root_"), "a 401 shows nothing:\n{text}");

    // Without a token a local user is still identified by the kernel.
    let own = text_as_user(&url);
    assert!(!own.contains("root_only_"), "no token, no root processes:\n{own}");
    drop(root);
    let _ = std::fs::remove_file(&token_file);
}

#[test]
fn listening_beyond_loopback_needs_a_token_or_insecure() {
    let output = Command::new(profilerd_tests::profilerd_bin())
        .args(["--listen", "0.0.0.0:0"])
        .output()
        .expect("running profilerd");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(78),
        "a listener beyond loopback with no token must refuse to start (EX_CONFIG): {stderr}"
    );
    assert!(
        stderr.contains("access_token_file"),
        "and say what to set: {stderr}"
    );
}

/// Issue 26, who may ask for allocations: a local user can make the daemon
/// probe their own processes only. Another user's process, named by pid or
/// chosen by name, is a 404 as if it did not run, and nothing is attached
/// to it; their own is traced.
#[test]
fn a_user_traces_the_allocations_of_their_own_processes_only() {
    let _serial = serial();
    let user = attacker();
    let (dir, own) = user.run_own_copy(Path::new(SPLIT), "access-allocs", "user_split", &["60"]);
    let user_pid = own.0.id();
    // Under a name of its own: the suite's other lane traces alloc_sites
    // by name at the same time, and must not find this one.
    let mut root = AllocSites::start_as("root_allocs", Options::all(60.0, MIB, 8 * MIB));
    root.wait_until_run(Duration::from_secs(1));
    let daemon = Daemon::start(&[]);
    let started = || {
        metric(
            &daemon.get("/metrics").text(),
            "profilerd_alloc_traces_started_total",
        )
    };

    for path in [
        format!("/debug/pprof/allocs?pid={}&seconds=1", root.pid()),
        "/debug/pprof/allocs?comm=root_allocs&seconds=1".to_owned(),
    ] {
        let (status, body) = get_as_user(&daemon.url(&path));
        let body = String::from_utf8_lossy(&body);
        assert_eq!(
            status, 404,
            "{path} as {USER}: root's process is not theirs to trace: {body}"
        );
        // Chosen by name, it is not even named back.
        assert!(
            path.contains("pid=") || !body.contains(&root.pid().to_string()),
            "{path} as {USER} must not name root's process: {body}"
        );
    }
    assert_eq!(started(), 0, "nothing may have been traced for the user");

    // Their own, by pid and by name: traced.
    for path in [
        format!("/debug/pprof/allocs?pid={user_pid}&seconds=1"),
        "/debug/pprof/allocs?comm=user_split&seconds=1".to_owned(),
    ] {
        let (status, body) = get_as_user(&daemon.url(&path));
        assert_eq!(
            status,
            200,
            "{path} as {USER}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    assert_eq!(
        started(),
        2,
        "the user's own process traced twice, one window each"
    );
    assert!(root.running(), "root's workload runs on");
    drop(own);
    let _ = std::fs::remove_dir_all(&dir);
}
