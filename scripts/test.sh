#!/usr/bin/env bash
# Sets up this machine (idempotent), then runs every check and the whole test
# suite: formatting, lints, unit tests and the integration tests that load the
# real BPF sampler (root required; BPF tests fail loudly rather than skip).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
cd "$root"

step() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (userspace, -D warnings)"
cargo clippy --release --all-targets -- -D warnings

step "build"
cargo build --release --all-targets

step "tests"
# Integration tests measure CPU shares on a 2-CPU machine: one test at a time.
cargo test --release -- --test-threads=1
