#!/usr/bin/env bash
# Sets up this machine for the tests (idempotent), then runs every check and
# the whole test suite: formatting, lints, unit tests and the integration
# tests that load the real BPF sampler (root required; BPF tests fail loudly
# rather than skip). Every test file runs even when one fails; a summary at
# the end lists each check and test file with its result and time.
#
# Order, on a 2-CPU machine:
# - the cached fixtures (Parca, a Debian rootfs) build in the background
#   while fmt, clippy and the build run (the daemon with the fault hook,
#   profiler-daemon/examples/profilerd_faulty.rs, is one more small binary
#   of the build: a daemon built with a feature cost 11 min of both CPUs on
#   a fresh machine in a target directory of its own, 6 in the same one; and
#   the test crate does not depend on the daemon, so the fixtures start
#   building at once);
# - the test files that measure no CPU share run in two lanes at once
#   (every file that runs programs as the unprivileged test user stays in
#   one lane: some change what that user may see);
# - then the files that measure CPU shares and times, one at a time, alone.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup-tests.sh"
cd "$root"
# shellcheck source=scripts/toolchain.env
source "$root/scripts/toolchain.env"

# Lane 1 of the first phase: fleet, transport and deployment tests, and
# kernel frame names.
LANE_1=(parca pyroscope_push allocations_push tls tls_client_certificates metrics_format deploy kernel_names)
# Lane 2: the unprivileged user's tests, the containers, and the unit tests.
LANE_2=(access cgroups hostile_connections jit_hostile supervision scrapes visibility systemd systemd_units)
# Every other file of profilerd-tests (sampling, cpu_time, http, views,
# faults, unwinding, offcpu, the hostile ones that watch a root workload's
# samples, and any new file) runs in the second phase, alone.

started=$SECONDS
results=()
failed=0
logs="$(mktemp -d /tmp/profilerd-tests.XXXXXX)"
say() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }
# check NAME COMMAND...: runs a check, remembers its result and time, goes on.
check() {
    local name="$1" at=$SECONDS
    shift
    say "$name"
    if "$@"; then
        results+=("$(printf 'ok      %6d s  %s' $((SECONDS - at)) "$name")")
    else
        results+=("$(printf 'FAILED  %6d s  %s' $((SECONDS - at)) "$name")")
        failed=1
    fi
}

# The fixtures' builder is a small test binary (no daemon in it).
say "building the cached fixtures in the background (minutes on a fresh machine, seconds after; log: $logs/fixtures.log)"
cargo test --release -p profilerd-tests --test fixtures --no-run
fixtures_at=$SECONDS
cargo test --release -p profilerd-tests --test fixtures -- --ignored --nocapture >"$logs/fixtures.log" 2>&1 &
fixtures_pid=$!

check "cargo fmt --check" cargo fmt --all -- --check

check "cargo clippy (userspace, -D warnings)" cargo clippy --release --all-targets -- -D warnings

# The same target, build-std and cfg as profiler-daemon/build.rs (through
# aya-build) uses, so clippy sees exactly the code the verifier gets; its own
# target directory keeps it from invalidating the host build.
# shellcheck disable=SC2317 # run through check
bpf_clippy() {
    CARGO_ENCODED_RUSTFLAGS="--cfg=bpf_target_arch=\"$(uname -m)\"" \
        rustup run "$BPF_TOOLCHAIN" cargo clippy --release \
        --package profiler-ebpf --package profiler-common --lib --bins \
        --target bpfel-unknown-none -Z build-std=core --target-dir target/bpf-clippy \
        -- -D warnings
}
check "cargo clippy (BPF crate, pinned nightly, bpfel-unknown-none, -D warnings)" bpf_clippy

check "build" cargo build --release --all-targets

say "waiting for the cached fixtures"
if wait "$fixtures_pid"; then
    results+=("$(printf 'ok      %6d s  %s' $((SECONDS - fixtures_at)) "cached fixtures (Parca, Debian rootfs), in the background")")
else
    results+=("$(printf 'FAILED  %6d s  %s' $((SECONDS - fixtures_at)) "cached fixtures (see $logs/fixtures.log)")")
    failed=1
    tail -n 40 "$logs/fixtures.log"
fi

# tests LOG CARGO-TEST-ARGS...: one cargo test run, every binary even when
# one fails, one test at a time within each binary.
tests() {
    local log="$1"
    shift
    cargo test --release --no-fail-fast "$@" -- --test-threads=1 >"$log" 2>&1
}
as_args() { printf -- '--test\n%s\n' "$@"; }

mapfile -t lane_1 < <(as_args "${LANE_1[@]}")
mapfile -t lane_2 < <(as_args "${LANE_2[@]}")
# Every test file of profilerd-tests not in a lane (fixtures ran already).
mapfile -t alone < <(
    sed -n 's/^name = "\(.*\)"$/\1/p' tests/Cargo.toml | while read -r name; do
        [ -f "tests/$name.rs" ] || continue
        case " ${LANE_1[*]} ${LANE_2[*]} fixtures " in
            *" $name "*) ;;
            *) as_args "$name" ;;
        esac
    done
)

# The daemon crate's own test files (profiler-daemon/tests/*.rs, and
# tests/NAME/main.rs: cargo's test targets of more than one file).
mapfile -t daemon_files < <(
    for file in profiler-daemon/tests/*.rs profiler-daemon/tests/*/main.rs; do
        [ -f "$file" ] || continue
        case "$file" in
            */main.rs) name="$(basename "$(dirname "$file")")" ;;
            *) name="$(basename "$file" .rs)" ;;
        esac
        as_args "$name"
    done
)

say "tests, first phase: two lanes at once (${LANE_1[*]} | unit tests, ${LANE_2[*]}); logs in $logs"
tests_at=$SECONDS
lane_status=0
# Every cargo run selects the same packages (the workspace's default
# members) and picks its files with --lib, --bins and --test: another
# selection would unify features differently and rebuild, under the other
# lane's feet, the binaries it runs.
tests "$logs/lane-1.log" "${lane_1[@]}" &
lane_1_pid=$!
# Unit tests and the daemon crate's own test files, then the lane's files.
tests "$logs/lane-2-a-units.log" --lib --bins "${daemon_files[@]}" || lane_status=1
tests "$logs/lane-2-b-doc.log" --doc || lane_status=1
tests "$logs/lane-2-c.log" "${lane_2[@]}" || lane_status=1
wait "$lane_1_pid" || lane_status=1
for log in "$logs"/lane-*.log; do
    cat "$log"
done
say "first phase done in $((SECONDS - tests_at)) s"

say "tests, second phase: the files that measure CPU time, one at a time (log: $logs/alone.log)"
alone_status=0
tests "$logs/alone.log" "${alone[@]}" &
alone_pid=$!
tail -n +1 -f "$logs/alone.log" --pid "$alone_pid" 2>/dev/null || true
wait "$alone_pid" || alone_status=1
[ "$lane_status" -eq 0 ] && [ "$alone_status" -eq 0 ] || failed=1

# One line per test binary: cargo says "Running <file>" (or "Doc-tests
# <crate>"), the binary ends with "test result: ... finished in <t>s"; a
# binary that died (signal, abort) has no result line.
summary() {
    awk '
        function flush() {
            if (name != "") {
                printf "%-7s %6.0f s  %-40s %4d passed %3d failed\n", result == "" ? "DIED" : result, secs, name, passed, failed
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
        END { flush(); printf "%d passed, %d failed\n", tp, tf > "'"$logs/total"'" }
    ' "$@"
}

say "summary: $((SECONDS - started)) s in all, tests $((SECONDS - tests_at)) s"
for line in "${results[@]}"; do
    printf '%s\n' "$line"
done
echo "test files (first phase in two lanes, then one at a time):"
summary "$logs"/lane-*.log "$logs/alone.log"
if [ "$failed" -ne 0 ]; then
    printf '\nFAILED: see the lines above marked FAILED or DIED (full output in %s)\n' "$logs"
fi
printf 'tests: %s\n' "$(cat "$logs/total")"
exit "$failed"
