//! Issue 15, TLS: the daemon listens beyond loopback (this side of a veth
//! pair) over TLS, and its clients run in another network namespace, where
//! the kernel cannot tell the daemon who they are — as for scrapers on other
//! machines. Certificates are made for each run with the openssl CLI.

use std::{
    io::Read,
    net::TcpStream,
    process::Command,
    time::{Duration, Instant},
};

use profilerd_tests::{
    Workload,
    daemon::{free_port, go_pprof, metric, parse_raw},
    pki::{Pki, Remote, Usage},
    promtool, serial,
    tls_daemon::{TlsDaemon, curl, path_arg, within_30s},
};

const ROOT_SECRET: &str = env!("WORKLOAD_ROOT_SECRET");
const TOKEN: &str = "a-test-token-of-32-characters-00";

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
    // curl accepts */*: the text format 0.0.4, TLS families included.
    if let Err(failure) = promtool::check_metrics(&metrics) {
        panic!("promtool check metrics must pass on /metrics over TLS: {failure}\n{metrics}");
    }
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
