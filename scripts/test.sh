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

step "cargo clippy (BPF crate, pinned nightly, bpfel-unknown-none, -D warnings)"
# shellcheck source=scripts/toolchain.env
source "$root/scripts/toolchain.env"
# The same target, build-std and cfg as profiler-daemon/build.rs (through
# aya-build) uses, so clippy sees exactly the code the verifier gets; its own
# target directory keeps it from invalidating the host build.
CARGO_ENCODED_RUSTFLAGS="--cfg=bpf_target_arch=\"$(uname -m)\"" \
    rustup run "$BPF_TOOLCHAIN" cargo clippy --release \
    --package profiler-ebpf --package profiler-common --lib --bins \
    --target bpfel-unknown-none -Z build-std=core --target-dir target/bpf-clippy \
    -- -D warnings

step "build"
cargo build --release --all-targets

step "tests"
# Integration tests measure CPU shares on a 2-CPU machine: one test at a time.
cargo test --release -- --test-threads=1
