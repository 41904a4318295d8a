#!/bin/bash
# check-image.sh NAME - checks the real exporter image on lab host NAME, booted with
#   LAB_IMAGES="$(image.sh | tail -1)=quay.io/jumpstarter-dev/jumpstarter:latest" labhost.sh up NAME IP
# and the same LAB_* environment as that "up". As uid 65532 in the image: jmp runs; the launcher is there and
# leaves 127.0.0.1:2222 free; the Qemu driver takes a config with launcher_socket (adaptation); and a local exporter
# with a production-shaped ExporterConfig flashes a marker disk, boots it under TCG with AAVMF and shows the marker
# on the serial console (jmp shell --exporter-config, no controller). Exits non-zero on the first failure.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 NAME" >&2; exit 2; }
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MARKER=QSP-MARKER-$RANDOM$RANDOM
lab() { bash "$HERE/../labhost/labhost.sh" ssh "$1" "${@:2}"; }

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
bash "$HERE/marker-image.sh" "$T/marker.img" "$MARKER"
gzip -1c "$T/marker.img" >"$T/marker.img.gz" # 64 MB of mostly zeros
lab "$1" 'rm -rf /root/jmp-check && mkdir /root/jmp-check && gunzip >/root/jmp-check/marker.img' <"$T/marker.img.gz"

lab "$1" sh -s "$MARKER" <<'EOF'
set -eu
cd /root/jmp-check
cat >exporter.yaml <<'YAML'
apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata: {namespace: lab, name: check}
endpoint: ""
token: ""
exitOnLeaseEnd: true
export:
  qemu:
    type: jumpstarter_driver_qemu.driver.Qemu
    config:
      launcher_socket: /shared/launcher.sock
      arch: aarch64
      smp: 1
      mem: 256M
      default_partitions:
        OVMF_CODE.fd: /usr/share/AAVMF/AAVMF_CODE.fd
        OVMF_VARS.fd: /usr/share/AAVMF/AAVMF_VARS.fd
      hostfwd:
        ssh: {protocol: tcp, hostaddr: 127.0.0.1, hostport: 2222, guestport: 22}
  tcp:
    type: jumpstarter_driver_network.driver.TcpNetwork
    config: {host: 127.0.0.1, port: 2222}
YAML
cat >client.py <<'PY'
import sys, time
from jumpstarter.utils.env import env
t0 = time.time()
with env() as client:
    client.qemu.flasher.flash("/check/marker.img")
    client.qemu.power.on()
    with client.qemu.console.pexpect() as p:
        p.expect(sys.argv[1], timeout=90)
    print(f"check: marker on the serial console {time.time() - t0:.1f}s after flash and power on")
    client.qemu.power.off()
PY
chmod -R a+rX .
run() { podman run --rm --user 65532 -v /root/jmp-check:/check:ro quay.io/jumpstarter-dev/jumpstarter:latest "$@"; }
run jmp version
run sh -ec '/jumpstarter/bin/jumpstarter-exec serve --socket /tmp/l.sock & sleep 1; test -S /tmp/l.sock
    python3 -c "import socket; socket.socket().bind((\"127.0.0.1\", 2222))"; kill $!
    echo "check: jumpstarter-exec serves the launcher socket and leaves 127.0.0.1:2222 free"'
run python -c 'from jumpstarter_driver_qemu.driver import Qemu; Qemu(launcher_socket="/shared/launcher.sock")
print("check: Qemu driver accepts launcher_socket")'
timeout 150 podman run --rm --user 65532 -v /root/jmp-check:/check:ro quay.io/jumpstarter-dev/jumpstarter:latest \
    jmp shell --exporter-config /check/exporter.yaml -- python /check/client.py "$1"
rm -rf /root/jmp-check
EOF
echo "check-image: all checks passed on $1"
