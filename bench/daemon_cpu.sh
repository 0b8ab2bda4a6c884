# Sourced by the bench scripts that measure the daemon's own CPU
# (jit_cost.sh, thread_cpu_cost.sh). They set $root (the repository) before,
# and $daemon (its pid), $port and $load (the workload's pid, if any) as
# they run. Sourcing it makes $work, a scratch directory removed on exit
# with the daemon and the load stopped (only the pids set: kill 0 would be
# the whole process group), and $hz, clock ticks a second.

work="$(mktemp -d)"
cleanup() {
    local pid
    for pid in ${daemon:-} ${load:-}; do
        kill "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT
hz="$(getconf CLK_TCK)"

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
