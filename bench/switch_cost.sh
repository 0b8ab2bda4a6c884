#!/usr/bin/env bash
# Cost of profilerd on a context-switch storm: pipe ping-pong round trips per
# second without the daemon, with it (sampling at 99 Hz), and with off-CPU
# profiling on (the sched_switch program), alternating runs so drift affects
# all alike. Prints the medians, the slowdowns, the off-CPU program's BPF time
# per switch (kernel.bpf_stats_enabled) and the off-CPU events lost or skipped.
# Usage: bench/switch_cost.sh [RUNS] [ROUND_TRIPS]   (root; builds first)
# OFFCPU_ARGS adds flags to the off-CPU runs, e.g.
#   OFFCPU_ARGS="--off-cpu-sample-every 16" bench/switch_cost.sh
# Both ping-pong threads run on CPU 0 (PINGPONG_CPUS=0): every round trip is
# then two context switches on one CPU, the worst case per switch. Unpinned
# (PINGPONG_CPUS=), the rate on this VM swings by 30% with where the threads
# land and how deeply the other vCPU idles, hiding the profiler's cost.
pin="${PINGPONG_CPUS-0}"
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs="${1:-7}"
trips="${2:-300000}"
offcpu_args="${OFFCPU_ARGS:-}"
cd "$root"
cargo build --release -p profiler-daemon >/dev/null 2>&1
work="$(mktemp -d)"
stats_before="$(cat /proc/sys/kernel/bpf_stats_enabled)"
trap 'kill "${daemon:-0}" 2>/dev/null || true; echo "$stats_before" >/proc/sys/kernel/bpf_stats_enabled; rm -rf "$work"' EXIT
echo 1 >/proc/sys/kernel/bpf_stats_enabled
cc -O2 -pthread -o "$work/pingpong" bench/pingpong.c

pingpong() {
    if [ -n "$pin" ]; then
        taskset -c "$pin" "$work/pingpong" "$@"
    else
        "$work/pingpong" "$@"
    fi
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

# Starts the daemon with extra flags and waits until it answers.
start_daemon() {
    local port=$((7300 + RANDOM % 500))
    # shellcheck disable=SC2086
    target/release/profilerd --listen "127.0.0.1:$port" "$@" >"$work/daemon.log" 2>&1 &
    daemon=$!
    url="http://127.0.0.1:$port"
    for _ in $(seq 100); do
        curl -sf "$url/metrics" >/dev/null 2>&1 && return
        sleep 0.1
    done
    echo "the daemon did not start:" >&2
    cat "$work/daemon.log" >&2
    exit 1
}

stop_daemon() {
    kill -TERM "$daemon"
    wait "$daemon" || true
}

# run_time_ns and run_cnt of the running daemon's on_switch program.
switch_stats() {
    bpftool prog show name on_switch --json 2>/dev/null |
        python3 -c 'import json,sys
p = json.load(sys.stdin)
p = p[0] if isinstance(p, list) else p
print(p.get("run_time_ns", 0), p.get("run_cnt", 0))'
}

without=()
with=()
offcpu=()
switch_ns=0
switches=0
lost=""
for _ in $(seq "$runs"); do
    without+=("$(pingpong "$trips")")
    start_daemon
    with+=("$(pingpong "$trips")")
    stop_daemon
    # shellcheck disable=SC2086
    start_daemon --off-cpu $offcpu_args
    read -r ns0 cnt0 < <(switch_stats)
    offcpu+=("$(pingpong "$trips")")
    read -r ns1 cnt1 < <(switch_stats)
    switch_ns=$((switch_ns + ns1 - ns0))
    switches=$((switches + cnt1 - cnt0))
    lost="$(curl -s "$url/metrics" | grep -E '^profilerd_(samples_lost_total|sampler_events_total)\{(reason|event)="(off_cpu|counts_map_full)' || true)"
    stop_daemon
done
base=$(printf '%s\n' "${without[@]}" | median)
loaded=$(printf '%s\n' "${with[@]}" | median)
off=$(printf '%s\n' "${offcpu[@]}" | median)
echo "pipe ping-pong, $trips round trips, $runs runs each (median), threads on CPU(s) ${pin:-any}:"
echo "  without profilerd:           $base round trips/s"
echo "  with profilerd:              $loaded round trips/s"
echo "  with profilerd --off-cpu $offcpu_args: $off round trips/s"
awk -v a="$base" -v b="$loaded" 'BEGIN { printf "  slowdown (CPU sampling):     %.2f%%\n", (a - b) * 100 / a }'
awk -v a="$base" -v b="$off" 'BEGIN { printf "  slowdown (with off-CPU):     %.2f%%\n", (a - b) * 100 / a }'
awk -v ns="$switch_ns" -v n="$switches" 'BEGIN { if (n > 0) printf "  off-CPU BPF time per switch: %.0f ns over %d switches\n", ns / n, n }'
echo "  off-CPU counters of the last run:"
printf '%s\n' "$lost" | sed 's/^/    /'
