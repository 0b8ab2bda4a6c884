#!/usr/bin/env bash
# profilerd next to perf, bpftrace and bcc on the same workloads, in one run.
# Installs what is missing (bpftrace, bpfcc-tools, linux-perf, bpftool, and for
# bcc Debian's newest 6.1 kernel headers: none ship for this kernel), builds
# profilerd, then runs bench/compare/main.py, which writes docs/benchmarks.md
# and docs/benchmarks.json.
#
# Usage (root): bench/run.sh [--duration 20] [--quick] [--tools profilerd,perf,bpftrace,bcc]
#               [--workloads split,threads,pingpong] [--no-latency] [--no-999] ...
#        bench/run.sh --help     for every option
#        bench/run.sh unwind [--quick] [--frequencies 99,999] ...   the unwinding benchmark
#               (bench/compare/unwind.py: table vs frame-pointer walk vs perf --call-graph dwarf;
#               bench/run.sh unwind --help for its options)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

log() { printf '\033[1mbench:\033[0m %s\n' "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
    echo "bench: run as root (BPF, perf -a, kernel.bpf_stats_enabled)" >&2
    exit 1
fi

script="$root/bench/compare/main.py"
if [ "${1:-}" = unwind ]; then
    shift
    script="$root/bench/compare/unwind.py"
fi

for arg in "$@"; do
    case "$arg" in
    -h | --help | --report-only*) exec python3 "$script" "$@" ;;
    esac
done

apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1 ||
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
}

# bcc compiles its BPF program against kernel headers at start. Debian has none
# for this kernel (6.18); its 6.1 headers work (the program uses only stable
# perf_event and stack-trace interfaces). The newest linux-headers-6.1.0-N-amd64
# pulls in its -common package.
kernel_headers_package() {
    if [ -d "/lib/modules/$(uname -r)/build" ] || [ -e /sys/kernel/kheaders.tar.xz ] ||
        compgen -G '/usr/src/linux-headers-*-amd64' >/dev/null; then
        return
    fi
    apt-cache search --names-only '^linux-headers-6\.1\.0-[0-9]+-amd64$' 2>/dev/null |
        awk '{print $1}' | sort -V | tail -n1
}

missing=()
command -v bpftrace >/dev/null || missing+=(bpftrace)
[ -x /usr/sbin/profile-bpfcc ] || missing+=(bpfcc-tools)
command -v perf >/dev/null || missing+=(linux-perf)
command -v bpftool >/dev/null || missing+=(bpftool)
command -v cc >/dev/null || missing+=(build-essential)
command -v g++ >/dev/null || missing+=(g++)
headers="$(kernel_headers_package || true)"
[ -n "$headers" ] && missing+=("$headers")
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    apt_install "${missing[@]}" || log "could not install all of ${missing[*]}; the report says which tool failed and why"
fi

log "building profilerd"
"$root/scripts/setup.sh"
if ! build_log="$(cd "$root" && cargo build --release -p profiler-daemon 2>&1)"; then
    printf '%s\n' "$build_log" | grep -v '^warning: profiler-daemon@' >&2
    echo "bench: cargo build --release -p profiler-daemon failed" >&2
    exit 1
fi

exec python3 "$script" "$@"
