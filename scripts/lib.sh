# shellcheck shell=bash
# Shared by the set-up scripts: progress lines and the idempotent installers.
# Sourced, not run.

# shellcheck source=scripts/toolchain.env
source "$(dirname "${BASH_SOURCE[0]}")/toolchain.env"

log() { printf '\033[1msetup:\033[0m %s\n' "$*" >&2; }

# step NAME "TYPICAL" COMMAND...: runs COMMAND, saying first what it does and how
# long it takes on a fresh 2-CPU machine, then how long it took. A step with
# nothing to do is silent.
step() {
    local name="$1" typical="$2" started=$SECONDS
    shift 2
    STEP_SAID=""
    STEP_NAME="$name" STEP_TYPICAL="$typical" "$@"
    if [ -n "$STEP_SAID" ]; then
        log "  done in $((SECONDS - started)) s"
    fi
}

# Called by a step's command when it has work to do.
announce() {
    STEP_SAID=1
    log "$STEP_NAME: $* (fresh machine: $STEP_TYPICAL)"
}

need_root() {
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: must run as root (BPF programs and apt-get need it)" >&2
        exit 1
    fi
}

# install_debian_packages PACKAGE...: installs those not yet installed.
install_debian_packages() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        return
    fi
    announce "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
