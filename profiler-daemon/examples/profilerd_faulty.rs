//! `profilerd` with a fault hook, for the supervision tests only:
//! `PROFILERD_FAULT=panic:STAGE:SECONDS` makes STAGE panic SECONDS after
//! the start (see `profilerd::supervise::inject_fault`). Otherwise it is the
//! shipped daemon, whose own binary reads no such variable.

use std::{process::ExitCode, time::Duration};

fn main() -> ExitCode {
    if let Some(spec) = std::env::var_os("PROFILERD_FAULT") {
        let spec = spec.to_string_lossy();
        let mut parts = spec.splitn(3, ':');
        match (parts.next(), parts.next(), parts.next().map(str::parse::<u64>)) {
            (Some("panic"), Some(stage), Some(Ok(seconds))) => {
                profilerd::supervise::inject_fault(stage, Duration::from_secs(seconds));
            }
            _ => {
                eprintln!("profilerd-faulty: PROFILERD_FAULT={spec:?} is not panic:STAGE:SECONDS");
                return ExitCode::from(2);
            }
        }
    }
    profilerd::entry::run()
}
