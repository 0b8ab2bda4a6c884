//! Issue 15, TLS: the daemon listens beyond loopback (this side of a veth
//! pair) over TLS, and its clients run in another network namespace, where
//! the kernel cannot tell the daemon who they are — as for scrapers on other
//! machines. Certificates are made for each run with the openssl CLI.

use std::{
    io::Read,
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use profilerd_tests::{
    Workload,
    daemon::{free_port, go_pprof, metric, parse_raw},
    pki::{Pki, Remote, Usage, fingerprint},
    serial,
};

const ROOT_SECRET: &str = env!("WORKLOAD_ROOT_SECRET");
const TOKEN: &str = "a-test-token-of-32-characters-00";

/// A daemon started with `args`, its log in a file; SIGTERM on drop.
struct TlsDaemon {
    child: Child,
    log: PathBuf,
}

impl TlsDaemon {
    /// Starts it and waits (30 s at most) until `ready` says it answers.
    fn start(args: &[String], log: PathBuf, ready: impl Fn() -> bool) -> Self {
        let file = std::fs::File::create(&log).expect("creating the daemon's log");
        let child = Command::new(profilerd_tests::profilerd_bin())
            .args(args)
            .env("RUST_LOG", "info,profilerd::serve::tls=debug")
            .stderr(Stdio::from(file))
            .spawn()
            .expect("starting profilerd");
        let mut daemon = Self { child, log };
        let started = Instant::now();
        while !ready() {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                panic!("profilerd exited before answering: {status}\n{}", daemon.log());
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "profilerd did not answer over TLS within 30 s:\n{}",
                daemon.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        daemon
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn hangup(&self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGHUP) };
    }

    fn assert_running(&mut self, when: &str) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("profilerd exited {when}: {status}\n{}", self.log());
        }
    }
}

impl Drop for TlsDaemon {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What curl got: its exit code, the HTTP status (0 for none), the
/// response head, the body and how long it took.
struct Fetched {
    exit: i32,
    status: u16,
    head: String,
    body: Vec<u8>,
    stderr: String,
    took: Duration,
}

impl Fetched {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `curl ARGS URL` run in `remote`'s namespace.
fn curl(remote: &Remote, args: &[&str], url: &str) -> Fetched {
    let body_file = std::env::temp_dir().join(format!("profilerd-tls-body-{}", std::process::id()));
    let _ = std::fs::remove_file(&body_file);
    let started = Instant::now();
    let output = remote
        .command("curl")
        .args(["-sS", "--max-time", "60", "-D", "-", "-w", "%{http_code}", "-o"])
        .arg(&body_file)
        .args(args)
        .arg(url)
        .output()
        .expect("running curl in the client's namespace");
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let (head, status) = stdout.split_at(stdout.len().saturating_sub(3));
    let body = std::fs::read(&body_file).unwrap_or_default();
    let _ = std::fs::remove_file(&body_file);
    Fetched {
        exit: output.status.code().unwrap_or(-1),
        status: status.parse().unwrap_or(0),
        head: head.to_owned(),
        body,
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        took,
    }
}

fn path_arg(path: &Path) -> String {
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// The functions, pids and comms of a pprof body, read by go tool pprof.
fn functions_in(body: &[u8]) -> Vec<String> {
    let file = std::env::temp_dir().join(format!("profilerd-tls-{}.pb.gz", std::process::id()));
    std::fs::write(&file, body).expect("saving the profile");
    let raw = go_pprof(&["-raw", &path_arg(&file)]);
    let _ = std::fs::remove_file(&file);
    parse_raw(&raw)
        .into_iter()
        .flat_map(|sample| sample.functions)
        .collect()
}

/// Polls `attempt` every 500 ms until it returns Some, for 30 s at most.
fn within_30s<T>(what: &str, mut attempt: impl FnMut() -> Result<T, String>) -> T {
    let started = Instant::now();
    loop {
        match attempt() {
            Ok(value) => return value,
            Err(last) => assert!(
                started.elapsed() < Duration::from_secs(30),
                "{what} within 30 s; last: {last}"
            ),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn tls_with_a_token_beyond_loopback() {
    let _serial = serial();
    let remote = Remote::new();
    let pki = Pki::new("token");
    pki.ca("ca");
    pki.issue("ca", "server", 1001, Usage::Server(remote.host_ip));
    let token_file = pki.path("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("writing the token");
    let root = Workload::spawn(ROOT_SECRET, &["60"]);
    let address = format!("{}:{}", remote.host_ip, free_port());
    let base = format!("https://{address}");
    let ca = path_arg(&pki.path("ca.pem"));
    let trusting = ["--cacert", ca.as_str()];
    let args: Vec<String> = [
        "--listen",
        &address,
        "--tls-cert-file",
        &path_arg(&pki.path("server.pem")),
        "--tls-key-file",
        &path_arg(&pki.path("server.key")),
        "--access-token-file",
        &path_arg(&token_file),
        "--http-header-timeout-ms",
        "1000",
    ]
    .map(str::to_owned)
    .to_vec();
    let mut daemon = TlsDaemon::start(&args, pki.path("daemon.log"), || {
        curl(&remote, &trusting, &format!("{base}/metrics")).status == 200
    });

    // No token, from a client the kernel cannot name: 401, saying how.
    let refused = curl(&remote, &trusting, &format!("{base}/folded?seconds=30"));
    assert_eq!(
        refused.status,
        401,
        "no token: {}{}",
        refused.head,
        refused.text()
    );
    assert!(
        refused
            .head
            .to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "a 401 says how to authenticate:\n{}",
        refused.head
    );

    // With the token, a client that trusts only the CA file gets a real
    // profile of root's workload.
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let with_token = ["--cacert", ca.as_str(), "-H", bearer.as_str()];
    let functions = within_30s("the token holder gets root's workload over TLS", || {
        let fetched = curl(&remote, &with_token, &format!("{base}/pprof?seconds=30"));
        if fetched.status != 200 {
            return Err(format!(
                "status {}: {}{}",
                fetched.status,
                fetched.stderr,
                fetched.text()
            ));
        }
        let functions = functions_in(&fetched.body);
        if functions.iter().any(|name| name == "root_only_secret_function") {
            Ok(functions)
        } else {
            Err(format!(
                "{} functions, not root_only_secret_function yet",
                functions.len()
            ))
        }
    });
    assert!(!functions.is_empty());

    // Plain HTTP to the TLS port: a clear error at once, and the daemon serves on.
    let plain = curl(&remote, &[], &format!("http://{address}/folded"));
    assert_eq!(
        plain.status,
        400,
        "plain HTTP to the TLS port: {}{}",
        plain.stderr,
        plain.text()
    );
    assert!(
        plain.text().contains("https://"),
        "the answer says what to do: {}",
        plain.text()
    );
    assert!(
        plain.took < Duration::from_secs(5),
        "plain HTTP answered in {:?}",
        plain.took
    );
    // Bytes that are neither TLS nor HTTP: the connection is closed.
    let mut garbage = TcpStream::connect(&address).expect("connecting");
    std::io::Write::write_all(&mut garbage, b"\x00\x01\x02 not TLS\r\n\r\n").expect("writing");
    garbage
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    let mut answer = Vec::new();
    match garbage.read_to_end(&mut answer) {
        Ok(_) => assert!(
            answer.is_empty(),
            "bytes that are not TLS get no answer: {answer:?}"
        ),
        // What it sent was left unread: the close is a reset.
        Err(err) => assert_eq!(
            err.kind(),
            std::io::ErrorKind::ConnectionReset,
            "bytes that are not TLS get the connection closed, not {err}"
        ),
    }
    daemon.assert_running("after plain HTTP on its TLS port");
    let after = curl(&remote, &with_token, &format!("{base}/top?seconds=30"));
    assert_eq!(after.status, 200, "served after plain HTTP: {}", after.text());

    // A client that connects and never says hello is closed at the header timeout.
    let mut silent = TcpStream::connect(&address).expect("connecting");
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    let started = Instant::now();
    let mut nothing = Vec::new();
    let _ = silent.read_to_end(&mut nothing);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "a silent client is closed at the 1 s header timeout, not after {waited:?}"
    );

    let metrics = curl(&remote, &trusting, &format!("{base}/metrics")).text();
    assert!(
        metric(&metrics, "profilerd_tls_handshakes_total{outcome=\"ok\"}") >= 4,
        "{metrics}"
    );
    assert!(metric(&metrics, "profilerd_tls_handshakes_total{outcome=\"not_tls\"}") >= 2);
    assert!(metric(&metrics, "profilerd_tls_handshakes_total{outcome=\"timeout\"}") >= 1);
    assert!(
        metric(
            &metrics,
            "profilerd_http_connections_closed_total{reason=\"header_timeout\"}"
        ) >= 1
    );
    drop(root);
}

#[test]
fn client_certificates_and_reload_on_sighup() {
    let _serial = serial();
    let remote = Remote::new();
    let pki = Pki::new("mtls");
    pki.ca("ca");
    pki.ca("other-ca");
    pki.issue("ca", "server", 2001, Usage::Server(remote.host_ip));
    pki.issue("ca", "scraper", 2002, Usage::Client);
    pki.issue("other-ca", "stranger", 2003, Usage::Client);
    let root = Workload::spawn(ROOT_SECRET, &["60"]);
    let address = format!("{}:{}", remote.host_ip, free_port());
    let base = format!("https://{address}");
    let [ca, cert, key] = ["ca.pem", "scraper.pem", "scraper.key"].map(|file| path_arg(&pki.path(file)));
    let certified = [
        "--cacert",
        ca.as_str(),
        "--cert",
        cert.as_str(),
        "--key",
        key.as_str(),
    ];
    // The daemon reads its files at these paths, now and on SIGHUP.
    let (server_cert, server_key) = (pki.path("live.pem"), pki.path("live.key"));
    std::fs::copy(pki.path("server.pem"), &server_cert).expect("installing the certificate");
    std::fs::copy(pki.path("server.key"), &server_key).expect("installing the key");
    // No token: beyond loopback, the client CA is enough.
    let args: Vec<String> = [
        "--listen",
        &address,
        "--tls-cert-file",
        &path_arg(&server_cert),
        "--tls-key-file",
        &path_arg(&server_key),
        "--tls-client-ca-file",
        &ca,
    ]
    .map(str::to_owned)
    .to_vec();
    let mut daemon = TlsDaemon::start(&args, pki.path("daemon.log"), || {
        curl(&remote, &certified, &format!("{base}/metrics")).status == 200
    });

    // No client certificate, or one another CA signed: the handshake is refused, at once.
    let stranger = [
        "--cacert",
        ca.as_str(),
        "--cert",
        &path_arg(&pki.path("stranger.pem")),
        "--key",
        &path_arg(&pki.path("stranger.key")),
    ]
    .map(str::to_owned);
    let stranger: Vec<&str> = stranger.iter().map(String::as_str).collect();
    for (how, args) in [
        ("no client certificate", &["--cacert", ca.as_str()][..]),
        ("another CA's", &stranger[..]),
    ] {
        let refused = curl(&remote, args, &format!("{base}/metrics"));
        assert!(
            refused.exit != 0 && refused.status == 0,
            "{how}: the handshake must fail (curl exit {}, status {}): {}",
            refused.exit,
            refused.status,
            refused.text()
        );
        assert!(
            refused.took < Duration::from_secs(5),
            "{how}: refused in {:?}",
            refused.took
        );
    }

    // A valid certificate sees every process, though the kernel cannot name
    // the client: pprof fetches root's workload with it. The standalone
    // pprof: `go tool pprof` fetches with a client that ignores -tls_*.
    let url = format!("{base}/pprof?seconds=30");
    let raw = within_30s("pprof with a client certificate gets root's workload", || {
        let output = remote
            .command("pprof")
            .args(["-raw", "-tls_ca", &ca, "-tls_cert", &cert, "-tls_key", &key, &url])
            .env("PPROF_TMPDIR", std::env::temp_dir())
            .output()
            .expect("running pprof in the client's namespace (scripts/setup.sh installs it)");
        let raw = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() && raw.contains("root_only_secret_function") {
            Ok(raw)
        } else {
            Err(format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    });
    let samples = parse_raw(&raw);
    assert!(
        samples.iter().any(|sample| sample.label("comm") == "root_secret"),
        "the profile names root's process"
    );
    assert!(
        daemon.log().contains(&fingerprint(Path::new(&cert))),
        "the client certificate's fingerprint is logged (debug):\n{}",
        daemon.log()
    );

    // SIGHUP with a new certificate: new connections get it.
    let serial_now = || {
        let output = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "openssl s_client -connect {address} -CAfile {ca} -cert {cert} -key {key} </dev/null 2>/dev/null \
                 | openssl x509 -noout -serial"
            ))
            .output()
            .expect("running openssl s_client");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    assert_eq!(
        serial_now(),
        format!("serial={:04X}", 2001),
        "the first certificate"
    );
    pki.issue("ca", "renewed", 2004, Usage::Server(remote.host_ip));
    replace(&pki.path("renewed.pem"), &server_cert);
    replace(&pki.path("renewed.key"), &server_key);
    daemon.hangup();
    within_30s("the renewed certificate is served after SIGHUP", || {
        let serial = serial_now();
        (serial == format!("serial={:04X}", 2004))
            .then_some(())
            .ok_or(serial)
    });
    let metrics = curl(&remote, &certified, &format!("{base}/metrics")).text();
    assert_eq!(
        metric(&metrics, "profilerd_tls_reloads_total{outcome=\"ok\"}"),
        1,
        "{metrics}"
    );

    // A reload that fails keeps the certificate in use: a key that is not
    // PEM, then one that is not the certificate's.
    std::fs::write(&server_key, "not a key\n").expect("breaking the key");
    daemon.hangup();
    expect_failed_reloads(&remote, &certified, &base, 1);
    replace(&pki.path("stranger.key"), &server_key);
    daemon.hangup();
    expect_failed_reloads(&remote, &certified, &base, 2);
    daemon.assert_running("after failed reloads");
    assert_eq!(
        serial_now(),
        format!("serial={:04X}", 2004),
        "the previous certificate serves on"
    );
    let log = daemon.log();
    assert!(
        log.contains("reloading TLS failed") && log.contains("does not match the certificate"),
        "the failures are logged, the mismatch named:\n{log}"
    );
    let top = curl(&remote, &certified, &format!("{base}/top?seconds=30"));
    assert_eq!(top.status, 200, "served after failed reloads: {}", top.text());
    drop(root);
}

fn expect_failed_reloads(remote: &Remote, certified: &[&str], base: &str, count: u64) {
    within_30s("the failed reload is counted", || {
        let metrics = curl(remote, certified, &format!("{base}/metrics")).text();
        let failed = metric(&metrics, "profilerd_tls_reloads_total{outcome=\"failed\"}");
        (failed == count)
            .then_some(())
            .ok_or(format!("failed = {failed}"))
    });
}

/// Replaces `target` by a copy of `source` at once (rename), as a
/// certificate manager would.
fn replace(source: &Path, target: &Path) {
    let staged = target.with_extension("new");
    std::fs::copy(source, &staged).expect("staging the file");
    std::fs::rename(&staged, target).expect("replacing the file");
}

/// Runs profilerd with `args`, expecting it to stop at once with exit 78
/// and an error naming `named`.
fn refuses_to_start(args: &[&str], named: &str) {
    let output = Command::new(profilerd_tests::profilerd_bin())
        .args(args)
        .output()
        .expect("running profilerd");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(78),
        "{args:?} must stop with EX_CONFIG: {stderr}"
    );
    assert!(
        stderr.contains(named),
        "{args:?}: the error names {named:?}: {stderr}"
    );
}

#[test]
fn bad_tls_settings_stop_the_daemon_at_start() {
    let pki = Pki::new("bad");
    pki.ca("ca");
    pki.issue("ca", "server", 3001, Usage::Server([127, 0, 0, 1].into()));
    pki.issue("ca", "other", 3002, Usage::Client);
    let [cert, key, other_key, ca] =
        ["server.pem", "server.key", "other.key", "ca.pem"].map(|file| path_arg(&pki.path(file)));
    let missing = path_arg(&pki.path("missing.key"));
    let broken = path_arg(&pki.path("broken.key"));
    std::fs::write(&broken, "-----BEGIN PRIVATE KEY-----\nAAAA\n").expect("writing a broken key");
    for (key, named) in [
        (&missing, format!("reading the key file {missing}: No such file")),
        (&broken, format!("the key file {broken} is not valid PEM")),
        (&cert, format!("the key file {cert} holds no private key")),
        (
            &other_key,
            format!("the key {other_key} does not match the certificate {cert}"),
        ),
    ] {
        refuses_to_start(
            &[
                "--listen",
                "127.0.0.1:0",
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                key,
            ],
            &named,
        );
    }
    refuses_to_start(
        &["--listen", "127.0.0.1:0", "--tls-cert-file", &cert],
        "tls_key_file",
    );
    refuses_to_start(
        &["--listen", "127.0.0.1:0", "--tls-client-ca-file", &ca],
        "tls_cert_file",
    );
    refuses_to_start(
        &[
            "--listen",
            "unix:/tmp/profilerd-tls.sock",
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
        ],
        "Unix socket",
    );
    // TLS alone beyond loopback still needs a token or a client CA.
    refuses_to_start(
        &[
            "--listen",
            "0.0.0.0:0",
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
        ],
        "tls_client_ca_file",
    );
}

#[test]
fn tls_on_loopback_needs_no_token() {
    let _serial = serial();
    let pki = Pki::new("loopback");
    pki.ca("ca");
    pki.issue("ca", "server", 4001, Usage::Server([127, 0, 0, 1].into()));
    let address = format!("127.0.0.1:{}", free_port());
    let args: Vec<String> = [
        "--listen",
        &address,
        "--tls-cert-file",
        &path_arg(&pki.path("server.pem")),
        "--tls-key-file",
        &path_arg(&pki.path("server.key")),
    ]
    .map(str::to_owned)
    .to_vec();
    let ca = path_arg(&pki.path("ca.pem"));
    let get = |path: &str| {
        Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "60",
                "--cacert",
                &ca,
                "-o",
                "-",
                "-w",
                "\n%{http_code}",
            ])
            .arg(format!("https://{address}{path}"))
            .output()
            .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
            .unwrap_or_default()
    };
    let _daemon = TlsDaemon::start(&args, pki.path("daemon.log"), || get("/metrics").ends_with("200"));
    // Root over loopback TLS is identified by the kernel, as over plain TCP.
    let top = get("/top?seconds=5");
    assert!(top.ends_with("200"), "root over loopback TLS: {top}");
}
