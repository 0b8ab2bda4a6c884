//! Supervision: a stage that ends ends the daemon, loudly and non-zero, so
//! that systemd restarts it; a daemon that cannot load its BPF programs exits
//! with a status the unit does not restart on. The faults are real panics,
//! raised inside the stage by the fault hook that only the test binary
//! `profilerd-faulty` sets from its environment; the shipped binary is
//! checked not to read it.

use std::time::Duration;

use profilerd_tests::{
    attacker::attacker,
    daemon::free_port,
    faulty::{LoggedDaemon, fault_injection_bin},
    profilerd_bin, serial,
};

/// EX_SOFTWARE: a stage ended (README, "Supervision").
const EXIT_STAGE_FAILED: i32 = 70;
/// EX_NOPERM: the BPF programs could not be loaded.
const EXIT_BPF_LOAD: i32 = 77;

/// Panics STAGE 3 s after the start; the daemon must exit 70 within 2 s of
/// the panic, with the stage and the panic's message in its log.
fn injected_panic_ends_the_daemon(stage: &str) {
    let _serial = serial();
    let bin = fault_injection_bin();
    let fault = format!("panic:{stage}:3");
    let mut daemon = LoggedDaemon::start(&bin, &[("PROFILERD_FAULT", &fault)]);
    let message = format!("injected fault in the {stage} stage");
    // The default panic hook's line ("thread '...' panicked at ...") comes
    // first, then the message on a line of its own.
    let panicked_at = daemon.wait_for_line(&message, Duration::from_secs(30));
    let (status, exited_at) = daemon.wait_exit(Duration::from_secs(10));
    let took = exited_at.saturating_duration_since(panicked_at);
    let log = daemon.log_text();
    eprintln!("{stage}: the daemon exited {took:?} after the panic ({status})");
    assert_eq!(
        status.code(),
        Some(EXIT_STAGE_FAILED),
        "after a panic in {stage}, the exit status (status {status}):\n{log}"
    );
    assert!(
        took <= Duration::from_secs(2),
        "the daemon exited {took:?} after the panic in {stage}, not within 2 s:\n{log}"
    );
    let reason = format!("the {stage} stage panicked: {message}");
    assert!(
        log.lines()
            .any(|line| line.contains("ERROR") && line.contains(&reason)),
        "no error line saying {reason:?}:\n{log}"
    );
    assert!(
        std::net::TcpStream::connect(&daemon.addr).is_err(),
        "{} still accepts connections after the exit",
        daemon.addr
    );
}

#[test]
fn a_panic_in_the_symbolize_stage_exits_non_zero_within_2_s() {
    injected_panic_ends_the_daemon("symbolize");
}

#[test]
fn a_panic_in_the_drain_stage_exits_non_zero_within_2_s() {
    injected_panic_ends_the_daemon("drain");
}

/// Only the test binary reads the variable that injects a fault.
#[test]
fn the_shipped_binary_has_no_fault_hook() {
    let contains = |bin: &std::path::Path| {
        let bytes = std::fs::read(bin).unwrap_or_else(|err| panic!("reading {}: {err}", bin.display()));
        bytes
            .windows(b"PROFILERD_FAULT".len())
            .any(|window| window == b"PROFILERD_FAULT")
    };
    let shipped = profilerd_bin();
    assert!(
        !contains(&shipped),
        "{} (cargo build --release) contains PROFILERD_FAULT: the shipped build reads the fault hook's variable",
        shipped.display()
    );
    // ...and the check can see it where it is.
    let faulty = fault_injection_bin();
    assert!(
        contains(&faulty),
        "{} is the fault hook's binary but has no PROFILERD_FAULT",
        faulty.display()
    );
}

/// Without CAP_BPF the load fails the same way on every attempt: status 77,
/// which the unit's RestartPreventExitStatus lists.
#[test]
fn a_bpf_load_failure_exits_with_the_no_restart_status() {
    let _serial = serial();
    let user = attacker();
    let dir = user.workdir(&std::env::temp_dir(), "supervision");
    let bin = user.own_copy(&profilerd_bin(), &dir, "profilerd");
    let output = user
        .command(&bin)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .output()
        .expect("running profilerd as an unprivileged user");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(EXIT_BPF_LOAD),
        "profilerd without privileges: status {}, stderr:\n{stderr}",
        output.status
    );
    assert!(
        stderr.contains("cannot load the BPF programs"),
        "the reason is missing from stderr:\n{stderr}"
    );
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/profilerd.service"
    ))
    .expect("reading deploy/profilerd.service");
    let prevented = unit
        .lines()
        .find_map(|line| line.strip_prefix("RestartPreventExitStatus="))
        .expect("RestartPreventExitStatus= in the unit");
    assert!(
        prevented.split_whitespace().any(|status| status == "77"),
        "the unit restarts on status 77 (RestartPreventExitStatus={prevented})"
    );
}
