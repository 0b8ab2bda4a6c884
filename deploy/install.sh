#!/usr/bin/env bash
# Installs profilerd: the binary built by `cargo build --release`, the systemd
# unit and the default config (never overwriting an edited one). Honours
# DESTDIR for packaging; with a running systemd and no DESTDIR, reloads it
# and enables and starts the service.
#
#   deploy/install.sh                 install (idempotent)
#   deploy/install.sh --uninstall     stop, disable, remove binary and unit; keep the config
#   deploy/install.sh --uninstall --purge   ... and remove the config too
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
dest="${DESTDIR:-}"
bin="$dest/usr/local/bin/profilerd"
unit="$dest/etc/systemd/system/profilerd.service"
config_dir="$dest/etc/profilerd"
config="$config_dir/profilerd.toml"

systemd_running() { [ -z "$dest" ] && [ -d /run/systemd/system ]; }

uninstall() {
    if systemd_running; then
        systemctl disable --now profilerd.service 2>/dev/null || true
    fi
    rm -f "$bin" "$unit"
    if [ "${1:-}" = "--purge" ]; then
        rm -rf "$config_dir"
    fi
    if systemd_running; then
        systemctl daemon-reload
    fi
    echo "profilerd uninstalled"
}

install_files() {
    local built="${PROFILERD_BIN:-$root/target/release/profilerd}"
    if [ ! -x "$built" ]; then
        echo "install.sh: $built not found: run cargo build --release first" >&2
        exit 1
    fi
    install -D -m 0755 "$built" "$bin"
    install -D -m 0644 "$here/profilerd.service" "$unit"
    if [ -e "$config" ]; then
        echo "keeping the existing $config"
    else
        install -D -m 0644 "$here/profilerd.toml" "$config"
    fi
    "$bin" check-config "$config" >/dev/null
    if systemd_running; then
        systemctl daemon-reload
        systemctl enable profilerd.service
        # enable --now would leave an already running old binary in place.
        # Type=notify: this returns once the new one is attached and listening.
        systemctl restart profilerd.service
    fi
    echo "profilerd installed: $bin, $unit, $config"
}

case "${1:-}" in
    --uninstall) uninstall "${2:-}" ;;
    "") install_files ;;
    *)
        echo "usage: $0 [--uninstall [--purge]]" >&2
        exit 2
        ;;
esac
