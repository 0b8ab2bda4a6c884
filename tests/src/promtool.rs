//! `promtool check metrics` (Debian's `prometheus` package), the reference
//! reader of the Prometheus text format 0.0.4 and its linter.

use std::{
    io::Write,
    process::{Command, Stdio},
};

/// Runs `promtool check metrics` on `text` (its standard input): its output
/// if it passes (exit 0), else its exit status and output.
pub fn check_metrics(text: &str) -> Result<String, String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running promtool (Debian package prometheus; scripts/setup.sh installs it)");
    // promtool reads all of its input before it writes anything.
    child
        .stdin
        .take()
        .expect("promtool's standard input")
        .write_all(text.as_bytes())
        .expect("writing to promtool");
    let output = child.wait_with_output().expect("waiting for promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() {
        Ok(said)
    } else {
        Err(format!("promtool check metrics: {}\n{said}", output.status))
    }
}
