#!/usr/bin/env bash
# Runs the integration tests that count samples while two extra busy
# processes load both CPUs: their expectations come from the CPU time the
# workloads actually got, so they must pass on a busy machine too.
#
#   ./scripts/test-under-load.sh                 # the sample-counting test files
#   ./scripts/test-under-load.sh sampling http   # only these
#
# Each test's figures (samples got / expected from CPU time) are printed as
# the tests run; a summary at the end lists each file's result and how much
# CPU the two burners took. Exits non-zero if any file failed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

files=("$@")
if [ "${#files[@]}" -eq 0 ]; then
    files=(sampling cpu_time http views faults unwinding)
fi

log() { printf '\033[1mtest-under-load:\033[0m %s\n' "$*" >&2; }

# Built before the load starts: the burners are there to load the tests.
log "building"
cargo build --release
cargo test --release -p profilerd-tests --no-run "${files[@]/#/--test=}" >/dev/null

burners=()
# shellcheck disable=SC2317 # run by the EXIT trap
stop_burners() {
    if [ "${#burners[@]}" -gt 0 ]; then
        kill "${burners[@]}" 2>/dev/null || true
        wait "${burners[@]}" 2>/dev/null || true
    fi
}
trap stop_burners EXIT
trap 'exit 130' INT TERM

# Plain busy loops at normal priority, one per CPU of this 2-CPU machine.
for _ in 1 2; do
    (while :; do :; done) &
    burners+=("$!")
done
log "burners running: pids ${burners[*]} ($(nproc) CPUs)"

# utime + stime of a process, in seconds.
cpu_seconds() {
    awk -v hz="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); printf "%.1f", ($12 + $13) / hz }' "/proc/$1/stat"
}

started=$SECONDS
results=()
failed=0
for file in "${files[@]}"; do
    log "--test $file (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    file_started=$SECONDS
    if cargo test --release -p profilerd-tests --test "$file" -- --test-threads=1 --nocapture; then
        results+=("ok     $file ($((SECONDS - file_started)) s)")
    else
        results+=("FAILED $file ($((SECONDS - file_started)) s)")
        failed=1
    fi
done

wall=$((SECONDS - started))
log "summary (${wall} s of wall time):"
for result in "${results[@]}"; do
    printf '  %s\n' "$result" >&2
done
for pid in "${burners[@]}"; do
    printf '  burner %s: %s s of CPU in %s s\n' "$pid" "$(cpu_seconds "$pid")" "$wall" >&2
done
exit "$failed"
