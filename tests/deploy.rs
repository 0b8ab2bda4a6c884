//! deploy/: the install script into a DESTDIR, and the unit checked by
//! systemd's own analyzer and shellcheck. tests/systemd.rs boots a real
//! systemd and runs the unit.

use std::{path::Path, process::Command};

use profilerd_tests::profilerd_bin;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository root")
}

fn install(destdir: &Path, args: &[&str]) -> String {
    let output = Command::new(repo().join("deploy/install.sh"))
        .args(args)
        .env("DESTDIR", destdir)
        .env("PROFILERD_BIN", profilerd_bin())
        .output()
        .expect("running deploy/install.sh");
    assert!(
        output.status.success(),
        "install.sh {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn install_honours_destdir_keeps_an_edited_config_and_uninstalls() {
    let dest = std::env::temp_dir().join(format!("profilerd-destdir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dest);
    install(&dest, &[]);
    let binary = dest.join("usr/local/bin/profilerd");
    let unit = dest.join("etc/systemd/system/profilerd.service");
    let config = dest.join("etc/profilerd/profilerd.toml");
    for file in [&binary, &unit, &config] {
        assert!(file.exists(), "{} should be installed", file.display());
    }
    std::fs::write(&config, "frequency = 49\n").expect("editing the config");
    let again = install(&dest, &[]);
    assert!(
        again.contains("keeping the existing"),
        "a second install says it keeps the config: {again}"
    );
    assert_eq!(
        std::fs::read_to_string(&config).expect("config"),
        "frequency = 49\n",
        "never overwritten"
    );

    install(&dest, &["--uninstall"]);
    assert!(
        !binary.exists() && !unit.exists(),
        "uninstall removes the binary and the unit"
    );
    assert!(config.exists(), "and keeps the config");
    install(&dest, &["--uninstall", "--purge"]);
    assert!(!config.exists(), "--purge removes the config too");
    let _ = std::fs::remove_dir_all(&dest);
}

#[test]
fn the_unit_passes_systemd_analyze_with_exposure_at_most_2_1() {
    let unit = repo().join("deploy/profilerd.service");
    let output = Command::new("systemd-analyze")
        .args(["security", "--offline=yes"])
        .arg(&unit)
        .output()
        .expect("running systemd-analyze (package systemd)");
    let text = String::from_utf8_lossy(&output.stdout);
    let exposure: f64 = text
        .lines()
        .find_map(|line| line.split("exposure level for profilerd.service:").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no exposure figure in:\n{text}"));
    assert!(
        exposure <= 2.1,
        "systemd-analyze security exposure {exposure} > 2.1:\n{text}"
    );

    // verify: the only acceptable complaint is the binary not being installed on this host.
    let output = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&unit)
        .output()
        .expect("verify");
    let complaints: Vec<String> = String::from_utf8_lossy(&output.stderr)
        .lines()
        .filter(|line| !line.contains("/usr/local/bin/profilerd"))
        .map(str::to_owned)
        .collect();
    assert!(complaints.is_empty(), "systemd-analyze verify: {complaints:?}");
}

#[test]
fn install_sh_is_shellcheck_clean() {
    let output = Command::new("shellcheck")
        .arg(repo().join("deploy/install.sh"))
        .output()
        .expect("running shellcheck (scripts/setup.sh installs it)");
    assert!(
        output.status.success(),
        "shellcheck deploy/install.sh:\n{}",
        String::from_utf8_lossy(&output.stdout)
    );
}
