#!/usr/bin/env bash
# Installs what building and running profilerd needs on a fresh Debian machine
# (root, rustup present, Debian's and crates.io's mirrors): a C toolchain, the
# pinned Rust toolchains and bpf-linker. What only the tests need is installed
# by scripts/setup-tests.sh. Idempotent: every step checks before it acts, so a
# second run takes a second.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/lib.sh
source "$here/lib.sh"

install_rust_toolchains() {
    if ! command -v rustup >/dev/null; then
        echo "setup: rustup not found; install it first (https://rustup.rs)" >&2
        exit 1
    fi
    # clippy and rustfmt: rust-toolchain.toml names them, and with
    # RUSTUP_AUTO_INSTALL=0 a missing one would stop cargo.
    if ! rustup run "$STABLE_TOOLCHAIN" rustc --version >/dev/null 2>&1; then
        announce "installing Rust $STABLE_TOOLCHAIN"
        rustup toolchain install "$STABLE_TOOLCHAIN" --profile minimal --component clippy,rustfmt
    fi
    if ! rustup run "$BPF_TOOLCHAIN" rustc --version >/dev/null 2>&1 ||
        ! rustup component list --toolchain "$BPF_TOOLCHAIN" --installed | grep -q '^rust-src'; then
        announce "installing Rust $BPF_TOOLCHAIN with rust-src (builds the BPF program)"
        rustup toolchain install "$BPF_TOOLCHAIN" --profile minimal --component rust-src
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
    announce "compiling bpf-linker $BPF_LINKER_VERSION against $(basename "$(readlink "$llvm_prefix/lib/libLLVM.so")")"
    # Its release profile as it ships, but no debug info: nobody debugs the
    # linker here, and writing it is a good part of the build.
    CARGO_PROFILE_RELEASE_DEBUG=false \
        LLVM_PREFIX="$llvm_prefix" RUSTFLAGS="-C link-arg=-Wl,-rpath,$sysroot/lib" \
        rustup run "$STABLE_TOOLCHAIN" cargo install --locked --force --quiet \
        bpf-linker --version "$BPF_LINKER_VERSION" --no-default-features --features "$BPF_LINKER_LLVM"
}

main() {
    need_root
    step "[1/3] Debian packages" "~30 s" install_debian_packages "${BUILD_PACKAGES[@]}"
    step "[2/3] Rust toolchains" "~30 s" install_rust_toolchains
    step "[3/3] bpf-linker" "~1 min" install_bpf_linker
}

main "$@"
