#!/usr/bin/env bash
# Cost of Python frames (issue 24), at 99 Hz with table unwinding:
# - the `sample` program's BPF time per sample (kernel.bpf_stats_enabled)
#   on a native workload (bench/python/native.c), on a busy CPython one
#   (bench/python/busy.py: 8 Python frames deep) with Python frames, and on
#   the same with --no-python-frames; one workload per CPU, so nearly every
#   sample is of the workload;
# - the daemon's CPU (utime+stime of it and its workers) over the window;
# - naming new code objects: a workload compiling a new function every few
#   milliseconds (bench/python/churn.py); the code objects read ahead (their
#   cost shows in the daemon's CPU against the busy row) and the
#   symbolizer's time per code object it read itself.
# Usage: bench/python_cost.sh [SECONDS]   (root; builds first)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-20}"
python="${PYTHON:-/usr/bin/python3.11}"
cd "$root"
cargo build --release -p profiler-daemon >/dev/null 2>&1
work="$(mktemp -d)"
stats_before="$(cat /proc/sys/kernel/bpf_stats_enabled)"
trap 'kill "${daemon:-0}" 2>/dev/null || true; echo "$stats_before" >/proc/sys/kernel/bpf_stats_enabled; rm -rf "$work"' EXIT
echo 1 >/proc/sys/kernel/bpf_stats_enabled
cc -O2 -fno-omit-frame-pointer -o "$work/native" bench/python/native.c
cpus="$(nproc)"

start_daemon() {
    local port=$((7300 + RANDOM % 500))
    target/release/profilerd --listen "127.0.0.1:$port" "$@" >"$work/daemon.log" 2>&1 &
    daemon=$!
    url="http://127.0.0.1:$port"
    for _ in $(seq 200); do
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

# run_time_ns run_cnt of the daemon's `sample` programs (one per CPU share one program).
sample_stats() {
    bpftool prog show name sample --json 2>/dev/null |
        python3 -c 'import json,sys
p = json.load(sys.stdin)
p = p if isinstance(p, list) else [p]
print(sum(x.get("run_time_ns", 0) for x in p), sum(x.get("run_cnt", 0) for x in p))'
}

# CPU seconds (user+system) of the daemon and its children so far.
daemon_cpu() {
    local total=0 pid
    for pid in $daemon $(pgrep -P "$daemon" || true); do
        total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)))
    done
    echo "$total $(getconf CLK_TCK)" | awk '{printf "%.3f", $1 / $2}'
}

metric() { curl -sf "$url/metrics" | awk -v name="$1" '$1 == name {print $2}'; }
# Code objects read ahead of their samples (python::prefetch).
read_ahead() { metric 'profilerd_python_code_announcements_total{outcome="read"}'; }

# measure LABEL COMMAND...: runs COMMAND on every CPU for $seconds after a
# 3 s warm-up, prints BPF ns/sample, daemon CPU % of a core.
measure() {
    local label="$1"
    shift
    local pids=()
    for _ in $(seq "$cpus"); do
        "$@" $((seconds + 5)) &
        pids+=($!)
    done
    sleep 3
    read -r ns0 cnt0 < <(sample_stats)
    local cpu0 reads0 read_s0
    cpu0="$(daemon_cpu)"
    reads0="$(metric profilerd_python_code_reads_total || echo 0)"
    read_s0="$(metric profilerd_python_code_read_seconds_total || echo 0)"
    local ahead0
    ahead0="$(read_ahead || echo 0)"
    sleep "$seconds"
    read -r ns1 cnt1 < <(sample_stats)
    local cpu1 reads1 read_s1
    cpu1="$(daemon_cpu)"
    reads1="$(metric profilerd_python_code_reads_total || echo 0)"
    read_s1="$(metric profilerd_python_code_read_seconds_total || echo 0)"
    local ahead1
    ahead1="$(read_ahead || echo 0)"
    wait "${pids[@]}"
    awk -v l="$label" -v ns=$((ns1 - ns0)) -v n=$((cnt1 - cnt0)) -v c0="$cpu0" -v c1="$cpu1" \
        -v s="$seconds" -v r0="${reads0:-0}" -v r1="${reads1:-0}" -v t0="${read_s0:-0}" -v t1="${read_s1:-0}" \
        -v a0="${ahead0:-0}" -v a1="${ahead1:-0}" 'BEGIN {
        reads = r1 - r0
        printf "%-34s %8.2f us/sample  %7d samples  daemon %.2f%% of a core", l, ns / n / 1000, n, (c1 - c0) / s * 100
        if (a1 - a0 > 0) printf "  %d code objects read ahead", a1 - a0
        if (reads > 0) printf "  %d read by the symbolizer, %.1f us each", reads, (t1 - t0) / reads * 1e6
        printf "\n"
    }'
}

echo "== $cpus CPUs, 99 Hz, ${seconds} s per row, $python"
start_daemon
measure "native (bench/python/native.c)" "$work/native"
measure "CPython, Python frames" "$python" bench/python/busy.py
measure "CPython, new code objects" "$python" bench/python/churn.py
echo "python walks: $(curl -sf "$url/metrics" | grep '^profilerd_python_walks_total' | tr '\n' ' ')"
stop_daemon
start_daemon --no-python-frames
measure "CPython, --no-python-frames" "$python" bench/python/busy.py
stop_daemon
