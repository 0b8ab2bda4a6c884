#!/usr/bin/env bash
# Sets up this machine (idempotent), builds profilerd and runs the daemon with
# its embedded defaults (listening on 127.0.0.1:7040). Extra arguments go to profilerd.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
cd "$root"
cargo build --release -p profiler-daemon
exec "$root/target/release/profilerd" "$@"
