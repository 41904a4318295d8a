#!/usr/bin/env bash
# Prints, as the last line of stdout, a directory holding executable jumpstarter-controller and jumpstarter-router
# (the real Jumpstarter, from the Go module proxy) and the CRDs of theirs that the project does not ship a copy of.
# Builds them on first use; later runs only check the cache.
set -euo pipefail

MODULE=github.com/jumpstarter-dev/jumpstarter-controller
# The only version the module proxy serves.
VERSION=v0.7.1
# Exporters and Leases are not here: tests use the project's own CRDs for those (v0.7.1's prunes spec.enabled).
CRDS=(jumpstarter.dev_clients.yaml jumpstarter.dev_exporteraccesspolicies.yaml)

# Callers parse only the last stdout line, so everything the Go tool prints must go to stderr.
exec 3>&1 1>&2

cache="${QSP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qemu-ssh-provisioner}/jumpstarter"
out="$cache/controller-$VERSION"

complete() {
  [[ -x $out/jumpstarter-controller && -x $out/jumpstarter-router ]] || return 1
  local crd
  for crd in "${CRDS[@]}"; do [[ -f $out/$crd ]] || return 1; done
}

source "$(dirname "${BASH_SOURCE[0]}")/../cached_build.sh"
cached_or_locked complete "$out" "$cache"

echo "build.sh: building Jumpstarter controller $VERSION from the Go module proxy; a cold build takes minutes" >&2
started=$SECONDS
mkdir -p "$out"
# Under the cache dir (not /tmp) so the final mv is an atomic rename on the same filesystem.
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
export CGO_ENABLED=0 GOFLAGS=-mod=mod

# The module's own go.mod cannot be built in place from the module cache (read-only, no go.sum), so a wrapper
# module requires it and builds its commands.
cat >"$work/go.mod" <<GOMOD
module qsp.local/jumpstarter-build
go 1.24
require $MODULE $VERSION
GOMOD
build() {
  (cd "$work" && go build -trimpath -ldflags="-s -w" -o "$out/.$1.tmp" "$2")
  mv -f "$out/.$1.tmp" "$out/$1"
}
[[ -x $out/jumpstarter-controller ]] || build jumpstarter-controller "$MODULE/cmd"
[[ -x $out/jumpstarter-router ]] || build jumpstarter-router "$MODULE/cmd/router"

src=$(cd "$work" && go list -m -f '{{.Dir}}' "$MODULE")/deploy/helm/jumpstarter/crds
for crd in "${CRDS[@]}"; do
  cp "$src/$crd" "$out/.$crd.tmp"
  chmod 0644 "$out/.$crd.tmp"
  mv -f "$out/.$crd.tmp" "$out/$crd"
done
echo "build.sh: built Jumpstarter controller and router $VERSION in $((SECONDS - started))s into $out" >&2
echo "$out" >&3
