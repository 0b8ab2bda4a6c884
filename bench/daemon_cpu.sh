# Sourced by the bench scripts that measure the daemon's own CPU
# (jit_cost.sh, thread_cpu_cost.sh). They set $root (the repository),
# $daemon (its pid) and $port.

# Into the repository; the built daemon there, or a clear error.
need_daemon() {
    cd "$root"
    if [ ! -x target/release/profilerd ]; then
        echo "target/release/profilerd is missing: build it first (cargo build --release -p profiler-daemon)" >&2
        exit 1
    fi
}

# The median of the arguments.
med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

# CPU ticks (user + system) of the daemon and its worker processes.
ticks() {
    local total=0 pid
    for pid in "$daemon" $(pgrep -P "$daemon" || true); do
        total=$((total + $(awk '{sub(/.*\) /, ""); print $12 + $13}' "/proc/$pid/stat" 2>/dev/null || echo 0)))
    done
    echo "$total"
}

# The value of one metric of the daemon's /metrics.
metric() { curl -s "http://127.0.0.1:$port/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
