#!/bin/bash
# image.sh - builds a real Jumpstarter 0.9.0 exporter image (Debian trixie + the PyPI wheels + QEMU: aarch64 with
# AAVMF, x86_64 with SeaBIOS) as a rootfs tarball for "podman import", to stand for
# quay.io/jumpstarter-dev/jumpstarter:latest on the lab hosts.
#
# usage (as root): image.sh
#   The last stdout line is the tarball (.tar.gz); beside it, TARBALL.changes holds one "podman import --change"
#   argument per line. labhost.sh imports it with LAB_IMAGES="TARBALL=quay.io/jumpstarter-dev/jumpstarter:latest".
#
# Released 0.9.0 predates upstream's launcher design, so the image carries adaptations (adapt-0.9.0-*, installed
# into the venv) and, as /jumpstarter/bin/jumpstarter-exec, the project's stand-in launcher built without its ssh
# listener: here QEMU runs in the exporter container, and its hostfwd needs 127.0.0.1:2222 of the namespace the
# exporter shares with the runtime.
#
# environment: QSP_CACHE (cache root, default ${XDG_CACHE_HOME:-$HOME/.cache}/qemu-ssh-provisioner; everything lives
# in $QSP_CACHE/jumpstarter), DEBIAN_MIRROR (default: this machine's apt sources, see ../labhost/debian-mirror.sh)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
C=$(realpath -m "${QSP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qemu-ssh-provisioner}")/jumpstarter
SUITE=trixie
MIRROR=$(bash "$HERE/../labhost/debian-mirror.sh")
# qemu-system-x86 with SeaBIOS: an x86_64 class boots under KVM where the lab host has it (test/e2e_kvm_test.ts).
# No OVMF: upstream's x86 default_partitions (/usr/share/edk2/ovmf/...) are absent, so q35 boots SeaBIOS, as it does
# with upstream's own exporter image.
PKGS=python3,python3-venv,qemu-system-arm,qemu-system-x86,seabios,qemu-utils,qemu-efi-aarch64,ipxe-qemu
PKGS+=,ca-certificates
REQS=(jumpstarter-cli==0.9.0 jumpstarter-driver-qemu==0.9.0 jumpstarter-driver-network==0.9.0)
# the wheels must match trixie's python, not this machine's
PYVER=3.13
# trixie has glibc 2.41; older pips do not expand a manylinux tag to the older ones it implies
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64)
STANDIN_SRC=$HERE/../labhost/standin
# empty: the launcher must leave 127.0.0.1:2222 to QEMU's hostfwd (variable defined in standin/runtime.go)
EXEC_LDFLAGS='-s -w -X main.defaultSSHListen='

log() { echo "[image $(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }
key() { sha256sum | cut -c1-12; }
mb() { du -sm "$@" | awk '{s += $1} END {print s " MB"}'; }

# ---------------------------------------------------------------- wheels
wheels_dir() { echo "$C/wheels-cp${PYVER/./}-$(echo "${PLATFORMS[*]} ${REQS[*]}" | key)"; }

fetch_wheels() {
    local W t0
    W=$(wheels_dir)
    [ -d "$W" ] && return 0
    t0=$(now)
    rm -rf "$W.tmp"
    python3 -m pip download -q --disable-pip-version-check --only-binary=:all: --implementation cp \
        --python-version "$PYVER" "${PLATFORMS[@]/#/--platform=}" -d "$W.tmp" "${REQS[@]}" >&2
    mv "$W.tmp" "$W"
    log "wheels: $(find "$W" -name '*.whl' | wc -l) files, $(mb "$W"), downloaded in $(since "$t0")s"
}

# ---------------------------------------------------------------- rootfs (debootstrap + venv), without the launcher
customize_rootfs() {
    local R=$1 W=$2 t0 site a m
    local run=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root chroot "$R") # not this machine's pip settings
    t0=$(now)
    cp -al "$W" "$R/tmp/wheels" # same file system as the cache: links, not copies
    "${run[@]}" python3 -m venv /jumpstarter
    "${run[@]}" /jumpstarter/bin/pip install -q --disable-pip-version-check --no-index --find-links /tmp/wheels \
        "${REQS[@]}" >&2
    rm -rf "$R/tmp/wheels"
    # each adaptation is a module imported by a .pth file, so it is active in every interpreter of the venv
    site=$(echo "$R"/jumpstarter/lib/python3*/site-packages)
    for a in "$HERE"/adapt-0.9.0-*.py; do
        m=jumpstarter_$(basename "$a" .py | tr -c 'a-zA-Z0-9\n' _)
        install -m644 "$a" "$site/$m.py"
        echo "import $m" >"$site/$m.pth"
    done
    # byte-compiles the adaptations too (uid 65532 cannot write __pycache__), and proves the venv imports
    "${run[@]}" /jumpstarter/bin/python -c 'import jumpstarter_driver_qemu.driver, jumpstarter_driver_network.driver'
    log "venv: $(mb "$R/jumpstarter") in $(since "$t0")s"
    echo 'jumpstarter:x:65532:65532:jumpstarter exporter:/home/jumpstarter:/usr/sbin/nologin' >>"$R/etc/passwd"
    echo 'jumpstarter:x:65532:' >>"$R/etc/group"
    install -d -m755 -o 65532 -g 65532 "$R/home/jumpstarter"
    "${run[@]}" qemu-system-aarch64 --version | head -1 >&2
    "${run[@]}" qemu-system-x86_64 --version | head -1 >&2
}

trim_rootfs() {
    local R=$1 before code
    before=$(mb "$R")
    # the exporter never installs anything; the 32-bit arm emulator is not the aarch64 one the driver runs
    rm -rf "${R:?}"/jumpstarter/bin/pip* "$R"/jumpstarter/lib/python3*/site-packages/pip "$R"/usr/bin/qemu-system-arm
    # upstream points the driver at AAVMF_{CODE,VARS}.fd; the secure-boot variants are 64 MB each
    code=$(readlink "$R"/usr/share/AAVMF/AAVMF_CODE.fd)
    find "$R"/usr/share/AAVMF -name '*.fd' ! -name AAVMF_CODE.fd ! -name AAVMF_VARS.fd ! -name "$code" -delete
    rm -rf "${R:?}"/var/cache/apt/* "$R"/var/lib/apt/lists/* "$R"/var/log/* "$R"/usr/share/doc/* "$R"/usr/share/man/* \
        "$R"/usr/share/info/* "$R"/usr/share/locale/* "$R"/dev/*
    log "trim: $before -> $(mb "$R")"
}

rootfs_tarball() {
    # covers everything that shapes the rootfs, so changing the recipe never reuses a stale one
    echo "$C/rootfs-$SUITE-$( (echo "$MIRROR $PKGS ${REQS[*]} $(wheels_dir)"; cat "$HERE"/adapt-0.9.0-*.py
        declare -f build_rootfs customize_rootfs trim_rootfs) | key).tar.zst"
}

build_rootfs() {
    local T B t0
    T=$(rootfs_tarball)
    [ -f "$T" ] && return 0
    B=$C/build-rootfs
    rm -rf "$B"
    mkdir -p "$C/debs"
    t0=$(now)
    log "debootstrap $SUITE from $MIRROR"
    debootstrap --variant=minbase --cache-dir="$C/debs" --include="$PKGS" "$SUITE" "$B" "$MIRROR" \
        >"$C/debootstrap.log" 2>&1 || { tail -20 "$C/debootstrap.log" >&2; die "debootstrap failed"; }
    log "debootstrap: $(mb "$B") in $(since "$t0")s"
    customize_rootfs "$B" "$(wheels_dir)"
    trim_rootfs "$B"
    t0=$(now)
    tar --numeric-owner --xattrs --xattrs-include='*' -C "$B" -c . | zstd -q -T0 -o "$T.tmp"
    mv "$T.tmp" "$T"
    log "rootfs: $(du -m "$T" | cut -f1) MB compressed in $(since "$t0")s"
    rm -rf "$B"
}

# ---------------------------------------------------------------- launcher (the stand-in, without ssh listener)
exec_binary() {
    echo "$C/jumpstarter-exec-$( (cd "$STANDIN_SRC" && echo "$EXEC_LDFLAGS" &&
        find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) | LC_ALL=C sort | xargs sha256sum) | key)"
}

build_exec() {
    local O go=go
    O=$(exec_binary)
    [ -x "$O" ] && return 0
    command -v go >/dev/null || go=/usr/local/go/bin/go
    (cd "$STANDIN_SRC" && CGO_ENABLED=0 "$go" build -trimpath -ldflags="$EXEC_LDFLAGS" -o "$O.tmp" .) >&2
    mv "$O.tmp" "$O"
    log "launcher $O built"
}

# ---------------------------------------------------------------- image = rootfs + launcher
# podman's config for the import: the quadlets set user and command, these are the defaults for a plain podman run
changes() {
    cat <<'EOF'
ENV=PATH=/jumpstarter/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ENV=VIRTUAL_ENV=/jumpstarter
USER=65532:65532
WORKDIR=/home/jumpstarter
CMD=["jmp","--help"]
LABEL=org.opencontainers.image.version=0.9.0
EOF
}

image_tarball() {
    echo "$C/exporter-0.9.0-$( (basename "$(rootfs_tarball)"; sha256sum <"$(exec_binary)"; changes
        declare -f build_image) | key).tar.gz"
}

build_image() {
    local I S t0
    I=$(image_tarball)
    [ -f "$I" ] && return 0
    t0=$(now)
    # appending one file to the cached rootfs is cheaper than keeping the rootfs unpacked or rebuilding it
    S=$C/build-image
    rm -rf "$S"
    install -D -m755 "$(exec_binary)" "$S/root/jumpstarter/bin/jumpstarter-exec"
    zstd -q -dc "$(rootfs_tarball)" >"$S/image.tar"
    tar -rf "$S/image.tar" --numeric-owner --owner=0 --group=0 -C "$S/root" ./jumpstarter/bin/jumpstarter-exec
    log "image: $(du -m "$S/image.tar" | cut -f1) MB uncompressed"
    # gzip, not zstd: podman 5.4's import takes a zstd tarball for an uncompressed layer and fails on its digest
    gzip -1 -c "$S/image.tar" >"$I.tmp"
    changes >"$I.changes"
    mv "$I.tmp" "$I"
    rm -rf "$S"
    log "image: $(du -m "$I" | cut -f1) MB compressed, assembled in $(since "$t0")s"
}

# Other checkouts may share the cache, so only what nobody used for two weeks goes.
prune_cache() {
    find "$C" -maxdepth 1 -mtime +14 \( -name 'wheels-*' -o -name 'rootfs-*' -o -name 'exporter-*' -o \
        -name 'jumpstarter-exec-*' \) -exec rm -rf {} +
}

build() {
    fetch_wheels
    build_rootfs
    build_exec
    build_image
    touch "$(wheels_dir)" "$(rootfs_tarball)" "$(exec_binary)" "$(image_tarball)" "$(image_tarball).changes"
    prune_cache
}

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot)"
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v zstd >/dev/null || need+=(zstd)
command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || need+=(golang-go)
[ ${#need[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >&2
mkdir -p "$C"
( flock 9; build ) 9>"$C/build.lock"
image_tarball
