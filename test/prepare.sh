#!/usr/bin/env bash
# Installs and builds what the test suite and the sandbox need, so a fresh Debian machine with Deno (or Node/npm)
# and Go is enough. Idempotent; everything heavy is cached outside the repository (~/.cache/qemu-ssh-provisioner).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "prepare: the lab hosts are systemd-nspawn containers in network namespaces: run as root" >&2
  exit 1
fi
missing=()
for tool in debootstrap:debootstrap systemd-nspawn:systemd-container zstd:zstd ssh:openssh-client \
  ssh-keygen:openssh-client openssl:openssl ip:iproute2 flock:util-linux python3:python3 mformat:mtools \
  shellcheck:shellcheck; do
  command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
# Podman 4.9.3 (test/podman/build.sh) is built with cgo against libseccomp and libsystemd's headers
command -v gcc >/dev/null || missing+=(gcc libc6-dev)
command -v pkg-config >/dev/null || missing+=(pkg-config)
for lib in libseccomp libsystemd; do
  pkg-config --exists "$lib" 2>/dev/null || missing+=("$lib-dev")
done
# the real chain's wheels are fetched with this machine's pip, its jmp client lives in a venv
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
python3 -c 'import ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "prepare: installing ${missing[*]}" >&2
  apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi
command -v go >/dev/null || { echo "prepare: Go is needed to build kube-apiserver and etcd" >&2; exit 1; }

t0=$SECONDS
bash test/controlplane/build.sh >/dev/null
echo "prepare: control plane binaries ready ($((SECONDS - t0))s)" >&2
t0=$SECONDS
bash test/labhost/labhost.sh base
echo "prepare: lab host base image ready ($((SECONDS - t0))s)" >&2
# the lab-host variants of the Podman tests: Podman 4.9.3 in place of trixie's 5.4, and bookworm's 4.3.1
t0=$SECONDS
bash test/podman/build.sh 4.9.3 >/dev/null
# the quadlet generators of test/quadlet_versions_test.ts, pure Go, seconds each
for v in 4.4.1 4.6.2 5.2.5 5.3.2 5.4.2; do bash test/podman/build.sh "$v" quadlet-only >/dev/null; done
SUITE=bookworm bash test/labhost/labhost.sh base
echo "prepare: Podman 4.9.3, the quadlet generators and the bookworm lab host image ready ($((SECONDS - t0))s)" >&2

# The real Jumpstarter chain: the controller is a CPU-bound Go build; the exporter image and the jmp client mostly
# download, so they run beside it.
t0=$SECONDS
bash test/jumpstarter/image.sh >/dev/null &
image=$!
bash test/jumpstarter/jmp.sh >/dev/null &
client=$!
bash test/jumpstarter/build.sh >/dev/null
wait $image || { echo "prepare: building the real exporter image failed" >&2; exit 1; }
wait $client || { echo "prepare: installing the jmp client failed" >&2; exit 1; }
echo "prepare: real Jumpstarter controller, exporter image and jmp client ready ($((SECONDS - t0))s)" >&2
