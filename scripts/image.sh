#!/bin/bash
# `deno task image [REF]`: the controller's OCI image, built offline from what this project produces: FROM scratch, a
# root filesystem of the Deno runtime (the npm package's binary, the one running this task), the air-gapped bundle, a
# small static launcher at /exporter-set-controller, and Debian's libc6, libgcc-s1, ca-certificates and tzdata,
# unpacked (not installed) from the machine's apt sources. Built by Podman (installed from Debian if missing).
# The last line is `image REF SIZE_MB`.
set -euo pipefail
cd "$(dirname "$0")/.."
REF=${1:-localhost/qemu-ssh-provisioner:latest}
CACHE=$(realpath -m "${QSP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qemu-ssh-provisioner}")/image
DENO_BIN=$(readlink -f "${DENO_BIN:-$(command -v deno)}")
log() { echo "[image $(date +%T)] $*" >&2; }

if ! command -v podman >/dev/null; then
    log "installing podman"
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends podman >&2
fi
command -v go >/dev/null || { log "Go is needed to build the launcher"; exit 1; }

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
R=$ctx/rootfs
mkdir -p "$R"/etc/ssl/certs "$R"/home/nonroot "$R"/tmp "$R"/usr/share "$R"/lib64

# Debian's runtime pieces, once per machine (the .debs are kept in the cache)
DEBS=(libc6 libgcc-s1 ca-certificates tzdata)
mkdir -p "$CACHE/debs"
(
    flock 9
    for p in "${DEBS[@]}"; do
        ls "$CACHE/debs/${p}"_*.deb >/dev/null 2>&1 && continue
        (cd "$CACHE/debs" && apt-get download -q -o APT::Sandbox::User=root "$p" >&2) ||
            { apt-get update -q >&2 && (cd "$CACHE/debs" && apt-get download -q -o APT::Sandbox::User=root "$p" >&2); }
    done
) 9>"$CACHE/debs.lock"
X=$ctx/x
# shellcheck disable=SC2012 # .deb names are Debian package names, and ls sorts them (the newest last)
for p in "${DEBS[@]}"; do dpkg-deb -x "$(ls "$CACHE/debs/${p}"_*.deb | tail -n 1)" "$X"; done

# what a glibc program needs (bookworm keeps it in /lib, trixie in /usr/lib), without gconv or locales
libdir=$(dirname "$(find "$X" -name 'libc.so.6' | head -n 1)")
mkdir -p "$R/lib/x86_64-linux-gnu"
for l in ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libgcc_s.so.1; do
    cp -L "$libdir/$l" "$R/lib/x86_64-linux-gnu/$l" 2>/dev/null ||
        cp -L "$(find "$X" -name "$l" | head -n 1)" "$R/lib/x86_64-linux-gnu/$l"
done
ln -s /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$R/lib64/ld-linux-x86-64.so.2"
# update-ca-certificates' result, without running it
cat "$X"/usr/share/ca-certificates/mozilla/*.crt >"$R/etc/ssl/certs/ca-certificates.crt"
cp -a "$X/usr/share/zoneinfo" "$R/usr/share/zoneinfo"
rm -rf "$R/usr/share/zoneinfo/right" "$R/usr/share/zoneinfo/posix"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$R/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$R/etc/group"
chown 65532:65532 "$R/home/nonroot"
chmod 1777 "$R/tmp"

cp "$DENO_BIN" "$R/deno"
sh scripts/bundle.sh "$R/qemu-ssh-provisioner.js" >/dev/null
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X 'main.flags=$(sh scripts/permissions.sh)'" \
    -o "$R/exporter-set-controller" scripts/image/launcher.go

podman build -q --no-cache -f "$PWD/Containerfile" -t "$REF" "$ctx" >&2
size=$(podman image inspect --format '{{.Size}}' "$REF")
echo "image $REF $(((size + 524288) / 1048576))"
