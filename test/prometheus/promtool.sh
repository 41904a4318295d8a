#!/bin/bash
# promtool.sh - Prometheus's promtool from Debian's `prometheus` package, unpacked into the cache rather than
# installed: installing the package would also start a Prometheus server on this machine.
#
# usage: promtool.sh     the last stdout line is the path of the promtool executable
# environment: QSP_CACHE (cache root, default ${XDG_CACHE_HOME:-$HOME/.cache}/qemu-ssh-provisioner)
set -euo pipefail

C=$(realpath -m "${QSP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qemu-ssh-provisioner}")/prometheus
log() { echo "[promtool $(date +%T)] $*" >&2; }

build() {
    [ -x "$C/usr/bin/promtool" ] && return 0
    local tmp
    tmp=$(mktemp -d)
    # apt-get download needs package lists; a fresh machine may have none yet
    (cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root prometheus >&2) ||
        { apt-get update -q >&2 && (cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root prometheus >&2); }
    rm -rf "$C/usr"
    dpkg-deb -x "$tmp"/prometheus_*.deb "$C"
    rm -rf "$tmp"
    log "$("$C/usr/bin/promtool" --version 2>&1 | head -n 1)"
}
mkdir -p "$C"
( flock 9; build ) 9>"$C/promtool.lock"
echo "$C/usr/bin/promtool"
