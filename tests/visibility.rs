//! Issue 30, parts 1 and 2: the kernel's own visibility rules. An
//! unprivileged user, beside root's workloads:
//!
//! 1. gets kernel frames of their own process by name but without address
//!    (this machine has `perf_event_paranoid` 2: the kernel shows the user
//!    zeros in /proc/kallsyms), while root gets the real addresses;
//! 2. does not see a set-uid-root program they started (the kernel refuses
//!    them `perf -p` and /proc/PID/maps on it), through any endpoint or
//!    filter, while root does; nor a program with a file capability, but
//!    does see their own program as root of their own user namespace.
//!
//! One daemon serves every case. The user's requests are made by curl running
//! as that user, so the daemon identifies them from the kernel.

use std::{
    io::Read,
    os::unix::fs::PermissionsExt,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use profilerd_tests::{
    Workload,
    attacker::{USER, attacker},
    daemon::Daemon,
    protowire::{bytes_of, fields, varint_of},
    serial,
};

const ZERO_READER: &str = env!("WORKLOAD_ZERO_READER");
const ROOT_SECRET: &str = env!("WORKLOAD_ROOT_SECRET");
const SPLIT: &str = env!("WORKLOAD_SPLIT");
/// The access group of this test's daemon (created here, never a real one).
const GROUP: &str = "profilerd-test-visibility";
/// The set-uid-root copy of the root-only workload, as the user runs it.
const SET_UID: &str = "suid_secret";
/// The user's own copy of the zero reader: its time is in the kernel.
const OWN: &str = "user_zeros";
/// A copy of the split workload with a file capability, as the user runs it.
const CAPABLE: &str = "cap_split";
/// The user's zero reader again, as root of a user namespace of theirs.
const IN_NAMESPACE: &str = "ns_zeros";
/// Lowest kernel address on x86-64 (the upper half).
const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;

/// Kills a process the test started, whatever happens.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        // The set-uid program runs as root: only root may signal it.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn text_as_user(url: &str) -> String {
    let (status, body) = attacker().curl(url);
    let text = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(status, 200, "GET {url} as {USER}: {text}");
    text
}

fn sysctl(name: &str) -> i64 {
    std::fs::read_to_string(format!("/proc/sys/kernel/{name}"))
        .unwrap_or_else(|err| panic!("reading kernel.{name}: {err}"))
        .trim()
        .parse()
        .unwrap_or_else(|err| panic!("kernel.{name}: {err}"))
}

/// A profile's kernel locations (those in the `[kernel.kallsyms]` mapping):
/// their addresses, and the names of their functions.
struct KernelFrames {
    addresses: Vec<u64>,
    names: Vec<String>,
    /// Every string of the profile (names, comms, labels).
    strings: Vec<String>,
    /// Every location's address, user frames included.
    all_addresses: Vec<u64>,
}

fn kernel_frames(gzipped: &[u8]) -> KernelFrames {
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(gzipped)
        .read_to_end(&mut bytes)
        .expect("a profile is gzipped protobuf");
    let profile = fields(&bytes).expect("a profile is valid protobuf");
    let strings: Vec<String> = bytes_of(&profile, 6)
        .iter()
        .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
        .collect();
    let string = |index: u64| strings.get(index as usize).cloned().unwrap_or_default();
    let kernel_mappings: Vec<u64> = bytes_of(&profile, 3)
        .iter()
        .map(|mapping| fields(mapping).expect("a mapping"))
        .filter(|mapping| string(varint_of(mapping, 5)) == "[kernel.kallsyms]")
        .map(|mapping| varint_of(&mapping, 1))
        .collect();
    let functions: Vec<(u64, String)> = bytes_of(&profile, 5)
        .iter()
        .map(|function| fields(function).expect("a function"))
        .map(|function| (varint_of(&function, 1), string(varint_of(&function, 2))))
        .collect();
    let mut frames = KernelFrames {
        addresses: Vec::new(),
        names: Vec::new(),
        strings: strings.clone(),
        all_addresses: Vec::new(),
    };
    for location in bytes_of(&profile, 4) {
        let location = fields(location).expect("a location");
        let address = varint_of(&location, 3);
        frames.all_addresses.push(address);
        if !kernel_mappings.contains(&varint_of(&location, 2)) {
            continue;
        }
        frames.addresses.push(address);
        for line in bytes_of(&location, 4) {
            let line = fields(line).expect("a line");
            let id = varint_of(&line, 1);
            if let Some((_, name)) = functions.iter().find(|(function, _)| *function == id) {
                frames.names.push(name.clone());
            }
        }
    }
    frames
}

#[test]
fn a_user_sees_kernel_frames_without_addresses_and_not_the_set_uid_programs_they_start() {
    let _serial = serial();
    let user = attacker();
    let _ = Command::new("groupadd").args(["--system", GROUP]).output();
    let _ = Command::new("gpasswd").args(["-d", USER, GROUP]).output();
    let (kptr_restrict, paranoid) = (sysctl("kptr_restrict"), sysctl("perf_event_paranoid"));
    assert!(
        kptr_restrict != 0 || paranoid > 1,
        "this test needs a machine whose kernel hides kernel addresses from users \
         (kptr_restrict {kptr_restrict}, perf_event_paranoid {paranoid}): the kernel shows them here"
    );

    let dir = user.workdir(Path::new("/tmp"), "visibility");
    let own_binary = user.own_copy(Path::new(ZERO_READER), &dir, OWN);
    let set_uid = dir.join(SET_UID);
    std::fs::copy(ROOT_SECRET, &set_uid).expect("copying the set-uid program");
    std::os::unix::fs::chown(&set_uid, Some(0), Some(0)).expect("chown root");
    std::fs::set_permissions(&set_uid, std::fs::Permissions::from_mode(0o4755)).expect("chmod 4755");
    let capable = dir.join(CAPABLE);
    std::fs::copy(SPLIT, &capable).expect("copying the split workload");
    std::os::unix::fs::chown(&capable, Some(0), Some(0)).expect("chown root");
    let setcap = Command::new("setcap")
        .args(["cap_sys_nice+ep"])
        .arg(&capable)
        .status()
        .expect("running setcap");
    assert!(setcap.success(), "setcap cap_sys_nice+ep: {setcap}");
    let in_namespace = user.own_copy(Path::new(ZERO_READER), &dir, IN_NAMESPACE);

    let own = Killed(
        user.command(&own_binary)
            .arg("60")
            .stdout(Stdio::null())
            .spawn()
            .expect("starting the user's zero reader"),
    );
    let own_pid = own.0.id();
    let setuid = Killed(
        user.command(&set_uid)
            .arg("60")
            .stdout(Stdio::null())
            .spawn()
            .expect("starting the set-uid program as the user"),
    );
    let setuid_pid = setuid.0.id();
    let capable = Killed(
        user.command(&capable)
            .arg("60")
            .stdout(Stdio::null())
            .spawn()
            .expect("starting the file-capability program as the user"),
    );
    let capable_pid = capable.0.id();
    // unshare execs the program in its own process: the pid stays.
    let in_namespace = Killed(
        user.command("unshare")
            .args(["--user", "--map-root-user"])
            .arg(&in_namespace)
            .arg("60")
            .stdout(Stdio::null())
            .spawn()
            .expect("starting the zero reader in a user namespace of the user's"),
    );
    let namespace_pid = in_namespace.0.id();
    let root = Workload::spawn(ZERO_READER, &["60"]);
    let daemon = Daemon::start(&["--access-group", GROUP]);

    // The premise: the kernel runs the program as root for the user, and
    // refuses the user its maps.
    std::thread::sleep(Duration::from_millis(200));
    let status = std::fs::read_to_string(format!("/proc/{setuid_pid}/status")).expect("its status");
    let uids = status
        .lines()
        .find(|line| line.starts_with("Uid:"))
        .expect("a Uid: line");
    assert_eq!(
        uids.split_whitespace().collect::<Vec<_>>(),
        ["Uid:", &user.uid.to_string(), "0", "0", "0"],
        "the set-uid program keeps the user's real uid and runs as root"
    );
    let maps = user
        .command("cat")
        .arg(format!("/proc/{setuid_pid}/maps"))
        .output()
        .expect("cat as the user");
    assert!(
        !maps.status.success(),
        "the kernel lets {USER} read the maps of the set-uid program it started"
    );
    // Both hold capabilities: one in the machine's user namespace, which
    // the kernel refuses the user; one in the user's own, which it allows.
    for (pid, what) in [(capable_pid, CAPABLE), (namespace_pid, IN_NAMESPACE)] {
        let readable = user
            .command("cat")
            .arg(format!("/proc/{pid}/maps"))
            .output()
            .expect("cat as the user")
            .status
            .success();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
        let permitted = status
            .lines()
            .find_map(|line| line.strip_prefix("CapPrm:"))
            .map(|hex| hex.trim().trim_start_matches('0').to_owned());
        assert!(
            permitted.as_ref().is_some_and(|hex| !hex.is_empty()) && readable == (what == IN_NAMESPACE),
            "{what}: capabilities {permitted:?}, the user may read its maps: {readable}"
        );
    }

    // Every workload sampled, as root sees it.
    let started = Instant::now();
    loop {
        let folded = daemon.get("/folded?seconds=30").text();
        let has = |comm: &str, frame: &str| {
            folded
                .lines()
                .any(|line| line.starts_with(&format!("{comm};")) && line.contains(frame))
        };
        if has(OWN, "_[k]")
            && has("zero_reader", "_[k]")
            && has(SET_UID, "root_only_secret_function")
            && has(CAPABLE, "hot_a")
            && has(IN_NAMESPACE, "read_zeros")
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "every workload should be sampled within 30 s:\n{folded}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    let setup = Setup {
        daemon: &daemon,
        own_pid,
        setuid_pid,
    };
    let mut failures = Failures::default();
    kernel_addresses(&setup, &mut failures);
    set_uid_program(&setup, &mut failures);
    capabilities(&setup, capable_pid, namespace_pid, &mut failures);
    assert_eq!(daemon.get("/metrics").status, 200, "the daemon still answers");
    drop(root);
    drop(own);
    drop(setuid);
    drop(capable);
    drop(in_namespace);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        failures.0.is_empty(),
        "{} failed checks:\n- {}",
        failures.0.len(),
        failures.0.join("\n- ")
    );
}

struct Setup<'a> {
    daemon: &'a Daemon,
    /// The user's own zero reader.
    own_pid: u32,
    /// The set-uid-root program the user started.
    setuid_pid: u32,
}

/// Every failed check, so that one run tells all that is wrong.
#[derive(Default)]
struct Failures(Vec<String>);

impl Failures {
    fn check(&mut self, ok: bool, message: impl FnOnce() -> String) {
        if !ok {
            let message = message();
            eprintln!("FAILED: {message}");
            self.0.push(message);
        }
    }
}

/// Part 1: root's /pprof has kernel addresses; the user's, of their own
/// process, has its kernel frames by name at address 0, and no other view
/// shows one.
fn kernel_addresses(setup: &Setup, failures: &mut Failures) {
    let (daemon, own_pid, user) = (setup.daemon, setup.own_pid, attacker());
    let root_profile = kernel_frames(&daemon.get("/pprof?seconds=30").body);
    failures.check(
        root_profile
            .addresses
            .iter()
            .any(|&address| address >= KERNEL_HALF),
        || {
            format!(
                "root's /pprof should carry kernel addresses: {:x?}",
                root_profile.addresses
            )
        },
    );
    for path in [
        format!("/pprof?seconds=30&pid={own_pid}"),
        "/pprof?seconds=30".to_owned(),
        format!("/debug/pprof/profile?seconds=2&pid={own_pid}"),
    ] {
        let (status, body) = user.curl(&daemon.url(&path));
        assert_eq!(
            status,
            200,
            "{path} as {USER}: {}",
            String::from_utf8_lossy(&body)
        );
        let own = kernel_frames(&body);
        failures.check(
            own.names.iter().any(|name| !name.starts_with("[unknown]")),
            || {
                format!(
                    "the user's kernel frames keep their names in {path}: {:?}",
                    own.names
                )
            },
        );
        failures.check(
            own.addresses.iter().all(|&address| address == 0)
                && own.all_addresses.iter().all(|&address| address < KERNEL_HALF),
            || format!("the user's {path} carries kernel addresses: {:x?}", own.addresses),
        );
        failures.check(
            own.strings.iter().all(|string| !string.contains("0xffff")),
            || format!("a name in the user's {path} carries a kernel address"),
        );
    }
    let folded = text_as_user(&daemon.url(&format!("/folded?seconds=30&pid={own_pid}")));
    failures.check(
        folded
            .lines()
            .any(|line| line.starts_with(&format!("{OWN};")) && line.contains("_[k]")),
        || format!("the user's /folded has their kernel frames by name:\n{folded}"),
    );
    let top = text_as_user(&daemon.url(&format!("/top?seconds=30&pid={own_pid}")));
    failures.check(top.contains(" [k]"), || {
        format!("/top names the user's kernel frames:\n{top}")
    });
    for path in [
        "/folded?seconds=30",
        "/top?seconds=30",
        "/top?seconds=30&format=json",
        "/flamegraph.svg?seconds=30",
        "/threads?seconds=30",
        "/?seconds=30",
    ] {
        let text = text_as_user(&daemon.url(path));
        failures.check(!text.to_ascii_lowercase().contains("0xffff"), || {
            format!("{path} shows a kernel address to {USER}:\n{text}")
        });
    }

    // A member of the access group is granted what CAP_PERFMON grants perf.
    group_admin(&["gpasswd", "-a", USER, GROUP]);
    let (status, body) = user.curl(&daemon.url(&format!("/pprof?seconds=30&pid={own_pid}")));
    group_admin(&["gpasswd", "-d", USER, GROUP]);
    assert_eq!(status, 200);
    let member = kernel_frames(&body);
    failures.check(
        member.addresses.iter().any(|&address| address >= KERNEL_HALF),
        || {
            format!(
                "a member of the access group gets kernel addresses: {:x?}",
                member.addresses
            )
        },
    );
}

/// Part 2: the set-uid program is invisible to the user who started it
/// through every endpoint and filter, and visible to root.
fn set_uid_program(setup: &Setup, failures: &mut Failures) {
    let (daemon, own_pid, setuid_pid, user) = (setup.daemon, setup.own_pid, setup.setuid_pid, attacker());
    // Its functions never show; nor its name, except where a title repeats
    // the `comm=` asked for.
    let mut forbidden = |text: &str, what: &str, comm_asked: bool| {
        let name = if comm_asked { None } else { Some(SET_UID) };
        for secret in ["root_only_"].into_iter().chain(name) {
            failures.check(!text.contains(secret), || {
                format!("{what} shows {USER} the set-uid program it started ({secret:?})")
            });
        }
    };
    for filter in ["", &format!("&comm={SET_UID}")] {
        let comm_asked = !filter.is_empty();
        for view in [
            "/folded",
            "/top",
            "/top?format=json",
            "/flamegraph.svg",
            "/threads",
            "/",
        ] {
            let separator = if view.contains('?') { '&' } else { '?' };
            let path = format!("{view}{separator}seconds=30{filter}");
            let text = text_as_user(&daemon.url(&path));
            forbidden(&text, &path, comm_asked);
            if comm_asked && view == "/folded" {
                forbidden(&text, &format!("{path} (not empty)"), false);
            }
            if comm_asked && view == "/threads" {
                forbidden(&text, &format!("{path} (processes)"), false);
            }
        }
        let path = format!("/pprof?seconds=30{filter}");
        let (status, body) = user.curl(&daemon.url(&path));
        assert_eq!(status, 200, "{path}");
        forbidden(&kernel_frames(&body).strings.join("\n"), &path, false);
    }
    let threads = text_as_user(&daemon.url("/threads?seconds=30"));
    failures.check(!threads.contains(&format!("\"pid\":{setuid_pid},")), || {
        format!("/threads lists the set-uid program to {USER}")
    });
    failures.check(threads.contains(&format!("\"pid\":{own_pid},")), || {
        format!("/threads lists the user's own process:\n{threads}")
    });
    // Its pid is a pid that does not run, on every endpoint.
    for view in [
        "/pprof",
        "/folded",
        "/top",
        "/flamegraph.svg",
        "/threads",
        "/",
        "/debug/pprof/profile",
    ] {
        let seconds = if view == "/debug/pprof/profile" { 1 } else { 30 };
        let path = format!("{view}?seconds={seconds}&pid={setuid_pid}");
        let (status, _) = user.curl(&daemon.url(&path));
        failures.check(status == 404, || {
            format!("{path} as {USER}: {status}, not the 404 of a pid that does not run")
        });
    }

    // ... and visible to root through each of them.
    let folded = daemon.get(&format!("/folded?seconds=30&pid={setuid_pid}")).text();
    failures.check(
        folded.contains("root_only_secret_function") && folded.starts_with(SET_UID),
        || format!("root sees the set-uid program by pid:\n{folded}"),
    );
    let folded = daemon.get(&format!("/folded?seconds=30&comm={SET_UID}")).text();
    failures.check(folded.contains("root_only_secret_function"), || {
        format!("root sees the set-uid program by comm:\n{folded}")
    });
    for path in [
        "/top?seconds=30",
        "/flamegraph.svg?seconds=30",
        "/threads?seconds=30",
        "/?seconds=30",
    ] {
        let text = daemon.get(path).text();
        failures.check(text.contains(SET_UID) || text.contains("root_only_"), || {
            format!("root's {path} shows the set-uid program")
        });
    }
    let root_profile = kernel_frames(&daemon.get(&format!("/pprof?seconds=30&pid={setuid_pid}")).body);
    failures.check(
        root_profile
            .strings
            .iter()
            .any(|string| string == "root_only_secret_function"),
        || "root's /pprof of the set-uid program has its functions".to_owned(),
    );
}

/// A program with a file capability is the kernel's to refuse the user who
/// starts it; one whose capabilities are those of the user's own user
/// namespace (a rootless container) is that user's.
fn capabilities(setup: &Setup, capable_pid: u32, namespace_pid: u32, failures: &mut Failures) {
    let (daemon, user) = (setup.daemon, attacker());
    // Only the capable program runs the split workload's functions here.
    for path in [
        "/folded?seconds=30",
        "/top?seconds=30",
        "/flamegraph.svg?seconds=30",
        "/threads?seconds=30",
    ] {
        let text = text_as_user(&daemon.url(path));
        for secret in [CAPABLE, "hot_a"] {
            failures.check(!text.contains(secret), || {
                format!("{path} shows {USER} the file-capability program it started ({secret:?})")
            });
        }
    }
    let (status, body) = user.curl(&daemon.url("/pprof?seconds=30"));
    assert_eq!(status, 200);
    let strings = kernel_frames(&body).strings;
    failures.check(
        !strings
            .iter()
            .any(|string| string == CAPABLE || string == "hot_a"),
        || format!("/pprof shows {USER} the file-capability program it started"),
    );
    let (status, _) = user.curl(&daemon.url(&format!("/folded?seconds=30&pid={capable_pid}")));
    failures.check(status == 404, || {
        format!("pid= of the file-capability program as {USER}: {status}, not 404")
    });
    let folded = daemon
        .get(&format!("/folded?seconds=30&pid={capable_pid}"))
        .text();
    failures.check(folded.contains("hot_a"), || {
        format!("root sees the file-capability program:\n{folded}")
    });
    let (status, body) = user.curl(&daemon.url(&format!("/folded?seconds=30&pid={namespace_pid}")));
    let text = String::from_utf8_lossy(&body);
    failures.check(
        status == 200
            && text
                .lines()
                .any(|line| line.starts_with(&format!("{IN_NAMESPACE};"))),
        || format!("{USER} sees its own program in its own user namespace: {status}\n{text}"),
    );
}

fn group_admin(args: &[&str]) {
    let status = Command::new(args[0])
        .args(&args[1..])
        .status()
        .unwrap_or_else(|err| panic!("running {args:?}: {err}"));
    assert!(status.success(), "{args:?}: {status}");
}
