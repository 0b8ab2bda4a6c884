//! An unprivileged local user for the hostile-input tests: every attack runs
//! as this user, with no capability and no group of root's, as a stranger
//! logged into the machine would.

use std::{
    collections::HashMap,
    os::unix::{
        fs::{MetadataExt, PermissionsExt},
        process::CommandExt,
    },
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, OnceLock},
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
    /// when it changes the uid from root). A program the attacker could not
    /// reach by its path (one built under a 0700 home such as /root) runs
    /// from a copy it can reach, as it would be installed for a real user.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let program = Path::new(program.as_ref());
        let program = if program.components().count() > 1 && !self.can_execute(program) {
            reachable_copy(program)
        } else {
            program.to_path_buf()
        };
        let mut command = Command::new(program);
        command.uid(self.uid).gid(self.gid);
        command
    }

    /// Whether the attacker may search every directory up to `path` and
    /// execute it, by the permission bits the kernel checks.
    fn can_execute(&self, path: &Path) -> bool {
        let Ok(path) = std::fs::canonicalize(path) else {
            return false;
        };
        path.ancestors().all(|step| {
            std::fs::metadata(step).is_ok_and(|meta| {
                let mode = meta.mode();
                if meta.uid() == self.uid {
                    mode & 0o100 != 0
                } else if meta.gid() == self.gid {
                    mode & 0o010 != 0
                } else {
                    mode & 0o001 != 0
                }
            })
        })
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

/// A child process killed (and reaped) when dropped, whatever happens.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Attacker {
    /// Runs the attacker's own copy of `program` (as `name`, in a fresh
    /// directory `dir_name` under /tmp) with `args`: the directory, and the
    /// running process.
    pub fn run_own_copy(
        &self,
        program: &Path,
        dir_name: &str,
        name: &str,
        args: &[&str],
    ) -> (PathBuf, Killed) {
        let dir = self.workdir(Path::new("/tmp"), dir_name);
        let copy = self.own_copy(program, &dir, name);
        let child = self
            .command(&copy)
            .args(args)
            .spawn()
            .unwrap_or_else(|err| panic!("starting the attacker's {name}: {err}"));
        (dir, Killed(child))
    }
}

/// Root's copies of programs the attacker must run, one directory per test
/// process, under /tmp (which every user can search, whatever TMPDIR says).
fn reachable_copy(program: &Path) -> PathBuf {
    static COPIES: OnceLock<Mutex<HashMap<PathBuf, PathBuf>>> = OnceLock::new();
    let mut copies = COPIES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let count = copies.len();
    copies
        .entry(program.to_path_buf())
        .or_insert_with(|| {
            // A fresh directory (create_dir fails on one made by anybody
            // else), root's, 0755: the attacker may run, not replace, it.
            let dir = Path::new("/tmp").join(format!("profilerd-tests-bin-{}-{count}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir(&dir).unwrap_or_else(|err| panic!("creating {}: {err}", dir.display()));
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
                .unwrap_or_else(|err| panic!("chmod {}: {err}", dir.display()));
            let name = program.file_name().expect("a program path names a file");
            let copy = dir.join(name);
            std::fs::copy(program, &copy)
                .unwrap_or_else(|err| panic!("copying {} to {}: {err}", program.display(), copy.display()));
            std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755))
                .unwrap_or_else(|err| panic!("chmod {}: {err}", copy.display()));
            copy
        })
        .clone()
}
