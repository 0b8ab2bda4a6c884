#!/usr/bin/env bash
# What naming JIT code from perf maps costs the daemon: its CPU (and its
# worker processes', which read the maps) as a share of one core over
# MEASURE_SECONDS (20), at the default 99 Hz, with
#   - a busy Node process writing a perf map (--perf-basic-prof);
#   - the same process without one (its JIT code looked for a map once a
#     second, shown as [jit]);
#   - no Node at all (the daemon at rest, the baseline).
# Also the map's size and the worker reads made, from /metrics.
# Usage: bench/jit_cost.sh [RUNS]   (root; uses the built target/release/profilerd;
# node from the nodejs package). Each row: the median of RUNS (3) runs.
set -euo pipefail
export LC_ALL=C
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=bench/daemon_cpu.sh
source "$root/bench/daemon_cpu.sh"
need_daemon
runs="${1:-3}"
measure="${MEASURE_SECONDS:-20}"
command -v node >/dev/null || { echo "node is missing (apt-get install nodejs)" >&2; exit 1; }


# run MODE: prints the daemon's CPU % of a core over the measurement.
run() {
    port=$((7600 + RANDOM % 300))
    target/release/profilerd --listen "127.0.0.1:$port" >"$work/daemon.log" 2>&1 &
    daemon=$!
    until curl -sf "http://127.0.0.1:$port/metrics" >/dev/null; do sleep 0.2; done
    load=
    case "$1" in
        map) (cd "$work" && exec node --perf-basic-prof "$root/tests/workloads/jit/split.js" $((measure + 15)) "$work/stats") &
             load=$! ;;
        nomap) (cd "$work" && exec node "$root/tests/workloads/jit/split.js" $((measure + 15)) "$work/stats") &
               load=$! ;;
    esac
    sleep 5
    local before after
    before="$(ticks)"
    sleep "$measure"
    after="$(ticks)"
    if [ "$1" = map ]; then
        echo "  map: $(stat -c %s "/tmp/perf-$load.map" 2>/dev/null || echo 0) bytes, reads $(metric profilerd_perf_map_reads_total), symbols $(metric profilerd_perf_map_symbols)" >&2
    fi
    kill "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
    if [ -n "$load" ]; then
        kill "$load" 2>/dev/null || true
        wait "$load" 2>/dev/null || true
        rm -f "/tmp/perf-$load.map"
    fi
    awk -v t=$((after - before)) -v hz="$hz" -v s="$measure" 'BEGIN { printf "%.2f\n", t / hz / s * 100 }'
}

printf '%-40s %s\n' "configuration" "daemon + workers, % of a core (median of $runs)"
for mode in idle nomap map; do
    results=()
    for _ in $(seq "$runs"); do
        results+=("$(run "$mode")")
    done
    case "$mode" in
        idle) name="no node (baseline)" ;;
        nomap) name="node, no perf map ([jit])" ;;
        map) name="node --perf-basic-prof (named)" ;;
    esac
    printf '%-40s %s   (runs: %s)\n' "$name" "$(med "${results[@]}")" "${results[*]}"
done
