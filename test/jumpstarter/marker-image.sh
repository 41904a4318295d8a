#!/bin/bash
# marker-image.sh OUT MARKER [uefi|bios] - writes OUT, a disk image that prints MARKER, alone on its line, on the
# serial console. Stands in for a guest OS image, since none is reachable here.
#   uefi (default): a 64 MB FAT image (no partition table) whose startup.nsh echoes MARKER: the UEFI shell of
#     AAVMF/OVMF runs it when nothing else boots. Needs mtools (installed if missing, as root).
#   bios: a 1 MB disk whose boot sector writes MARKER to COM1, again and again: SeaBIOS (x86_64 q35 without OVMF)
#     runs it at once, so the boot takes about as long as the firmware does, under KVM or TCG.
set -euo pipefail
[ $# -eq 2 ] || [ $# -eq 3 ] || { echo "usage: $0 OUT MARKER [uefi|bios]" >&2; exit 2; }
OUT=$1 MARKER=$2 KIND=${3:-uefi}
[[ $MARKER =~ ^[A-Za-z0-9_.:=-]{1,200}$ ]] || { echo "marker-image: MARKER must match [A-Za-z0-9_.:=-]{1,200}" >&2; exit 2; }
rm -f "$OUT.tmp"
case "$KIND" in
uefi)
    command -v mformat >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mtools >&2
    truncate -s 64M "$OUT.tmp"
    # 64 MB = 131072 sectors; mformat wants a geometry for a plain file
    mformat -i "$OUT.tmp" -T 131072 -h 64 -s 32 -v JMPTEST ::
    # echo -off: the shell would otherwise also print the command line, which contains the marker too
    printf '@echo -off\r\necho %s\r\n' "$MARKER" | mcopy -i "$OUT.tmp" - ::/startup.nsh
    ;;
bios)
    # 16-bit real mode, loaded at 0x7c00: cli; ds=0; cld; sti; again: si=msg (0x7c1d); dx=0x3f8 (COM1);
    # next: lodsb; test al,al; jz wait; out dx,al; jmp next; wait: cx=4; w: hlt; loop w; jmp again;
    # msg: "\r\nMARKER\r\n\0". Again every 4 timer ticks (~0.2 s): QEMU drops serial output while nobody has the
    # console's pty open, and under KVM the firmware gets here before the client opens it.
    {
        printf '\xfa\x31\xc0\x8e\xd8\xfc\xfb\xbe\x1d\x7c\xba\xf8\x03\xac\x84\xc0\x74\x03\xee\xeb\xf8'
        printf '\xb9\x04\x00\xf4\xe2\xfd\xeb\xea'
        printf '\r\n%s\r\n\0' "$MARKER"
    } >"$OUT.tmp"
    truncate -s 510 "$OUT.tmp"
    printf '\x55\xaa' >>"$OUT.tmp"
    truncate -s 1M "$OUT.tmp"
    ;;
*) echo "marker-image: the kind is uefi or bios, not $KIND" >&2; exit 2 ;;
esac
mv "$OUT.tmp" "$OUT"
