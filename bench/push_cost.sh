#!/usr/bin/env bash
# Cost of pushing (issue 16) at 99 Hz for the whole machine: push CPU and
# bytes per minute. A real Parca server (the tests' cached build) listens on
# loopback; a varied load keeps both CPUs busy with many stacks and several
# services; runs of the daemon without push and with push alternate. Each
# run records the daemon's CPU (utime+stime, children included, from
# /proc/PID/stat) and the push counters of its /metrics over RUN_SECONDS
# after a warm-up, both ends synchronised to a window just accepted, so the
# counters hold whole windows (each exactly its interval's samples). Prints
# every run and the medians: per window, and per minute.
#
# Usage: bench/push_cost.sh [RUNS] [RUN_SECONDS]   (root; builds first)
#   RUNS         runs of each kind (default 3), alternating, the order rotated each round
#   RUN_SECONDS  measured seconds per run (default 180, rounded up to a window),
#                after WARMUP seconds (default 30)
# KINDS chooses the kinds of run (default all four):
#   none    the daemon without push
#   parca   --push parca=http://127.0.0.1:PORT (interval 15 s, the default)
#   parca5  the same with --push-interval-seconds 5
#   both    parca plus pyroscope=http://127.0.0.1:SINK, a python3 sink that
#           answers 200 to every POST (Pyroscope cannot be built here), so
#           both backends' requests are counted for the same windows
# PROFILERD=/path/to/profilerd measures that binary instead of building.
# The whole run takes about RUNS x 4 x (WARMUP + RUN_SECONDS + 10) seconds.
#
# profilerd_push_encode_cpu_seconds_total is the CPU time of the threads that
# encode the windows (pprof and gzip), counted by the daemon per target: it
# does not depend on what else runs, unlike the daemon's CPU difference,
# which on a shared 2-CPU machine is within the noise of a few runs.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs="${1:-3}"
seconds="${2:-180}"
warmup="${WARMUP:-30}"
read -r -a kinds <<<"${KINDS:-none parca parca5 both}"
cd "$root"

if [ "$(id -u)" != 0 ]; then
    echo "run as root (the daemon loads BPF programs)" >&2
    exit 1
fi
PARCA_VERSION="$(sed -n 's/^PARCA_VERSION=//p' scripts/toolchain.env)"
parca_bin="/var/cache/profilerd-tests/parca-$PARCA_VERSION/parca"
if [ ! -x "$parca_bin" ]; then
    echo "no Parca server at $parca_bin: build it once with" >&2
    echo "  cargo test --release -p profilerd-tests --test parca" >&2
    echo "(tests/src/parca.rs builds Parca $PARCA_VERSION from its Go module into that cache)" >&2
    exit 1
fi
if [ -n "${PROFILERD:-}" ]; then
    profilerd="$PROFILERD"
else
    cargo build --release -p profiler-daemon >/dev/null 2>&1
    profilerd="$root/target/release/profilerd"
fi

work="$(mktemp -d)"
daemon=""
load=""
parca=""
sink=""
sleeper=""
cleanup() {
    set +e
    [ -n "$sleeper" ] && kill "$sleeper" 2>/dev/null
    [ -n "$daemon" ] && kill -TERM "$daemon" 2>/dev/null
    # The load is a process group of its own (setsid below): its loops and
    # whatever they are running at the moment stop together.
    [ -n "$load" ] && kill -TERM -- "-$load" 2>/dev/null
    [ -n "$parca" ] && kill -TERM "$parca" 2>/dev/null
    [ -n "$sink" ] && kill -TERM "$sink" 2>/dev/null
    wait 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Sleeps in the background: a signal then stops the script at once, where a
# foreground sleep would delay its trap until the sleep ends.
pause() {
    sleep "$1" &
    sleeper=$!
    wait "$sleeper"
    sleeper=""
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_for() {
    local url="$1" what="$2" log="$3"
    for _ in $(seq 300); do
        curl -sf -o /dev/null "$url" 2>/dev/null && return
        sleep 0.2
    done
    echo "$what did not answer at $url:" >&2
    tail -20 "$log" >&2
    exit 1
}

# Parca, as tests/src/parca.rs starts it, without persistence: in memory only.
parca_port="$(free_port)"
mkdir -p "$work/parca"
cat >"$work/parca/parca.yaml" <<EOF
object_storage:
  bucket:
    type: "FILESYSTEM"
    config:
      directory: "$work/parca/blocks"
scrape_configs: []
EOF
(cd "$work/parca" && exec "$parca_bin" --config-path="$work/parca/parca.yaml" \
    --http-address="127.0.0.1:$parca_port" --storage-path="$work/parca/data" \
    --log-level=warn --debuginfod-upstream-servers= --debuginfo-cache-dir="$work/parca" \
    >/dev/null 2>"$work/parca.log") &
parca=$!
wait_for "http://127.0.0.1:$parca_port/metrics" "Parca" "$work/parca.log"
parca_url="http://127.0.0.1:$parca_port"

# A stand-in for Pyroscope's Push endpoint: 200 with an empty body (an empty
# PushResponse) to every POST; it logs each request's body size.
sink_port="$(free_port)"
cat >"$work/sink.py" <<'EOF'
import http.server, sys
class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            size = 0
            while True:
                chunk = int(self.rfile.readline().split(b";")[0], 16)
                if chunk == 0:
                    while self.rfile.readline() not in (b"\r\n", b""):
                        pass
                    break
                size += len(self.rfile.read(chunk))
                self.rfile.readline()
        else:
            size = len(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        with open(sys.argv[2], "a") as log:
            log.write(f"{self.path} {size}\n")
        self.send_response(200)
        self.send_header("Content-Type", "application/proto")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
EOF
: >"$work/sink.requests"
python3 "$work/sink.py" "$sink_port" "$work/sink.requests" 2>"$work/sink.log" &
sink=$!
wait_for "http://127.0.0.1:$sink_port/" "the Pyroscope sink" "$work/sink.log"
sink_url="http://127.0.0.1:$sink_port"

# The load: several programs and services with varied stacks, niced so that
# whatever else shares the machine keeps its share (both CPUs stay busy, so
# the daemon samples 2 x 99 per second either way).
cc -O0 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer -o "$work/split" tests/workloads/split.c
cc -O2 -g -fomit-frame-pointer -o "$work/deep_recursion" tests/workloads/deep_recursion.c
cat >"$work/load.py" <<'EOF'
import hashlib, json, random, re, zlib
words = [f"w{i:05d}" for i in range(5000)]
def documents(n):
    return [{"id": i, "tags": random.sample(words, 8), "score": random.random()} for i in range(n)]
def encode(docs):
    return json.dumps(docs, sort_keys=True)
def decode(text):
    return json.loads(text)
def search(text):
    return len(re.findall(r'"w0[0-4]\d{3}"', text))
def digest(text):
    return hashlib.sha256(text.encode()).hexdigest()
def squeeze(text):
    return len(zlib.compress(text.encode(), 6))
def rank(docs):
    return sorted(docs, key=lambda d: (d["score"], d["id"]))[:10]
while True:
    docs = documents(2000)
    text = encode(docs)
    decode(text); search(text); digest(text); squeeze(text); rank(docs)
EOF
# shellcheck disable=SC2016 # expanded by the inner bash
setsid nice -n 10 bash -c '
    trap "kill 0" TERM
    "$1/split" 1000000 &
    "$1/deep_recursion" 1000000 &
    python3 "$1/load.py" &
    sh -c "while :; do ls -R /usr >/dev/null 2>&1; done" &
    sh -c "while :; do head -c 4000000 /dev/urandom | gzip -6 >/dev/null; done" &
    wait' load "$work" &
load=$!

# utime+stime+cutime+cstime of a process, in clock ticks (fields 14-17 of
# /proc/PID/stat, counted after the command name, which may hold spaces).
cpu_ticks() {
    sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13 + $14 + $15}'
}
ticks_per_second="$(getconf CLK_TCK)"

# Sums the samples of a metric whose labels contain every given fragment.
metric() {
    local file="$1" name="$2" IFS="|"
    shift 2
    awk -v name="$name" -v fragments="$*" '
        BEGIN { n = split(fragments, want, "|") }
        index($0, name "{") == 1 {
            for (i = 1; i <= n; i++) if (!index($0, want[i])) next
            sum += $NF; found = 1
        }
        END { if (found) printf "%.6f\n", sum; else print "nan" }' "$file"
}

# After minus before of a metric in this run's /metrics snapshots, or "n/a".
delta() {
    awk -v a="$(metric "$work/before" "$@")" -v b="$(metric "$work/after" "$@")" \
        'BEGIN { if (a == "nan" || b == "nan") print "n/a"; else printf "%.6f\n", b - a }'
}

# a / b, or "n/a".
ratio() {
    awk -v a="$1" -v b="$2" -v scale="${3:-1}" 'BEGIN {
        if (a == "n/a" || b == "n/a" || b + 0 == 0) print "n/a"; else printf "%.6f\n", a * scale / b }'
}

median() {
    { grep -v '^n/a$' || true; } | sort -g | awk '{a[NR]=$1} END {
        if (NR == 0) print "n/a"; else print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2 }'
}

start_daemon() {
    local port
    port="$(free_port)"
    "$profilerd" --listen "127.0.0.1:$port" "$@" >"$work/daemon.log" 2>&1 &
    daemon=$!
    url="http://127.0.0.1:$port"
    wait_for "$url/metrics" "the daemon" "$work/daemon.log"
}

stop_daemon() {
    kill -TERM "$daemon"
    wait "$daemon" || true
    daemon=""
}

# Waits until Parca has just accepted a window and no target has a request
# left to send: the push counters then hold whole windows, so a run measures
# a whole number of them, each exactly its interval's samples (drain to drain).
sync_to_window() {
    local accepted='profilerd_push_attempts_total' first now queued deadline=$((SECONDS + 120))
    curl -sf "$url/metrics" >"$work/sync"
    first="$(metric "$work/sync" "$accepted" 'target="parca ' 'outcome="accepted"')"
    while [ "$SECONDS" -lt "$deadline" ]; do
        curl -sf "$url/metrics" >"$work/sync"
        now="$(metric "$work/sync" "$accepted" 'target="parca ' 'outcome="accepted"')"
        queued="$(metric "$work/sync" profilerd_push_queue_windows 'target="')"
        if [ "$now" != "$first" ] && awk -v q="$queued" 'BEGIN { exit !(q + 0 == 0) }'; then
            return
        fi
        sleep 0.1
    done
    echo "Parca accepted no window within 120 s:" >&2
    tail -20 "$work/daemon.log" >&2
    exit 1
}

# Snapshots: /metrics, CPU ticks of the daemon and of Parca, the sink's
# requests and bytes so far, the time.
snapshot() {
    curl -sf "$url/metrics" >"$work/$1"
    echo "$(cpu_ticks "$daemon") $(cpu_ticks "$parca") $(awk '{n++; s += $2} END {print n + 0, s + 0}' \
        "$work/sink.requests") $(date +%s.%N)" >"$work/$1.counts"
}

declare -A result
run_kind() {
    local kind="$1" round="$2" push=1
    case "$kind" in
        none)
            start_daemon
            push=""
            ;;
        parca) start_daemon --push "parca=$parca_url" ;;
        parca5) start_daemon --push "parca=$parca_url" --push-interval-seconds 5 ;;
        both) start_daemon --push "parca=$parca_url" --push "pyroscope=$sink_url" ;;
        *)
            echo "unknown kind $kind (none, parca, parca5, both)" >&2
            exit 1
            ;;
    esac
    pause "$warmup"
    [ -n "$push" ] && sync_to_window
    snapshot before
    pause "$seconds"
    [ -n "$push" ] && sync_to_window
    snapshot after
    if [ "$kind" = both ]; then
        # What the windows hold: distinct stacks (process name and frames)
        # and distinct function names in the last 15 s, the whole machine.
        curl -sf "$url/folded?seconds=15" >"$work/folded"
        local counts
        counts="$(awk '{
            sub(/ [0-9]+$/, ""); stacks++
            n = split($0, frame, ";"); for (i = 2; i <= n; i++) seen[frame[i]] = 1
        } END { print stacks + 0, length(seen) }' "$work/folded")"
        result[$kind.$round.stacks]="${counts% *}"
        result[$kind.$round.functions]="${counts#* }"
    fi
    stop_daemon

    local key="$kind.$round" cpu0 parca0 sink_n0 sink_b0 t0 cpu1 parca1 sink_n1 sink_b1 t1 minutes
    read -r cpu0 parca0 sink_n0 sink_b0 t0 <"$work/before.counts"
    read -r cpu1 parca1 sink_n1 sink_b1 t1 <"$work/after.counts"
    minutes="$(awk -v a="$t0" -v b="$t1" 'BEGIN {print (b - a) / 60}')"
    result[$key.cpu]="$(ratio $((cpu1 - cpu0)) "$minutes" "$(awk -v t="$ticks_per_second" 'BEGIN {print 1000 / t}')")"
    result[$key.parca_cpu]="$(ratio $((parca1 - parca0)) "$minutes" "$(awk -v t="$ticks_per_second" 'BEGIN {print 1000 / t}')")"
    result[$key.load]="$(cut -d' ' -f1 /proc/loadavg)"
    [ -z "$push" ] && {
        printf '  round %d %-7s daemon CPU %6.0f ms/min; Parca CPU %.0f ms/min; load %s\n' "$round" "$kind" \
            "${result[$key.cpu]}" "${result[$key.parca_cpu]}" "${result[$key.load]}"
        return
    }
    # Windows: what Parca accepted (one request each). Pyroscope gets the
    # same windows, one request per series.
    local windows backend target field
    windows="$(delta profilerd_push_attempts_total 'target="parca ' 'outcome="accepted"')"
    result[$key.windows]="$windows"
    result[$key.per_minute]="$([ "$kind" = parca5 ] && echo 12 || echo 4)"
    for backend in parca pyroscope; do
        target="target=\"$backend "
        result[$key.$backend.requests]="$(delta profilerd_push_attempts_total "$target" 'outcome="accepted"')"
        result[$key.$backend.failed]="$(delta profilerd_push_attempts_total "$target" 'outcome="failed"')"
        result[$key.$backend.bytes]="$(ratio "$(delta profilerd_push_bytes_total "$target")" "$windows")"
        result[$key.$backend.samples]="$(ratio "$(delta profilerd_push_samples_total "$target")" "$windows")"
        result[$key.$backend.encode]="$(ratio "$(delta profilerd_push_encode_cpu_seconds_total "$target")" "$windows" 1000)"
        result[$key.$backend.requests_per_window]="$(ratio "${result[$key.$backend.requests]}" "$windows")"
        # Per minute: per window times windows per minute.
        for field in bytes samples encode; do
            result[$key.$backend.${field}_min]="$(ratio "${result[$key.$backend.$field]}" 1 "${result[$key.per_minute]}")"
        done
    done
    # What the sink received, as a check on the daemon's own byte count.
    result[$key.sink]="$(ratio $((sink_b1 - sink_b0)) "$windows")"
    printf '  round %d %-7s daemon CPU %6.0f ms/min; parca: %s windows of %s samples, %s B and %s ms encoding each' \
        "$round" "$kind" "${result[$key.cpu]}" "$(num %.0f "$windows")" "$(num %.0f "${result[$key.parca.samples]}")" \
        "$(num %.0f "${result[$key.parca.bytes]}")" "$(num %.2f "${result[$key.parca.encode]}")"
    if [ "$kind" = both ]; then
        printf '; the last 15 s: %s stacks, %s functions' "${result[$key.stacks]}" "${result[$key.functions]}"
        printf '; pyroscope: %s requests per window, %s B and %s ms encoding per window (the sink got %s B and %s requests per window)' \
            "$(num %.1f "${result[$key.pyroscope.requests_per_window]}")" "$(num %.0f "${result[$key.pyroscope.bytes]}")" \
            "$(num %.2f "${result[$key.pyroscope.encode]}")" "$(num %.0f "${result[$key.sink]}")" \
            "$(num %.1f "$(ratio $((sink_n1 - sink_n0)) "$windows")")"
    fi
    printf '; failed attempts %s; Parca CPU %.0f ms/min; load %s\n' \
        "$(awk -v a="${result[$key.parca.failed]}" -v b="${result[$key.pyroscope.failed]}" 'BEGIN {print a + b}')" \
        "${result[$key.parca_cpu]}" "${result[$key.load]}"
}

# A number in printf's SPEC, or "-" for none.
num() {
    if [ -z "$2" ] || [ "$2" = n/a ]; then
        echo -
    else
        # shellcheck disable=SC2059
        printf "$1" "$2"
    fi
}

column() {
    local kind="$1" field="$2" round
    for round in $(seq "$runs"); do
        echo "${result[$kind.$round.$field]:-n/a}"
    done | median
}

echo "profilerd $("$profilerd" --version 2>/dev/null | awk '{print $NF}') ($profilerd), Parca $PARCA_VERSION on $parca_url"
echo "$(nproc) CPUs; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$runs runs of each of: ${kinds[*]}; ${warmup} s warm-up, then ${seconds} s measured; 99 Hz, the whole machine"
pause 5 # the load starts
for round in $(seq "$runs"); do
    shift_by=$(((round - 1) % ${#kinds[@]}))
    for i in $(seq 0 $((${#kinds[@]} - 1))); do
        run_kind "${kinds[$(((i + shift_by) % ${#kinds[@]}))]}" "$round"
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

echo
echo "medians of $runs runs; per window, and per minute (windows of 15 s: 4 a minute; parca5: 12):"
row() {
    printf '  %-10s %9s %7s %9s %9s %10s %11s %10s %9s %10s %8s %8s\n' "$@"
}
row run daemon windows requests samples bytes encode bytes samples encode encode Parca
row "" ms/min "in run" /window /window /window ms/window /min /min ms/min "% of CPU" ms/min
for kind in "${kinds[@]}"; do
    for backend in parca pyroscope; do
        [ "$kind" = none ] && [ "$backend" = pyroscope ] && continue
        [ "$kind" != both ] && [ "$backend" = pyroscope ] && continue
        label="$kind"
        [ "$kind" = both ] && label="both/${backend:0:5}"
        encode="$(column "$kind" "$backend.encode_min")"
        row "$label" "$(num %.0f "$(column "$kind" cpu)")" "$(num %.0f "$(column "$kind" windows)")" \
            "$(num %.1f "$(column "$kind" "$backend.requests_per_window")")" \
            "$(num %.0f "$(column "$kind" "$backend.samples")")" \
            "$(num %.0f "$(column "$kind" "$backend.bytes")")" \
            "$(num %.2f "$(column "$kind" "$backend.encode")")" \
            "$(num %.0f "$(column "$kind" "$backend.bytes_min")")" \
            "$(num %.0f "$(column "$kind" "$backend.samples_min")")" \
            "$(num %.1f "$encode")" "$(num %.3f "$(ratio "$encode" 600)")" \
            "$(num %.0f "$(column "$kind" parca_cpu)")"
    done
done

if [[ " ${kinds[*]} " == *" none "* ]]; then
    base="$(column none cpu)"
    echo
    echo "daemon CPU with push minus without (medians; noisy on a shared machine):"
    for kind in "${kinds[@]}"; do
        [ "$kind" = none ] && continue
        awk -v a="$base" -v b="$(column "$kind" cpu)" -v k="$kind" \
            'BEGIN { printf "  %-8s %+7.0f ms/min  %+.3f%% of one CPU  (%.0f against %.0f)\n", k, b - a, (b - a) / 600, b, a }'
    done
fi
if [[ " ${kinds[*]} " == *" both "* ]]; then
    echo
    echo "the Pyroscope sink received $(num %.0f "$(column both sink)") B per window (median; the daemon counted $(num %.0f "$(column both pyroscope.bytes)"))"
    echo "a 15 s window of this load held $(column both stacks) distinct stacks (process name and frames) over $(column both functions) function names, and $(num %.1f "$(column both pyroscope.requests_per_window)") services (medians)"
fi
