#!/usr/bin/env bash
# Prints, as the last line of stdout, a directory holding podman and quadlet of Podman VERSION (default 4.9.3), built
# from the Go module proxy on first use; later runs only check the cache. For the lab-host variant in which they
# replace Debian's Podman (labhost.sh LAB_PODMAN): it runs with the host's own conmon, crun and netavark.
# With "quadlet-only", just that version's quadlet generator (pure Go, seconds), for test/quadlet_versions_test.ts.
#
# usage: build.sh [VERSION [quadlet-only]]
set -euo pipefail

VERSION=${1:-4.9.3}
ONLY=${2:-}
[[ $VERSION =~ ^[45]\.[0-9]+\.[0-9]+$ ]] || {
  echo "build.sh: only Podman 4.x.y and 5.x.y build here, not '$VERSION'" >&2
  exit 2
}
[[ -z $ONLY || $ONLY == quadlet-only ]] || {
  echo "build.sh: the second argument is quadlet-only or nothing, not '$ONLY'" >&2
  exit 2
}
P=github.com/containers/podman/v${VERSION%%.*}
if [[ -n $ONLY ]]; then
  CMDS=(quadlet) TAGS="" CGO=0
else
  CMDS=(podman quadlet) CGO=1
  # As distributions build it, less what needs C libraries a lab host does without: no btrfs or devicemapper graph
  # drivers, image signatures by the pure-Go OpenPGP instead of gpgme. seccomp (libseccomp-dev) is needed: without
  # it every container with the default profile fails ("seccomp not enabled in this build"); systemd (libsystemd-dev,
  # headers only, loaded at run time) for journald events and logs, the default on Debian and Ubuntu.
  TAGS="exclude_graphdriver_btrfs btrfs_noversion exclude_graphdriver_devicemapper containers_image_openpgp seccomp systemd"
fi
# Where Debian's package puts things, as podman's Makefile sets them: quadlet's ExecStart names ${BINDIR}/podman.
LDFLAGS="-X $P/libpod/define.buildInfo=0 -X $P/libpod/config._installPrefix=/usr -X $P/libpod/config._etcDir=/etc"
LDFLAGS+=" -X $P/pkg/systemd/quadlet._binDir=/usr/bin"
LDFLAGS+=" -X github.com/containers/common/pkg/config.additionalHelperBinariesDir=/usr/libexec/podman"

exec 3>&1 1>&2

cache="${QSP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qemu-ssh-provisioner}/podman"
# the key covers the recipe, so a changed one never reuses a stale build
key=$( (echo "$VERSION ${CMDS[*]} $TAGS $LDFLAGS"; go version) | sha256sum | cut -c1-12)
out="$cache/${ONLY:+quadlet-}podman-$VERSION-$key"

complete() {
  local c
  for c in "${CMDS[@]}"; do [[ -x $out/$c ]] || return 1; done
}
source "$(dirname "${BASH_SOURCE[0]}")/../cached_build.sh"
cached_or_locked complete "$out" "$cache"

echo "build.sh: building ${CMDS[*]} $VERSION from the Go module proxy (podman cold: several minutes on 2 cores)" >&2
t0=$SECONDS
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
# a wrapper module: podman's own go.mod needs no replace directives
printf 'module qsp.local/podman-build\ngo 1.21\nrequire %s v%s\n' "$P" "$VERSION" >"$work/go.mod"
pkgs=()
for c in "${CMDS[@]}"; do pkgs+=("$P/cmd/$c"); done
(cd "$work" && CGO_ENABLED=$CGO GOFLAGS=-mod=mod go build -trimpath -tags "$TAGS" -ldflags "$LDFLAGS" -o "$work/bin/" \
  "${pkgs[@]}")
[[ -n $ONLY ]] || "$work/bin/podman" --version | grep -qx "podman version $VERSION"
mkdir -p "$out.tmp"
for c in "${CMDS[@]}"; do mv -f "$work/bin/$c" "$out.tmp/"; done
rm -rf "$out"
mv "$out.tmp" "$out"
find "$cache" -maxdepth 1 -name '*podman-*' -mtime +14 -exec rm -rf {} +
echo "build.sh: ${CMDS[*]} $VERSION ready in $out ($((SECONDS - t0))s)" >&2
echo "$out" >&3
