#!/bin/bash
# marker-image.sh OUT MARKER - writes OUT, a 64 MB FAT disk image (no partition table) whose startup.nsh prints
# MARKER, alone on its line, on the console: the UEFI shell of AAVMF/OVMF runs it when nothing else boots. Stands in
# for a guest OS image, since none is reachable here. Needs mtools (installed if missing, as root).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 OUT MARKER" >&2; exit 2; }
OUT=$1 MARKER=$2
[[ $MARKER =~ ^[A-Za-z0-9_.:=-]+$ ]] || { echo "marker-image: MARKER must match [A-Za-z0-9_.:=-]+" >&2; exit 2; }
command -v mformat >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mtools >&2
rm -f "$OUT.tmp"
truncate -s 64M "$OUT.tmp"
# 64 MB = 131072 sectors; mformat wants a geometry for a plain file
mformat -i "$OUT.tmp" -T 131072 -h 64 -s 32 -v JMPTEST ::
# echo -off: the shell would otherwise also print the command line, which contains the marker too
printf '@echo -off\r\necho %s\r\n' "$MARKER" | mcopy -i "$OUT.tmp" - ::/startup.nsh
mv "$OUT.tmp" "$OUT"
