#!/usr/bin/env bash
# Installs everything the test suite needs, on top of scripts/setup.sh:
# the tests' Debian packages (see scripts/toolchain.env for which test needs
# which), clippy for the BPF nightly, Go and the standalone pprof (independent
# readers of the profiles), py-spy (the Python oracle). Idempotent.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/setup.sh"
# shellcheck source=scripts/lib.sh
source "$here/lib.sh"

# valgrind: its DHAT tool is the oracle of the allocation workload's own
# counts (tests/allocations.rs); nodejs and openjdk-17-jdk-headless (java,
# javac, jcmd): the JIT runtimes whose perf maps tests/jit.rs and
# tests/jit_hostile.rs read. The other test packages are in
# scripts/toolchain.env's TEST_PACKAGES.
ORACLE_TEST_PACKAGES=(valgrind nodejs openjdk-17-jdk-headless)

install_test_packages() {
    local had_prometheus=1
    dpkg-query -W -f='${Status}' prometheus 2>/dev/null | grep -q 'install ok installed' || had_prometheus=0
    install_debian_packages "${TEST_PACKAGES[@]}" "${ORACLE_TEST_PACKAGES[@]}"
    if [ "$had_prometheus" -eq 0 ]; then
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

# scripts/test.sh lints the BPF crate with the nightly that builds it.
install_bpf_clippy() {
    if ! rustup component list --toolchain "$BPF_TOOLCHAIN" --installed | grep -q '^clippy'; then
        announce "adding clippy to $BPF_TOOLCHAIN"
        rustup component add --toolchain "$BPF_TOOLCHAIN" clippy
    fi
}

install_go() {
    if ! command -v go >/dev/null; then
        install_debian_packages golang-go
    fi
}

# `go tool pprof` fetches over its own HTTP client, which ignores -tls_ca,
# -tls_cert and -tls_key; the standalone pprof uses them (tests/tls.rs).
install_standalone_pprof() {
    if [ -x /usr/local/bin/pprof ] && go version -m /usr/local/bin/pprof 2>/dev/null | grep -q "$PPROF_VERSION"; then
        return
    fi
    announce "building the standalone pprof $PPROF_VERSION"
    GOBIN=/usr/local/bin go install "github.com/google/pprof@$PPROF_VERSION"
}

# py-spy, the oracle of tests/python.rs, from PyPI: Debian's pip refuses to
# install into the system (PEP 668), so a venv of Debian's python3.11 holds
# it, and its binary (py-spy ships a static executable) is linked where the
# tests find it on PATH.
PY_SPY_VENV=/opt/profilerd-tests/py-spy
install_py_spy() {
    if [ -x /usr/local/bin/py-spy ] && [ "$(/usr/local/bin/py-spy --version 2>/dev/null)" = "py-spy $PY_SPY_VERSION" ]; then
        return
    fi
    announce "installing py-spy $PY_SPY_VERSION from PyPI"
    rm -rf "$PY_SPY_VENV"
    /usr/bin/python3.11 -m venv "$PY_SPY_VENV"
    "$PY_SPY_VENV/bin/pip" install --quiet --disable-pip-version-check "py-spy==$PY_SPY_VERSION"
    ln -sf "$PY_SPY_VENV/bin/py-spy" /usr/local/bin/py-spy
}

main() {
    need_root
    step "[tests 1/5] Debian packages for the tests" "~2 min" install_test_packages
    step "[tests 2/5] clippy for the BPF nightly" "~5 s" install_bpf_clippy
    step "[tests 3/5] Go (go tool pprof)" "~1 min" install_go
    step "[tests 4/5] standalone pprof" "~40 s" install_standalone_pprof
    step "[tests 5/5] py-spy (PyPI)" "~10 s" install_py_spy
    log "ready for the tests"
}

main "$@"
