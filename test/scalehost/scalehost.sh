#!/bin/bash
# scalehost.sh - hundreds of cheap lab hosts for the scale benchmark (bench/scale.ts).
#
# A scale host is a real OpenSSH sshd (Debian's openssh-server, unpacked into the cache, not installed) bound to its
# own address, in its own mount namespace, running the project's host scripts with the machine's own sh and
# coreutils. systemd, Podman, journald and mkfs.ext4 are replaced by recording fakes (fakes/fake-systemctl,
# fake-podman, fake-journalctl, fake-mkfs.ext4), installed under those names on the host's PATH, so a host costs a
# few MiB instead of a booted system container.
#
#   network:  one network namespace ($SCALE_NETNS) joined to this one by a veth pair ($SCALE_VETH <-> "eth0" inside);
#             this side has $SCALE_NET.0.1/16, the namespace holds every host address as a /32. Traffic reaches only
#             addresses created here. Host i (1-based) is $SCALE_NET.(1 + (i-1)/200).(10 + (i-1)%200).
#   per host: `unshare --mount` (private), then
#               /etc            overlay: lower = etc-extra (passwd/group with sshd's privsep user, root's shell sh)
#                               over the machine's /etc, upper = the host's own dir, so /etc/containers/systemd,
#                               /etc/jumpstarter/... and the fakes' generator dir are the host's alone
#               /run            the host's own dir (sshd's privsep dir, fake-systemd/podman state, pending markers)
#               /var/lib/qemu-ssh.jumpstarter.dev  the host's own dir (the /disk volumes' sparse images, the launcher
#                               staging script and its cache)
#               /usr/local/sbin the fakes (read-only), first on the scripts' PATH
#               /dev/kvm        a node of the hosts' own (same device), 0660 root:kvm
#             and sshd -f its config (ListenAddress = its address, ForceCommand = session-recorder, log to sshd.log).
#   state:    one tmpfs at $SCALE_DIR/fs (hosts' upper dirs and /run), unmounted by `down`.
#
# usage (as root):
#   scalehost.sh up N          create the network and hosts h1..hN (keys, sshd); prints nothing, waits for all ports
#   scalehost.sh down          kill every process in the namespace (by pid), delete it and the veth, unmount, remove
#   scalehost.sh hosts         one line per host: NAME ADDRESS STATEDIR
#   scalehost.sh leftovers     one line per host with anything left: NAME WHAT... (quadlets, configs, units, ...)
#   scalehost.sh mem           PSS of every process in the namespace (KiB total), tmpfs use (KiB), process count
#
# environment (defaults): SCALE_DIR=/tmp/qsp-scale SCALE_NETNS=qspscale SCALE_VETH=qspsc0 SCALE_NET=10.90
#   QSP_CACHE (the sshd .debs are unpacked into $QSP_CACHE/scalehost)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SCALE_DIR=$(realpath -m "${SCALE_DIR:-/tmp/qsp-scale}")
SCALE_NETNS=${SCALE_NETNS:-qspscale}
SCALE_VETH=${SCALE_VETH:-qspsc0}
SCALE_NET=${SCALE_NET:-10.90}
CACHE=${QSP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qemu-ssh-provisioner}/scalehost
SSHD_ROOT=$CACHE/root
SSHD=$SSHD_ROOT/usr/sbin/sshd
FS=$SCALE_DIR/fs
KEY=$SCALE_DIR/keys/id_ed25519

log() { echo "[scalehost $(date +%T)] $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

address() { # INDEX (1-based)
    local i=$(($1 - 1))
    echo "$SCALE_NET.$((1 + i / 200)).$((10 + i % 200))"
}

# Debian's sshd and the one library it needs that this machine lacks, unpacked (apt-get download + dpkg -x).
ensure_sshd() {
    [ -x "$SSHD" ] && [ -e "$SSHD_ROOT/usr/lib/x86_64-linux-gnu/libwrap.so.0" ] && return 0
    mkdir -p "$CACHE"
    (
        cd "$CACHE"
        apt-get download openssh-server libwrap0 >&2 2>/dev/null ||
            { apt-get update -q >&2 && apt-get download openssh-server libwrap0 >&2; }
        for d in openssh-server_*.deb libwrap0_*.deb; do dpkg -x "$d" root; done
    )
    [ -x "$SSHD" ] || die "no sshd in $SSHD_ROOT"
}

sshd_env() { echo "LD_LIBRARY_PATH=$SSHD_ROOT/usr/lib/x86_64-linux-gnu"; }

net_up() {
    ip netns add "$SCALE_NETNS"
    ip link add "$SCALE_VETH" type veth peer name eth0 netns "$SCALE_NETNS"
    ip addr add "$SCALE_NET.0.1/16" dev "$SCALE_VETH"
    ip link set "$SCALE_VETH" up
    ip -n "$SCALE_NETNS" link set lo up
    ip -n "$SCALE_NETNS" addr add "$SCALE_NET.0.2/16" dev eth0
    ip -n "$SCALE_NETNS" link set eth0 up
}

shared_init() {
    mkdir -p "$SCALE_DIR/keys" "$FS"
    mountpoint -q "$FS" || mount -t tmpfs -o size=4g,mode=0755 qsp-scale "$FS"
    [ -f "$KEY" ] || ssh-keygen -q -t ed25519 -N '' -C qsp-scalehost -f "$KEY"
    install -m600 "$KEY.pub" "$SCALE_DIR/authorized_keys"
    # etc-extra: the machine's passwd and group plus sshd's privsep user; root's shell sh (no bash start-up)
    local X=$SCALE_DIR/etc-extra
    mkdir -p "$X"
    sed 's#^\(root:.*:\)[^:]*$#\1/bin/sh#' /etc/passwd >"$X/passwd"
    grep -q '^sshd:' "$X/passwd" || echo 'sshd:x:101:65534::/run/sshd:/usr/sbin/nologin' >>"$X/passwd"
    cp /etc/group "$X/group"
    # a /dev/kvm node of the hosts' own, 0660 root:kvm as Debian ships it, so the machine's (often 0600) is never the
    # one the scripts judge or change; the kvm group is added where the machine has none
    grep -q '^kvm:' "$X/group" || echo 'kvm:x:36:' >>"$X/group"
    if [ -c /dev/kvm ] && [ ! -c "$FS/kvm" ]; then
        mknod -m 0660 "$FS/kvm" c 10 232
        chown "0:$(awk -F: '$1 == "kvm" { print $3 }' "$X/group")" "$FS/kvm"
    fi
    # the fakes under the names the scripts call
    mkdir -p "$SCALE_DIR/bin"
    install -m755 "$HERE/fakes/fake-systemctl" "$SCALE_DIR/bin/systemctl"
    install -m755 "$HERE/fakes/fake-podman" "$SCALE_DIR/bin/podman"
    install -m755 "$HERE/fakes/fake-journalctl" "$SCALE_DIR/bin/journalctl"
    install -m755 "$HERE/fakes/fake-mkfs.ext4" "$SCALE_DIR/bin/mkfs.ext4"
    install -m755 "$HERE/fakes/session-recorder" "$SCALE_DIR/bin/session-recorder"
    : >"$SCALE_DIR/known_hosts"
    : >"$SCALE_DIR/hosts.txt"
}

host_init() { # NAME ADDRESS
    local N=$1 IP=$2 H=$FS/$1
    mkdir -p "$H/etc-upper/containers/systemd" "$H/etc-upper/fake-systemd/generator" "$H/etc-work" \
        "$H/run/sshd" "$H/run/fake-systemd/units" "$H/run/fake-podman/volumes" "$H/run/fake-podman/containers" \
        "$H/run/fake-podman/images" "$H/run/fake-host" "$H/state" "$SCALE_DIR/hostkeys"
    chmod 0755 "$H/run/sshd"
    : >"$H/run/fake-host/sessions"
    : >"$H/run/fake-systemd/calls"
    : >"$H/run/fake-podman/calls"
    [ -f "$SCALE_DIR/hostkeys/$N" ] || ssh-keygen -q -t ed25519 -N '' -C "$N" -f "$SCALE_DIR/hostkeys/$N"
    cat >"$H/sshd_config" <<EOF
ListenAddress $IP:22
HostKey $SCALE_DIR/hostkeys/$N
PidFile /run/sshd.pid
AuthorizedKeysFile $SCALE_DIR/authorized_keys
StrictModes no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
AllowTcpForwarding no
ForceCommand /usr/local/sbin/session-recorder
LogLevel INFO
EOF
}

host_start() { # NAME
    local H=$FS/$1
    # shellcheck disable=SC2016
    nsenter --net="/run/netns/$SCALE_NETNS" unshare --mount --propagation private -- /bin/sh -c '
        set -e
        mount -t overlay overlay -o "lowerdir=$2/etc-extra:/etc,upperdir=$1/etc-upper,workdir=$1/etc-work" /etc
        mount --bind "$1/run" /run
        # what the scripts keep there (src/host/render.ts STATE_DIR): each host has its own, not the machine /var
        mkdir -p /var/lib/qemu-ssh.jumpstarter.dev
        mount --bind "$1/state" /var/lib/qemu-ssh.jumpstarter.dev
        if [ -c "$5" ]; then mount --bind "$5" /dev/kvm; fi
        mount --bind "$2/bin" /usr/local/sbin
        mount -o remount,bind,ro /usr/local/sbin
        exec env "$4" "$3" -f "$1/sshd_config" -E "$1/sshd.log"
    ' sh "$H" "$SCALE_DIR" "$SSHD" "$(sshd_env)" "$FS/kvm"
}

up() {
    local n=$1 i
    [ "$(id -u)" = 0 ] || die "must run as root"
    [ "$n" -ge 1 ] && [ "$n" -le 2000 ] || die "host count out of range: $n"
    if ip netns list | grep -qw "$SCALE_NETNS"; then die "netns $SCALE_NETNS exists (run down first)"; fi
    ensure_sshd
    shared_init
    net_up
    for ((i = 1; i <= n; i++)); do echo "h$i $(address "$i")"; done >"$SCALE_DIR/hosts.txt"
    while read -r _ ip; do echo "addr add $ip/32 dev eth0"; done <"$SCALE_DIR/hosts.txt" |
        ip -n "$SCALE_NETNS" -batch -
    export -f host_init host_start sshd_env
    export SCALE_DIR FS SCALE_NETNS SSHD SSHD_ROOT
    # shellcheck disable=SC2016
    xargs -P 8 -n 2 bash -c 'host_init "$0" "$1" && host_start "$0"' <"$SCALE_DIR/hosts.txt"
    while read -r name ip; do
        echo "$ip $(cut -d' ' -f1,2 "$SCALE_DIR/hostkeys/$name.pub")"
    done <"$SCALE_DIR/hosts.txt" >"$SCALE_DIR/known_hosts"
    local deadline=$((SECONDS + 60)) listening
    while :; do
        listening=$(ip netns exec "$SCALE_NETNS" ss -Hltn 'sport = :22' | wc -l)
        [ "$listening" -ge "$n" ] && break
        [ "$SECONDS" -lt "$deadline" ] || die "only $listening of $n sshd listening after 60 s"
        sleep 0.2
    done
}

down() {
    local pids sig tries=0
    if ip netns list | grep -qw "$SCALE_NETNS"; then
        while pids=$(ip netns pids "$SCALE_NETNS") && [ -n "$pids" ]; do
            sig=-TERM
            [ "$tries" -lt 20 ] || sig=-KILL
            # shellcheck disable=SC2086
            kill "$sig" $pids 2>/dev/null || true
            tries=$((tries + 1))
            [ "$tries" -lt 40 ] || die "processes left in netns $SCALE_NETNS: $pids"
            sleep 0.25
        done
        ip netns del "$SCALE_NETNS"
    fi
    ip link del "$SCALE_VETH" 2>/dev/null || true
    if mountpoint -q "$FS"; then umount "$FS" || umount -l "$FS"; fi
    rm -rf "$SCALE_DIR"
}

hosts() {
    while read -r name ip; do echo "$name $ip $FS/$name"; done <"$SCALE_DIR/hosts.txt"
}

# What the fakes' state says is left of any instance, per host.
leftovers() {
    local name ip H what
    while read -r name ip; do
        H=$FS/$name
        what=$(
            cd "$H"
            find etc-upper/containers/systemd etc-upper/fake-systemd/generator run/fake-podman/volumes \
                run/fake-podman/containers -mindepth 1 -maxdepth 1 -printf '%p\n' 2>/dev/null
            [ -d etc-upper/jumpstarter ] && find etc-upper/jumpstarter -mindepth 1 \( -type f -o -type l \) \
                -printf '%p\n'
            [ -d etc-upper/jumpstarter/exporters ] &&
                find etc-upper/jumpstarter/exporters -mindepth 1 -type d -printf '%p\n'
            for u in run/fake-systemd/units/*; do
                [ -f "$u" ] && read -r a _ <"$u" && [ "$a" != inactive ] && echo "$u:$a"
            done
            true
        )
        [ -z "$what" ] || echo "$name" $what
    done <"$SCALE_DIR/hosts.txt"
}

mem() {
    local pids p pss=0 count=0 v
    pids=$(ip netns pids "$SCALE_NETNS" 2>/dev/null || true)
    for p in $pids; do
        v=$(awk '/^Pss:/ { print $2 }' "/proc/$p/smaps_rollup" 2>/dev/null || echo 0)
        pss=$((pss + ${v:-0}))
        count=$((count + 1))
    done
    echo "$pss $(df -Pk "$FS" | awk 'NR == 2 { print $3 }') $count"
}

case "${1:-}" in
up) up "${2:?host count}" ;;
down) down ;;
hosts) hosts ;;
leftovers) leftovers ;;
mem) mem ;;
*) die "usage: $0 up N | down | hosts | leftovers | mem" ;;
esac
