//! Issue 15, TLS with client certificates (mutual TLS) and their reload on
//! SIGHUP; the setting of tests/tls.rs: the daemon beyond loopback, its
//! clients in another network namespace.

use std::{path::Path, process::Command, time::Duration};

use profilerd_tests::{
    Workload,
    daemon::{free_port, metric, parse_raw},
    pki::{Pki, Remote, Usage, fingerprint},
    serial,
    tls_daemon::{TlsDaemon, curl, path_arg, within_30s},
};

const ROOT_SECRET: &str = env!("WORKLOAD_ROOT_SECRET");

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
