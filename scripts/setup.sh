#!/usr/bin/env bash
# Installs everything profilerd needs to build and test on a fresh Debian machine
# (root, network access to Debian and crates.io mirrors, rustup present).
# Idempotent: every step checks before it acts, so a second run takes seconds.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/toolchain.env
source "$here/scripts/toolchain.env"

log() { printf '\033[1msetup:\033[0m %s\n' "$*" >&2; }

need_root() {
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: must run as root (BPF programs and apt-get need it)" >&2
        exit 1
    fi
}

install_debian_packages() {
    local missing=()
    for p in "${DEBIAN_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        return
    fi
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    if [[ " ${missing[*]} " == *" prometheus "* ]]; then
        quiet_prometheus_server
    fi
}

# The prometheus package is here for promtool only. Its postinst enables (and
# where systemd runs and no policy-rc.d forbids it, starts) a Prometheus
# server on :9090 that would scrape and store on this machine for nothing.
# Only a server this script just installed is stopped and disabled.
quiet_prometheus_server() {
    local now=()
    # Without systemd running, disable works offline (the boot-time link).
    [ -d /run/systemd/system ] && now=(--now)
    systemctl disable "${now[@]}" prometheus.service >/dev/null 2>&1 || true
    if ! command -v promtool >/dev/null; then
        echo "setup: the prometheus package installed no promtool on PATH" >&2
        exit 1
    fi
}

install_rust_toolchains() {
    if ! command -v rustup >/dev/null; then
        echo "setup: rustup not found; install it first (https://rustup.rs)" >&2
        exit 1
    fi
    if ! rustup run "$STABLE_TOOLCHAIN" rustc --version >/dev/null 2>&1; then
        log "installing Rust $STABLE_TOOLCHAIN"
        rustup toolchain install "$STABLE_TOOLCHAIN" --profile minimal --component clippy,rustfmt
    fi
    if ! rustup run "$BPF_TOOLCHAIN" rustc --version >/dev/null 2>&1 ||
        ! rustup component list --toolchain "$BPF_TOOLCHAIN" --installed | grep -q '^rust-src'; then
        log "installing Rust $BPF_TOOLCHAIN with rust-src (BPF target)"
        rustup toolchain install "$BPF_TOOLCHAIN" --profile minimal --component rust-src
    fi
    # scripts/test.sh lints the BPF crate with the nightly that builds it.
    if ! rustup component list --toolchain "$BPF_TOOLCHAIN" --installed | grep -q '^clippy'; then
        log "installing clippy for $BPF_TOOLCHAIN (lints the BPF crate)"
        rustup component add --toolchain "$BPF_TOOLCHAIN" clippy
    fi
}

# bpf-linker links against a libLLVM whose major version must match its llvm-sys
# feature. Debian's LLVM is too old, so we link against the libLLVM shipped inside
# the pinned nightly (the same LLVM that emits the BPF bitcode).
install_bpf_linker() {
    local cargo_home="${CARGO_HOME:-$HOME/.cargo}"
    if command -v bpf-linker >/dev/null && bpf-linker --version 2>/dev/null | grep -q "$BPF_LINKER_VERSION"; then
        return
    fi
    local sysroot llvm_prefix
    sysroot="$(rustup run "$BPF_TOOLCHAIN" rustc --print sysroot)"
    llvm_prefix="$cargo_home/profilerd-llvm"
    mkdir -p "$llvm_prefix/lib"
    ln -sf "$(ls "$sysroot"/lib/libLLVM.so.* | head -n1)" "$llvm_prefix/lib/libLLVM.so"
    log "installing bpf-linker $BPF_LINKER_VERSION against $(basename "$(readlink "$llvm_prefix/lib/libLLVM.so")")"
    LLVM_PREFIX="$llvm_prefix" RUSTFLAGS="-C link-arg=-Wl,-rpath,$sysroot/lib" \
        rustup run "$STABLE_TOOLCHAIN" cargo install --locked --force \
        bpf-linker --version "$BPF_LINKER_VERSION" --no-default-features --features "$BPF_LINKER_LLVM"
}

install_go_pprof() {
    if ! command -v go >/dev/null; then
        log "installing Go (for go tool pprof, the independent pprof reader)"
        DEBIAN_PACKAGES=(golang-go)
        install_debian_packages
    fi
}

# `go tool pprof` fetches over its own HTTP client, which ignores -tls_ca,
# -tls_cert and -tls_key; the standalone pprof uses them (tests/tls.rs).
install_standalone_pprof() {
    if [ -x /usr/local/bin/pprof ] && go version -m /usr/local/bin/pprof 2>/dev/null | grep -q "$PPROF_VERSION"; then
        return
    fi
    log "installing the standalone pprof $PPROF_VERSION"
    GOBIN=/usr/local/bin go install "github.com/google/pprof@$PPROF_VERSION"
}

main() {
    need_root
    install_debian_packages
    install_rust_toolchains
    install_bpf_linker
    install_go_pprof
    install_standalone_pprof
    log "ready"
}

main "$@"
