#!/usr/bin/env bash
# Sets up this machine for building (idempotent: only what building and
# running needs; the tests' extras are scripts/setup-tests.sh's), builds
# profilerd and runs the daemon with its embedded defaults (listening on
# 127.0.0.1:7040). Extra arguments go to profilerd.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { printf '\033[1mrun:\033[0m %s\n' "$*" >&2; }

started=$SECONDS
"$root/scripts/setup.sh"
cd "$root"
if [ -x target/release/profilerd ]; then
    say "building profilerd (changes only)"
else
    say "building profilerd: ~300 crates and the BPF program, about 5 min on 2 CPUs the first time"
fi
at=$SECONDS
cargo build --release -p profiler-daemon
say "built in $((SECONDS - at)) s; set-up and build took $((SECONDS - started)) s"
say "starting target/release/profilerd${*:+ $*}: it answers on http://127.0.0.1:7040/ (try /top) unless --listen says otherwise; Ctrl-C stops it"
exec "$root/target/release/profilerd" "$@"
