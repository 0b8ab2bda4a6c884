//! For the TLS tests: throwaway certificates made with the `openssl` CLI,
//! and a client "on another machine": a network namespace joined to this
//! one by a veth pair. The daemon listens on this side's address, which is
//! not loopback, and socket diagnostics in the daemon's namespace cannot
//! see the client's sockets, so the kernel cannot name its user — as for a
//! real remote scraper. The traffic never leaves the machine.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
};

/// A directory of certificates and keys, removed on drop.
pub struct Pki {
    pub dir: PathBuf,
}

/// What a certificate is for.
pub enum Usage {
    /// A server reached at this IP address (the name clients check).
    Server(Ipv4Addr),
    Client,
}

impl Pki {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("profilerd-pki-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the PKI directory");
        Self { dir }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// A self-signed CA: NAME.pem and NAME.key.
    pub fn ca(&self, name: &str) {
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &self.text(&format!("{name}.key")),
            "-out",
            &self.text(&format!("{name}.pem")),
        ]);
    }

    /// A certificate NAME.pem (and its key NAME.key) that CA signed, with
    /// this serial number.
    pub fn issue(&self, ca: &str, name: &str, serial: u32, usage: Usage) {
        let key = self.text(&format!("{name}.key"));
        let request = self.text(&format!("{name}.csr"));
        openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &key,
            "-out",
            &request,
        ]);
        let extensions = self.path(&format!("{name}.ext"));
        let text = match usage {
            Usage::Server(ip) => format!("subjectAltName=IP:{ip}\nextendedKeyUsage=serverAuth\n"),
            Usage::Client => "extendedKeyUsage=clientAuth\n".to_owned(),
        };
        std::fs::write(&extensions, text).expect("writing the extensions");
        openssl(&[
            "x509",
            "-req",
            "-in",
            &request,
            "-CA",
            &self.text(&format!("{ca}.pem")),
            "-CAkey",
            &self.text(&format!("{ca}.key")),
            "-set_serial",
            &serial.to_string(),
            "-days",
            "2",
            "-extfile",
            &self.text(&format!("{name}.ext")),
            "-out",
            &self.text(&format!("{name}.pem")),
        ]);
    }

    fn text(&self, file: &str) -> String {
        self.path(file)
            .to_str()
            .expect("a UTF-8 temporary path")
            .to_owned()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `openssl ARGS`; its standard output.
pub fn openssl(args: &[&str]) -> String {
    let output = Command::new("openssl")
        .args(args)
        .output()
        .expect("running openssl (installed by scripts/setup.sh)");
    assert!(
        output.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The SHA-256 fingerprint of a PEM certificate, as profilerd logs it.
pub fn fingerprint(certificate: &Path) -> String {
    let text = openssl(&[
        "x509",
        "-noout",
        "-fingerprint",
        "-sha256",
        "-in",
        certificate.to_str().expect("a UTF-8 path"),
    ]);
    text.trim()
        .rsplit_once('=')
        .map(|(_, value)| value.to_owned())
        .unwrap_or_else(|| panic!("no fingerprint in {text:?}"))
}

/// A network namespace joined to ours by a veth pair; deleted on drop
/// (which deletes the pair).
pub struct Remote {
    namespace: String,
    /// Our side: the address the daemon listens on.
    pub host_ip: Ipv4Addr,
    /// The namespace's side.
    pub remote_ip: Ipv4Addr,
}

impl Remote {
    pub fn new() -> Self {
        let pid = std::process::id();
        let namespace = format!("profilerd-tls-{pid}");
        // Interface names have at most 15 characters; pids at most 7 digits.
        let (host_link, remote_link) = (format!("pdt{pid}h"), format!("pdt{pid}r"));
        let third = (pid % 256) as u8;
        let fourth = ((pid / 256) % 64 * 4) as u8;
        let host_ip = Ipv4Addr::new(10, 233, third, fourth + 1);
        let remote_ip = Ipv4Addr::new(10, 233, third, fourth + 2);
        // What an earlier run with the same pid may have left.
        let _ = Command::new("ip").args(["netns", "del", &namespace]).output();
        let _ = Command::new("ip").args(["link", "del", &host_link]).output();
        let remote = Self {
            namespace,
            host_ip,
            remote_ip,
        };
        ip(&["netns", "add", &remote.namespace]);
        ip(&[
            "link",
            "add",
            &host_link,
            "type",
            "veth",
            "peer",
            "name",
            &remote_link,
        ]);
        ip(&["link", "set", &remote_link, "netns", &remote.namespace]);
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_link]);
        ip(&["link", "set", &host_link, "up"]);
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &remote.namespace, "ip"];
            all.extend_from_slice(args);
            ip(&all);
        };
        inside(&["addr", "add", &format!("{remote_ip}/30"), "dev", &remote_link]);
        inside(&["link", "set", &remote_link, "up"]);
        inside(&["link", "set", "lo", "up"]);
        remote
    }

    /// `program` run inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.namespace, program]);
        command
    }
}

impl Default for Remote {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.namespace])
            .output();
    }
}

fn ip(args: &[&str]) {
    let output = Command::new("ip")
        .args(args)
        .output()
        .expect("running ip (iproute2, installed by scripts/setup.sh)");
    assert!(
        output.status.success(),
        "ip {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
