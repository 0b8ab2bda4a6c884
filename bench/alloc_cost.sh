#!/usr/bin/env bash
# Cost of allocation profiles (GET /debug/pprof/allocs) on a malloc storm
# (bench/malloc_storm.c: malloc(SIZE), touch a byte, free), in ns per
# malloc+free pair: untraced; traced by profilerd sampling one allocation per
# 512 KiB (the default) and every allocation (--alloc-sample-bytes 0), with
# --alloc-budget-percent 100 so the tracing is never cut (every call hits the
# probes either way: the sampling is decided in BPF); under valgrind's dhat
# and heaptrack. Also the added ns per probed call, (traced - untraced) / 2;
# per malloc (entry and return probes) and per free (entry probe), from the
# storm's split mode (64 mallocs timed, then their frees); and the BPF time
# per run of alloc_enter (malloc, free) and alloc_return (kernel.bpf_stats).
# Usage: bench/alloc_cost.sh [RUNS]   (root; uses the built target/release/profilerd)
# One daemon per configuration; its first window loads the programs (3-4 s
# here), so a 1 s warm-up window goes first (its window is counted from the
# attach). Then RUNS times, alternating: untraced runs (the daemon up,
# not tracing), then traced ones: a WINDOW_SECONDS (6) window asked for on a
# running storm, whose rates are taken from its progress lines from 1.5 s
# after the request (attached by then) to 1 s before the window's end; the
# alloc_enter runs over that span against the storm's calls ("coverage",
# ~1.00) check that the window covered it.
# The storm pins itself to CPU STORM_CPU (default 1; STORM_CPU= for none), the
# daemon and heaptrack's interpreter then run on the other one. On a 2-vCPU VM
# the untraced figure (10-20 ns) still swings with what the other vCPU runs
# (a build): noisy; the traced ones (microseconds) much less.
# SIZE (64): block size; RUN_SECONDS (2): an untraced, dhat or heaptrack run;
# STORM_MODE=ring keeps 64 blocks live (frees not immediate).
pin="${STORM_CPU-1}"
set -euo pipefail
export LC_ALL=C
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs="${1:-5}"
secs="${RUN_SECONDS:-2}"
window="${WINDOW_SECONDS:-6}"
size="${SIZE:-64}"
mode="${STORM_MODE:-pair}"
cd "$root"
if [ ! -x target/release/profilerd ]; then
    echo "target/release/profilerd is missing: build it first (cargo build --release -p profiler-daemon)" >&2
    exit 1
fi
work="$(mktemp -d)"
stats_before="$(cat /proc/sys/kernel/bpf_stats_enabled)"
trap 'kill "${daemon:-0}" "${storm_pid:-0}" 2>/dev/null || true; echo "$stats_before" >/proc/sys/kernel/bpf_stats_enabled; rm -rf "$work"' EXIT
echo 1 >/proc/sys/kernel/bpf_stats_enabled
cc -O2 -o "$work/malloc_storm" bench/malloc_storm.c
storm=("$work/malloc_storm" -s "$size" ${pin:+-c "$pin"})

# The median of a space-separated list.
# shellcheck disable=SC2086
med() { printf '%s\n' $1 | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
field() { awk -v k="$1=" '/^mode=/ {for (i = 1; i <= NF; i++) if (index($i, k) == 1) print substr($i, length(k) + 1)}'; }
calc() { awk "BEGIN { printf \"$1\", $2 }"; }
now_ns() { echo "${EPOCHREALTIME/./}000"; }
# Sleeps until $2 seconds after the time $1 (ns).
sleep_until() { sleep "$(awk -v t="$1" -v d="$2" -v n="$(now_ns)" 'BEGIN { s = (t - n) / 1e9 + d; print (s > 0 ? s : 0) }')"; }

# Starts the daemon with extra flags and waits until it answers.
start_daemon() {
    local port=$((7300 + RANDOM % 500))
    target/release/profilerd --listen "127.0.0.1:$port" --alloc-budget-percent 100 "$@" >"$work/daemon.log" 2>&1 &
    daemon=$!
    url="http://127.0.0.1:$port"
    for _ in $(seq 100); do
        curl -sf "$url/metrics" >/dev/null 2>&1 && return
        sleep 0.1
    done
    cat "$work/daemon.log" >&2
    echo "the daemon did not start" >&2
    exit 1
}

# run_time_ns and run_cnt of alloc_enter, then of alloc_return (summed over
# every loaded copy: only the running daemon's are attached).
bpf_stats() {
    bpftool prog show --json | jq -r 'def s(n): [.[] | select(.name == n)] |
        "\(map(.run_time_ns // 0) | add // 0) \(map(.run_cnt // 0) | add // 0)";
        "\(s("alloc_enter")) \(s("alloc_return"))"'
}

# Asks for a window of $1 seconds on the storm $storm_pid, in the background.
ask_window() {
    curl -s -D "$work/headers" -o "$work/allocs.pb" -w '%{http_code}' \
        "$url/debug/pprof/allocs?pid=$storm_pid&seconds=$1" >"$work/status" &
    curl_pid=$!
}

# Waits for the window's answer; a problem goes to the notes, as $1.
check_window() {
    wait "$curl_pid" || true
    local status cut
    status="$(cat "$work/status")"
    [ "$status" = 200 ] || notes+=("$1: the window answered HTTP $status: $(head -c 200 "$work/allocs.pb")")
    cut="$(grep -i '^profilerd-tracing-cut-short:' "$work/headers" | tr -d '\r' || true)"
    [ -z "$cut" ] || notes+=("$1: $cut")
}

# One traced window on a storm in mode $2, for configuration $1: its ns per
# pair (per malloc and per free in split mode), coverage and BPF times.
traced_run() {
    local cfg="$1" m="$2" t0 a b e0 ec0 r0 rc0 e1 ec1 r1 rc1 pair mal fre cov
    "${storm[@]}" -m "$m" -p -t $((window + 4)) >"$work/storm.out" &
    storm_pid=$!
    sleep 0.2
    t0="$(now_ns)"
    ask_window "$window"
    sleep_until "$t0" 1.5
    a="$(now_ns)"
    read -r e0 ec0 r0 rc0 < <(bpf_stats)
    sleep_until "$t0" $((window - 1))
    b="$(now_ns)"
    read -r e1 ec1 r1 rc1 < <(bpf_stats)
    check_window "$cfg, $m"
    kill "$storm_pid" 2>/dev/null || true
    wait "$storm_pid" || true
    read -r pair mal fre cov < <(awk -v a="$a" -v b="$b" -v runs="$((ec1 - ec0))" '
        $1 == "at" && $2 >= a && $2 <= b { if (!n++) { t0 = $2; p0 = $3; m0 = $4; f0 = $5 } t = $2; p = $3; m = $4; f = $5 }
        END { if (n < 2 || p == p0) { print "nan nan nan 0"; exit }
              print (t - t0) / (p - p0), (m - m0) / (p - p0), (f - f0) / (p - p0), runs / (2 * (p - p0) / (t - t0) * (b - a)) }' "$work/storm.out")
    if [ "$m" = split ]; then vals["$cfg malloc"]+=" $mal" vals["$cfg free"]+=" $fre"; else vals["$cfg pair"]+=" $pair"; fi
    covs["$cfg"]+=" $(calc %.2f "$cov")"
    bpf["$cfg"]="$(awk -v s="${bpf[$cfg]:-0 0 0 0}" -v d="$((e1 - e0)) $((ec1 - ec0)) $((r1 - r0)) $((rc1 - rc0))" \
        'BEGIN { split(s, x); split(d, y); print x[1] + y[1], x[2] + y[2], x[3] + y[3], x[4] + y[4] }')"
}

untraced_run() {
    vals["untraced pair"]+=" $("${storm[@]}" -m "$mode" -t "$secs" | field ns_per_pair)"
    local out
    out="$("${storm[@]}" -m split -t "$secs")"
    vals["untraced malloc"]+=" $(field ns_per_malloc <<<"$out")"
    vals["untraced free"]+=" $(field ns_per_free <<<"$out")"
}

declare -A vals covs bpf counters
notes=()
configs=("sampling 512 KiB" "every allocation")
for cfg in "${configs[@]}"; do
    if [ "$cfg" = "every allocation" ]; then start_daemon --alloc-sample-bytes 0; else start_daemon; fi
    "${storm[@]}" -t 60 >/dev/null &
    storm_pid=$!
    sleep 0.2
    ask_window 1
    check_window "$cfg, warm-up"
    kill "$storm_pid"
    wait "$storm_pid" || true
    grep -q 'allocation probes loaded' "$work/daemon.log" || { cat "$work/daemon.log" >&2; echo "the warm-up window failed" >&2; exit 1; }
    echo "$cfg: $(grep -o 'allocation probes loaded took=[0-9.a-z]*' "$work/daemon.log")" >&2
    for run in $(seq "$runs"); do
        echo "  run $run/$runs" >&2
        untraced_run
        traced_run "$cfg" "$mode"
        traced_run "$cfg" split
    done
    counters["$cfg"]="$(curl -s "$url/metrics" | grep -E '^profilerd_(sampler_events_total\{event="alloc_|alloc_traces_over|samples_lost_total\{reason="alloc)' | grep -v ' 0$' || true)"
    kill -TERM "$daemon"
    wait "$daemon" || true
done

# The tools, timed by the storm itself (without their start and exit);
# Debian's packages, installed if missing (a tool that cannot be is left out,
# and said so).
for package in valgrind heaptrack; do
    if ! command -v "$package" >/dev/null; then
        echo "bench: installing $package" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package" >/dev/null 2>&1 ||
            { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package" >/dev/null; } ||
            echo "bench: could not install $package: its row is left out" >&2
    fi
done
tools=()
command -v valgrind >/dev/null && tools+=(dhat)
command -v heaptrack >/dev/null && tools+=(heaptrack)
for _ in $(seq "$runs"); do
    for tool in "${tools[@]}"; do
        if [ "$tool" = dhat ]; then
            out="$(valgrind --tool=dhat -q --dhat-out-file="$work/dhat.out" "${storm[@]}" -m "$mode" -t "$secs")"
        else
            out="$(cd "$work" && heaptrack "${storm[@]}" -m "$mode" -t "$secs" 2>&1)"
            rm -f "$work"/heaptrack.*
        fi
        vals["$tool pair"]+=" $(field ns_per_pair <<<"$out")"
    done
done

base="$(med "${vals[untraced pair]}")"
bm="$(med "${vals[untraced malloc]}")"
bf="$(med "${vals[untraced free]}")"
row() { # label, ns per pair, BPF column
    echo "| $1 | $(calc %.1f "$2") | $(calc %.0fx "$2 / $base") | $(calc %.0f "($2 - $base) / 2") | $3 |"
}
echo
echo "malloc_storm -m $mode -s $size on CPU ${pin:-any}; medians of $runs runs ($((2 * runs)) untraced), ${SECONDS} s in all"
echo
echo "| configuration | ns per malloc+free | slowdown | added ns per call | BPF ns per call |"
echo "|---|---|---|---|---|"
echo "| untraced | $(calc %.1f "$base") | 1x | | |"
for cfg in "${configs[@]}"; do
    read -r en ec rn rc <<<"${bpf[$cfg]}"
    row "profilerd, $cfg" "$(med "${vals[$cfg pair]}")" "$(calc "enter %.0f, return %.0f" "($ec ? $en / $ec : 0), ($rc ? $rn / $rc : 0)")"
done
for tool in "${tools[@]}"; do
    row "$([ "$tool" = dhat ] && echo "valgrind --tool=dhat" || echo heaptrack)" "$(med "${vals[$tool pair]}")" ""
done
echo
echo "Split mode (64 mallocs timed, then their 64 frees): a malloc hits the entry and return probes, a free the entry probe"
echo
echo "| configuration | ns per malloc | added | ns per free | added |"
echo "|---|---|---|---|---|"
echo "| untraced | $(calc %.1f "$bm") | | $(calc %.1f "$bf") | |"
for cfg in "${configs[@]}"; do
    m="$(med "${vals[$cfg malloc]}")"
    f="$(med "${vals[$cfg free]}")"
    echo "| profilerd, $cfg | $(calc %.1f "$m") | $(calc %.0f "$m - $bm") | $(calc %.1f "$f") | $(calc %.0f "$f - $bf") |"
done
echo
echo "untraced ns per pair:${vals[untraced pair]}"
for cfg in "${configs[@]}"; do
    echo "profilerd, $cfg: ns per pair:${vals[$cfg pair]}; coverage of the spans:${covs[$cfg]}"
    printf '%s\n' "${counters[$cfg]}" | sed 's/^/    /'
done
if [ "${#notes[@]}" -gt 0 ]; then
    echo "notes (a warm-up one is expected):"
    printf '  %s\n' "${notes[@]}"
fi
