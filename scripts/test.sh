#!/usr/bin/env bash
# Sets up this machine for the tests (idempotent), then runs every check and
# the whole test suite: formatting, lints, unit tests and the integration
# tests that load the real BPF sampler (root required; BPF tests fail loudly
# rather than skip). Every test file runs even when one fails; a summary at
# the end lists each file with its result and time.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup-tests.sh"
cd "$root"
# shellcheck source=scripts/toolchain.env
source "$root/scripts/toolchain.env"

started=$SECONDS
checks=()
failed=0
step() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }
# check NAME COMMAND...: runs a check, remembers its result and time, goes on.
check() {
    local name="$1" at=$SECONDS
    shift
    step "$name"
    if "$@"; then
        checks+=("$(printf 'ok      %5d s  %s' $((SECONDS - at)) "$name")")
    else
        checks+=("$(printf 'FAILED  %5d s  %s' $((SECONDS - at)) "$name")")
        failed=1
    fi
}

check "cargo fmt --check" cargo fmt --all -- --check

check "cargo clippy (userspace, -D warnings)" cargo clippy --release --all-targets -- -D warnings

# The same target, build-std and cfg as profiler-daemon/build.rs (through
# aya-build) uses, so clippy sees exactly the code the verifier gets; its own
# target directory keeps it from invalidating the host build.
bpf_clippy() {
    CARGO_ENCODED_RUSTFLAGS="--cfg=bpf_target_arch=\"$(uname -m)\"" \
        rustup run "$BPF_TOOLCHAIN" cargo clippy --release \
        --package profiler-ebpf --package profiler-common --lib --bins \
        --target bpfel-unknown-none -Z build-std=core --target-dir target/bpf-clippy \
        -- -D warnings
}
check "cargo clippy (BPF crate, pinned nightly, bpfel-unknown-none, -D warnings)" bpf_clippy

check "build" cargo build --release --all-targets

# Integration tests measure CPU shares on a 2-CPU machine: one test at a
# time. --no-fail-fast: a failing file does not hide the others' results.
log="$(mktemp /tmp/profilerd-test-log.XXXXXX)"
step "tests (output also in $log)"
tests_at=$SECONDS
set +e
cargo test --release --no-fail-fast -- --test-threads=1 2>&1 | tee "$log"
tests_status=${PIPESTATUS[0]}
set -e
[ "$tests_status" -eq 0 ] || failed=1

# One line per test binary: cargo says "Running <file>" (or "Doc-tests
# <crate>"), the binary ends with "test result: ... finished in <t>s"; a
# binary that died (signal, abort) has no result line.
summary() {
    awk '
        function flush() {
            if (name != "") {
                printf "%-7s %7.1f s  %4d passed %3d failed  %s\n", result == "" ? "DIED" : result, secs, passed, failed, name
            }
            name = ""; result = ""; secs = 0; passed = 0; failed = 0
        }
        /^ *Running / {
            flush()
            name = $2
            if (name == "unittests") {
                # "(target/release/deps/profiler_common-0123abcd)": the crate.
                crate = $4; sub(/.*\//, "", crate); sub(/-[0-9a-f]+\)$/, "", crate)
                name = crate ": " $3
            }
            next
        }
        /^ *Doc-tests / { flush(); name = "doc-tests of " $2; next }
        /^test result: / {
            result = ($3 == "ok.") ? "ok" : "FAILED"
            for (i = 1; i <= NF; i++) {
                if ($(i + 1) ~ /^passed;?$/) passed = $i
                if ($(i + 1) ~ /^failed;?$/) failed = $i
                if ($i == "in") { secs = $(i + 1); sub(/s$/, "", secs) }
            }
            tp += passed; tf += failed
        }
        END { flush(); printf "%d passed, %d failed\n", tp, tf > "/dev/stderr" }
    ' "$log"
}

step "summary ($((SECONDS - started)) s; tests $((SECONDS - tests_at)) s)"
for line in "${checks[@]}"; do
    printf '%s\n' "$line"
done
summary 2>"$log.total"
total="$(cat "$log.total")"
rm -f "$log.total"
if [ "$failed" -ne 0 ]; then
    printf '\nFAILED: see the lines above marked FAILED or DIED (full output: %s)\n' "$log"
fi
printf 'tests: %s\n' "$total"
exit "$failed"
