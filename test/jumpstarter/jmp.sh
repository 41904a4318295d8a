#!/bin/bash
# jmp.sh - a Jumpstarter 0.9.0 client for this machine: a venv in the cache with jumpstarter-cli (jmp, with "jmp admin"
# from jumpstarter-cli-admin) and the client halves of the drivers the lab exporters export ("j qemu ...", "j tcp").
#
# usage: jmp.sh      builds the venv if needed; the last stdout line is the path of its jmp executable
# environment: QSP_CACHE (cache root as in image.sh; the venv lives in $QSP_CACHE/jumpstarter/jmp-*),
#              JMP_PYTHON (interpreter for the venv, default python3; 0.9.0 needs >= 3.11, bookworm has 3.11)
set -euo pipefail

C=$(realpath -m "${QSP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qemu-ssh-provisioner}")/jumpstarter
PY=${JMP_PYTHON:-python3}
REQS=(jumpstarter-cli==0.9.0 jumpstarter-cli-admin==0.9.0 jumpstarter-driver-qemu==0.9.0
    jumpstarter-driver-network==0.9.0)

log() { echo "[jmp $(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if ! command -v "$PY" >/dev/null && [ "$PY" = python3 ]; then
    # a fresh Debian machine may have no Python at all; bookworm's 3.11 and trixie's 3.13 both do
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3 python3-venv >&2
fi
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null ||
    die "$PY is missing or older than 3.11, which jumpstarter 0.9.0 requires; set JMP_PYTHON"
if ! "$PY" -c 'import ensurepip' 2>/dev/null; then
    # Debian's own interpreter keeps venv support in a separate package
    v=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "python$v-venv" >&2
fi

# a venv is tied to its interpreter and cannot be moved, so it is built in place and marked complete
V=$C/jmp-$( (echo "${REQS[*]}"; "$PY" -c 'import sys; print(sys.executable, sys.version)') | sha256sum | cut -c1-12)
build() {
    [ -f "$V/.complete" ] && return 0
    local t0=$SECONDS
    rm -rf "$V"
    "$PY" -m venv "$V"
    "$V/bin/pip" install -q --disable-pip-version-check "${REQS[@]}" >&2
    "$V/bin/jmp" version >&2
    touch "$V/.complete"
    log "client venv $V: $(du -sm "$V" | cut -f1) MB in $((SECONDS - t0))s"
}
mkdir -p "$C"
( flock 9; build ) 9>"$C/jmp.lock"
echo "$V/bin/jmp"
