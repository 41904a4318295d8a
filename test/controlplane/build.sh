#!/usr/bin/env bash
# Prints, as the last line of stdout, a directory holding executable kube-apiserver, kube-controller-manager and etcd.
# Builds them from the Go module proxy on first use; later runs only check the cache.
set -euo pipefail

K8S_VERSION=v1.37.2
ETCD_VERSION=v3.6.16
BINARIES=(etcd kube-apiserver kube-controller-manager)

# Callers parse only the last stdout line, so everything the Go tool prints must go to stderr.
exec 3>&1 1>&2

has_binaries() {
  local b
  for b in "${BINARIES[@]}"; do [[ -x $1/$b ]] || return 1; done
}

cache="${QSP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qemu-ssh-provisioner}/controlplane"
out="$cache/k8s-${K8S_VERSION#v}-etcd-${ETCD_VERSION#v}"

if [[ -n ${KUBEBUILDER_ASSETS:-} && -x $KUBEBUILDER_ASSETS/kube-apiserver && -x $KUBEBUILDER_ASSETS/etcd ]]; then
  if has_binaries "$KUBEBUILDER_ASSETS"; then
    echo "$KUBEBUILDER_ASSETS" >&3
    exit 0
  fi
  # envtest assets hold only kube-apiserver and etcd: a directory of links to those gets our kube-controller-manager
  # beside them, built once per assets directory.
  out="$cache/envtest-$(cksum <<<"$KUBEBUILDER_ASSETS" | cut -d' ' -f1)"
  mkdir -p "$out"
  for b in kube-apiserver etcd; do [[ -e $out/$b ]] || ln -sfn "$KUBEBUILDER_ASSETS/$b" "$out/$b"; done
fi

complete() { has_binaries "$out"; }
source "$(dirname "${BASH_SOURCE[0]}")/../cached_build.sh"
cached_or_locked complete "$out" "$cache"

missing=()
for b in "${BINARIES[@]}"; do [[ -x $out/$b ]] || missing+=("$b"); done
echo "build.sh: building ${missing[*]} (Kubernetes $K8S_VERSION, etcd $ETCD_VERSION) from the Go module proxy;" \
  "a cold build of all three takes about 12 minutes on 2 cores" >&2

mkdir -p "$out"
# Under the cache dir (not /tmp) so the final mv is an atomic rename on the same filesystem.
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
export CGO_ENABLED=0 GOFLAGS=-mod=mod

# One go build for all the commands asked for compiles the packages they share once.
build_kubernetes() {
  local mod="$work/kubernetes" staging_version gomod
  # Staging modules are published as v0.M.P alongside k8s.io/kubernetes v1.M.P.
  staging_version="v0.${K8S_VERSION#v1.}"
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  [[ -f $gomod ]] || {
    echo "build.sh: no go.mod for k8s.io/kubernetes@$K8S_VERSION" >&2
    exit 1
  }
  mkdir -p "$mod"
  {
    echo "module qsp.local/kubernetes-build"
    echo "go $(sed -n 's/^go //p' "$gomod")"
    echo "require k8s.io/kubernetes $K8S_VERSION"
    # k8s.io/kubernetes replaces its staging modules with ./staging paths that do not exist outside its repository.
    sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/src/.*#replace \1 => \1 '"$staging_version"'#p' "$gomod"
  } >"$mod/go.mod"
  grep -q '^replace' "$mod/go.mod" || {
    echo "build.sh: found no staging replaces in $gomod" >&2
    exit 1
  }
  # Without these (set by Kubernetes' own hack/lib/version.sh) /version reports v0.0.0-master, which clients misread.
  local minor="${K8S_VERSION#v1.}" ldflags="" pkg cmd pkgs=()
  minor="${minor%%.*}"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  for cmd; do pkgs+=("k8s.io/kubernetes/cmd/$cmd"); done
  (cd "$mod" && go build -trimpath -ldflags="$ldflags" -o "$work/bin/" "${pkgs[@]}")
  for cmd; do mv -f "$work/bin/$cmd" "$out/$cmd"; done
}

build_etcd() {
  local mod="$work/etcd"
  mkdir -p "$mod"
  cat >"$mod/go.mod" <<EOF
module qsp.local/etcd-build
go 1.24
require go.etcd.io/etcd/server/v3 $ETCD_VERSION
EOF
  cat >"$mod/main.go" <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
  (cd "$mod" && go build -trimpath -o "$out/.etcd.tmp" .)
  mv -f "$out/.etcd.tmp" "$out/etcd"
}

started=$SECONDS
kubernetes=()
for b in "${missing[@]}"; do
  if [[ $b == etcd ]]; then build_etcd; else kubernetes+=("$b"); fi
done
((${#kubernetes[@]} == 0)) || build_kubernetes "${kubernetes[@]}"
echo "build.sh: built ${missing[*]} in $((SECONDS - started))s into $out" >&2
echo "$out" >&3
