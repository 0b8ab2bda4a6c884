#!/usr/bin/env bash
# What exact per-thread CPU time costs (collect/thread_cpu.rs: at every drain
# each thread of the processes with CPU samples has its time read from /proc
# and its unsampled CPU credited): the daemon's CPU as a share of one core
# over MEASURE_SECONDS (20) at the default 99 Hz, the ledger's own share
# (profilerd_thread_cpu_ledger_seconds_total), the threads read per drain,
# and the BPF time of the exit tracepoint (which records exiting threads'
# CPU), for:
#   - nothing running (the daemon at rest);
#   - 1 process of 8 threads, each burning 1 ms every 10 ms;
#   - 20 processes of 50 threads (1000 threads), each burning 0.1 ms every 100 ms;
#   - a fork storm (short processes), for the exit tracepoint.
# Usage: bench/thread_cpu_cost.sh [RUNS]   (root; uses the built target/release/profilerd).
# Each row: the median of RUNS (3) runs.
set -euo pipefail
export LC_ALL=C
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=bench/daemon_cpu.sh
source "$root/bench/daemon_cpu.sh"
need_daemon
runs="${1:-3}"
measure="${MEASURE_SECONDS:-20}"
cc -O2 -pthread -o "$work/rhythm_threads" bench/rhythm_threads.c
sysctl -qw kernel.bpf_stats_enabled=1

# run_time_ns and run_cnt of the daemon's exit tracepoint program.
# (bench/run.sh installs bpftool; without it the column reads 0.)
exit_stats() {
    command -v bpftool >/dev/null || { echo 0 0; return; }
    bpftool prog show --json 2>/dev/null | python3 -c '
import json, sys
for p in json.load(sys.stdin):
    if p.get("name") == "on_exit":
        print(p.get("run_time_ns", 0), p.get("run_cnt", 0)); break
else:
    print(0, 0)'
}

# run MODE: prints "daemon% ledger% reads/drain exit-ns"
run() {
    port=$((7600 + RANDOM % 300))
    target/release/profilerd --listen "127.0.0.1:$port" >"$work/daemon.log" 2>&1 &
    daemon=$!
    until curl -sf "http://127.0.0.1:$port/metrics" >/dev/null; do sleep 0.2; done
    load=
    case "$1" in
        few) "$work/rhythm_threads" 1 8 10000 1000 $((measure + 10)) & load=$! ;;
        many) "$work/rhythm_threads" 20 50 100000 100 $((measure + 10)) & load=$! ;;
        forks) (end=$((SECONDS + measure + 10)); while [ "$SECONDS" -lt "$end" ]; do /bin/true; done) & load=$! ;;
    esac
    # Past start-up (the symbolizer's workers start with the first samples).
    sleep 8
    local before after ledger_before ledger_after reads_before reads_after drains_before drains_after exit_before exit_after
    before="$(ticks)"
    ledger_before="$(metric profilerd_thread_cpu_ledger_seconds_total)"
    reads_before="$(metric profilerd_thread_cpu_reads_total)"
    drains_before="$(metric profilerd_drains_total)"
    exit_before="$(exit_stats)"
    sleep "$measure"
    after="$(ticks)"
    ledger_after="$(metric profilerd_thread_cpu_ledger_seconds_total)"
    reads_after="$(metric profilerd_thread_cpu_reads_total)"
    drains_after="$(metric profilerd_drains_total)"
    exit_after="$(exit_stats)"
    kill "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
    if [ -n "$load" ]; then
        pkill -P "$load" 2>/dev/null || true
        kill "$load" 2>/dev/null || true
        wait "$load" 2>/dev/null || true
    fi
    awk -v t=$((after - before)) -v hz="$hz" -v s="$measure" \
        -v l0="$ledger_before" -v l1="$ledger_after" -v r0="$reads_before" -v r1="$reads_after" \
        -v d0="$drains_before" -v d1="$drains_after" -v e0="$exit_before" -v e1="$exit_after" 'BEGIN {
            split(e0, a, " "); split(e1, b, " ")
            calls = b[2] - a[2]
            # (A bare > in print arguments would redirect to a file.)
            reads = 0; if (d1 - d0 > 0) reads = (r1 - r0) / (d1 - d0)
            per_exit = 0; if (calls > 0) per_exit = (b[1] - a[1]) / calls
            printf "%.3f %.4f %.0f %.0f\n", t / hz / s * 100, (l1 - l0) / s * 100, reads, per_exit
        }'
}

printf '%-44s %10s %10s %12s %14s\n' "load (median of $runs runs)" "daemon %" "ledger %" "reads/drain" "on_exit ns"
for mode in idle few many forks; do
    rows=()
    for _ in $(seq "$runs"); do
        rows+=("$(run "$mode")")
    done
    case "$mode" in
        idle) name="nothing running" ;;
        few) name="1 process x 8 threads, 1 ms / 10 ms" ;;
        many) name="20 processes x 50 threads, 0.1 ms / 100 ms" ;;
        forks) name="fork storm (/bin/true in a loop)" ;;
    esac
    column() { for row in "${rows[@]}"; do echo "$row" | awk -v c="$1" '{print $c}'; done; }
    # shellcheck disable=SC2046
    printf '%-44s %10s %10s %12s %14s\n' "$name" "$(med $(column 1))" "$(med $(column 2))" \
        "$(med $(column 3))" "$(med $(column 4))"
done
