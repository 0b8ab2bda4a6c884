//! An unprivileged local user for the hostile-input tests: every attack runs
//! as this user, with no capability and no group of root's, as a stranger
//! logged into the machine would.

use std::{
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

/// The account the tests create (idempotently) and attack as.
pub const USER: &str = "profilerd-attacker";

pub struct Attacker {
    pub uid: u32,
    pub gid: u32,
}

/// The attacker account, created on first use.
pub fn attacker() -> &'static Attacker {
    static ATTACKER: OnceLock<Attacker> = OnceLock::new();
    ATTACKER.get_or_init(|| {
        if id(&["-u", USER]).is_none() {
            let status = Command::new("useradd")
                .args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    USER,
                ])
                .status()
                .expect("running useradd (the tests need root)");
            assert!(status.success(), "useradd {USER} failed: {status}");
        }
        Attacker {
            uid: id(&["-u", USER]).expect("the attacker's uid"),
            gid: id(&["-g", USER]).expect("the attacker's gid"),
        }
    })
}

fn id(args: &[&str]) -> Option<u32> {
    let output = Command::new("id").args(args).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().parse().ok())
        .flatten()
}

impl Attacker {
    /// A command that runs as the attacker (std clears supplementary groups
    /// when it changes the uid from root).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(program);
        command.uid(self.uid).gid(self.gid);
        command
    }

    /// A GET made by curl as the attacker, so the daemon identifies the
    /// caller from the kernel as it would any client: (status, body).
    pub fn curl(&self, url: &str) -> (u16, Vec<u8>) {
        let output = self
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
        (String::from_utf8_lossy(&status).parse().unwrap_or(0), body)
    }

    /// A fresh directory the attacker owns, under `base` (which must be
    /// reachable by it), removed and recreated on each call.
    pub fn workdir(&self, base: &Path, name: &str) -> PathBuf {
        let dir = base.join(format!("profilerd-attack-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|err| panic!("creating {}: {err}", dir.display()));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|err| panic!("chmod {}: {err}", dir.display()));
        std::os::unix::fs::chown(&dir, Some(self.uid), Some(self.gid))
            .unwrap_or_else(|err| panic!("chown {}: {err}", dir.display()));
        dir
    }

    /// Copies `source` into `dir` as the attacker's own file (mode 0755).
    pub fn own_copy(&self, source: &Path, dir: &Path, name: &str) -> PathBuf {
        let target = dir.join(name);
        std::fs::copy(source, &target)
            .unwrap_or_else(|err| panic!("copying {} to {}: {err}", source.display(), target.display()));
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|err| panic!("chmod {}: {err}", target.display()));
        std::os::unix::fs::chown(&target, Some(self.uid), Some(self.gid))
            .unwrap_or_else(|err| panic!("chown {}: {err}", target.display()));
        target
    }
}
