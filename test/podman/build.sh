#!/usr/bin/env bash
# Prints, as the last line of stdout, a directory holding podman and quadlet of Podman VERSION (default 4.9.3), built
# from the Go module proxy on first use; later runs only check the cache. For the lab-host variant in which they
# replace Debian's Podman (labhost.sh LAB_PODMAN): it runs with the host's own conmon, crun and netavark.
#
# usage: build.sh [VERSION]
set -euo pipefail

VERSION=${1:-4.9.3}
[[ $VERSION =~ ^4\.[0-9]+\.[0-9]+$ ]] || {
  echo "build.sh: only Podman 4.x.y builds here (module github.com/containers/podman/v4), not '$VERSION'" >&2
  exit 2
}
# As distributions build it, less what needs C libraries a lab host does without: no btrfs or devicemapper graph
# drivers, image signatures by the pure-Go OpenPGP instead of gpgme. seccomp (libseccomp-dev) is needed: without it
# every container with the default profile fails ("seccomp not enabled in this build"); systemd (libsystemd-dev,
# headers only, loaded at run time) for journald events and logs, the default on Debian and Ubuntu.
TAGS="exclude_graphdriver_btrfs btrfs_noversion exclude_graphdriver_devicemapper containers_image_openpgp seccomp systemd"
P=github.com/containers/podman/v4
# Where Debian's package puts things, as podman's Makefile sets them: quadlet's ExecStart names ${BINDIR}/podman.
LDFLAGS="-X $P/libpod/define.buildInfo=0 -X $P/libpod/config._installPrefix=/usr -X $P/libpod/config._etcDir=/etc"
LDFLAGS+=" -X $P/pkg/systemd/quadlet._binDir=/usr/bin"
LDFLAGS+=" -X github.com/containers/common/pkg/config.additionalHelperBinariesDir=/usr/libexec/podman"

exec 3>&1 1>&2

cache="${QSP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qemu-ssh-provisioner}/podman"
# the key covers the recipe, so a changed one never reuses a stale build
key=$( (echo "$VERSION $TAGS $LDFLAGS"; go version) | sha256sum | cut -c1-12)
out="$cache/podman-$VERSION-$key"

complete() { [[ -x $out/podman && -x $out/quadlet ]]; }
source "$(dirname "${BASH_SOURCE[0]}")/../cached_build.sh"
cached_or_locked complete "$out" "$cache"

echo "build.sh: building podman and quadlet $VERSION from the Go module proxy (cold: a few minutes on 2 cores)" >&2
t0=$SECONDS
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
# a wrapper module: podman's own go.mod needs no replace directives
printf 'module qsp.local/podman-build\ngo 1.21\nrequire %s v%s\n' "$P" "$VERSION" >"$work/go.mod"
(cd "$work" && CGO_ENABLED=1 GOFLAGS=-mod=mod go build -trimpath -tags "$TAGS" -ldflags "$LDFLAGS" -o "$work/bin/" \
  "$P/cmd/podman" "$P/cmd/quadlet")
"$work/bin/podman" --version | grep -qx "podman version $VERSION"
mkdir -p "$out.tmp"
mv -f "$work/bin/podman" "$work/bin/quadlet" "$out.tmp/"
rm -rf "$out"
mv "$out.tmp" "$out"
find "$cache" -maxdepth 1 -name 'podman-*' -mtime +14 -exec rm -rf {} +
echo "build.sh: podman $VERSION ready in $out ($((SECONDS - t0))s)" >&2
echo "$out" >&3
