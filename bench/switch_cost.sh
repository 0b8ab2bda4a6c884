#!/usr/bin/env bash
# Cost of profilerd on a context-switch storm: pipe ping-pong round trips per
# second without the daemon and with it (sampling at 99 Hz), alternating runs
# so drift affects both alike. Prints the medians and the slowdown.
# Usage: bench/switch_cost.sh [RUNS] [ROUND_TRIPS]   (root; builds first)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs="${1:-7}"
trips="${2:-300000}"
cd "$root"
cargo build --release -p profiler-daemon >/dev/null 2>&1
work="$(mktemp -d)"
trap 'kill "${daemon:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
cc -O2 -pthread -o "$work/pingpong" bench/pingpong.c

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

without=()
with=()
for _ in $(seq "$runs"); do
    without+=("$("$work/pingpong" "$trips")")
    target/release/profilerd --listen 127.0.0.1:0 >"$work/daemon.log" 2>&1 &
    daemon=$!
    sleep 1
    with+=("$("$work/pingpong" "$trips")")
    kill -TERM "$daemon"
    wait "$daemon" || true
done
base=$(printf '%s\n' "${without[@]}" | median)
loaded=$(printf '%s\n' "${with[@]}" | median)
echo "pipe ping-pong, $trips round trips, $runs runs each (median):"
echo "  without profilerd: $base round trips/s"
echo "  with profilerd:    $loaded round trips/s"
awk -v a="$base" -v b="$loaded" 'BEGIN { printf "  slowdown: %.2f%%\n", (a - b) * 100 / a }'
