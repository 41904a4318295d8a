#!/bin/bash
# labhost.sh - simulated remote lab hosts for qemu-ssh-provisioner tests and the sandbox.
#
# A lab host is a Debian 13 (trixie) system container booted with systemd-nspawn: systemd 257 as PID 1
# (pure cgroup v2 inside), OpenSSH sshd with key auth, podman 5.4 with quadlet, its own network namespace
# and IP on a bridge of the outer machine, /dev/kvm, and locally built stand-ins for the production images
# (no registry is reachable from a lab host).
#
# usage (as root):
#   labhost.sh up NAME IP        build base/stand-in if needed, create the host if needed, boot it (again, if it runs
#                                with other LAB_IMAGES), wait for sshd
#   labhost.sh down NAME         orderly poweroff (rootfs, keys and netns are kept; "up" boots it again)
#   labhost.sh destroy NAME      down, then remove veth, netns and rootfs
#   labhost.sh status NAME
#   labhost.sh ssh NAME [CMD...] ssh in as root with strict host key checking
#   labhost.sh base              only build the cached base rootfs tarball and the stand-in binary
#   labhost.sh net-down          remove the bridge (after all hosts of this set are destroyed)
#
# environment (defaults):
#   LAB_DIR=/tmp/qsp-labhost     state: keys/id_ed25519 (client key, root@ and lab@), known_hosts, hosts/NAME/
#   LAB_BRIDGE=qsplab0  LAB_BRIDGE_ADDR=10.77.0.1  LAB_PREFIX=24
#       The bridge name also prefixes the nspawn machine, netns and cgroup names (e.g. qsplab0-h1), so two sets
#       with different bridges never collide on one machine.
#   LAB_KVM=node                 node: the host's own /dev/kvm node (10:232, made at boot: the outer machine's is
#                                never bound in, so nothing inside can chmod it); none: no /dev/kvm
#   LAB_KVM_MODE=0660            its mode, owned by root and the host's kvm group: 0660 as Debian and Ubuntu ship it,
#                                0666 as Fedora and RHEL do (0600 is a host where only root may use KVM)
#   LAB_EXTRA_PKGS=""            extra comma separated packages for the base rootfs (changes its cache key)
#   LAB_NSPAWN_ARGS=""           extra systemd-nspawn args, e.g. "--bind=/dev/ttyUSB0"
#   LAB_BOOT_TIMEOUT=90          seconds to wait for sshd
#   LAB_IMAGES=""                "TARBALL=TAG ..." (space separated): at boot, podman-import each rootfs tarball
#                                under TAG over the stand-in (with the --change lines of TARBALL.changes), only when
#                                it changed; e.g. the real exporter image of test/jumpstarter/image.sh
#   QSP_CACHE                    cache root, default ${XDG_CACHE_HOME:-$HOME/.cache}/qemu-ssh-provisioner;
#                                the base tarball, .debs and stand-in binary live in $QSP_CACHE/labhost
#   SUITE=trixie  MIRROR (or DEBIAN_MIRROR)      default: the first Debian archive in this machine's apt sources
#                                (SUITE=bookworm: Podman 4.3.1, which has no quadlet: a host the apply must refuse)
#   LAB_PODMAN=""                a Podman 4.x version (e.g. 4.9.3) built by test/podman/build.sh that replaces the
#                                suite's own in a new host: /usr/bin/podman, the quadlet generator at
#                                /usr/libexec/podman/quadlet and the systemd generator link; conmon, crun and netavark
#                                stay the suite's. A host keeps the Podman it was created with (destroy to change it).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LAB_DIR=$(realpath -m "${LAB_DIR:-/tmp/qsp-labhost}") # the supervisor outlives this script's working directory
LAB_BRIDGE=${LAB_BRIDGE:-qsplab0}
LAB_BRIDGE_ADDR=${LAB_BRIDGE_ADDR:-10.77.0.1}
LAB_PREFIX=${LAB_PREFIX:-24}
LAB_KVM=${LAB_KVM:-node}
LAB_KVM_MODE=${LAB_KVM_MODE:-0660}
LAB_EXTRA_PKGS=${LAB_EXTRA_PKGS:-}
LAB_NSPAWN_ARGS=${LAB_NSPAWN_ARGS:-}
LAB_IMAGES=${LAB_IMAGES:-}
LAB_BOOT_TIMEOUT=${LAB_BOOT_TIMEOUT:-90}
LAB_PODMAN=${LAB_PODMAN:-}
PODMAN_DIR= # where build_podman put LAB_PODMAN's binaries
SUITE=${SUITE:-trixie}
MIRROR=${MIRROR:-$(bash "$HERE/debian-mirror.sh")} # DEBIAN_MIRROR, else this machine's apt sources
CACHE_DIR=${QSP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qemu-ssh-provisioner}/labhost

KEY=$LAB_DIR/keys/id_ed25519
KNOWN_HOSTS=$LAB_DIR/known_hosts
PKGS=systemd-sysv,dbus,openssh-server,sudo,podman,crun,conmon,netavark,aardvark-dns,nftables,catatonit
PKGS+=,busybox-static,iproute2,procps
# mkfs.ext4, resize2fs, e2fsck: the /disk volumes' file systems (minbase leaves e2fsprogs out since trixie)
PKGS+=,e2fsprogs
[ -n "$LAB_EXTRA_PKGS" ] && PKGS+=",$LAB_EXTRA_PKGS"
STANDIN_SRC=$HERE/standin

log() { echo "[labhost $(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }
ssh_opts() {
    echo -i "$KEY" -F /dev/null -o BatchMode=yes -o LogLevel=ERROR -o ConnectTimeout=2 \
        -o StrictHostKeyChecking=yes -o UserKnownHostsFile="$KNOWN_HOSTS" -o GlobalKnownHostsFile=/dev/null
}

# Runs "$@" holding an exclusive lock on file $1, so parallel "up"s share one build, one apt run, one bridge.
locked() { local f=$1; shift; mkdir -p "${f%/*}"; ( flock 9; "$@" ) 9>"$f"; }

# ---------------------------------------------------------------- outer machine
install_tools() {
    local missing=() p
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
    command -v zstd >/dev/null || missing+=(zstd)
    command -v ssh-keygen >/dev/null || missing+=(openssh-client)
    command -v ip >/dev/null || missing+=(iproute2)
    command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || missing+=(golang-go)
    [ ${#missing[@]} -eq 0 ] && return 0
    for p in "${missing[@]}"; do
        # a fresh machine may have empty package lists
        apt-cache show "$p" >/dev/null 2>&1 || { log "apt-get update"; apt-get update -q >&2; break; }
    done
    log "installing host packages: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
}

lab_dir_init() {
    mkdir -p "$LAB_DIR/keys" "$LAB_DIR/hosts"
    [ -f "$KEY" ] || ssh-keygen -q -t ed25519 -N '' -C qsp-labhost -f "$KEY"
    touch "$KNOWN_HOSTS"
}

prepare() {
    [ "$(id -u)" = 0 ] || die "must run as root (netns, bridge, nspawn)"
    locked "$CACHE_DIR/tools.lock" install_tools
    locked "$LAB_DIR/.lock" lab_dir_init
}

# ---------------------------------------------------------------- base rootfs (cached tarball, shared by all LAB_DIRs)
customize_base() {
    local R=$1 u
    rm -f "$R"/var/cache/apt/archives/*.deb
    rm -rf "$R"/var/lib/apt/lists/* "$R"/usr/share/doc/* "$R"/usr/share/man/* "$R"/usr/share/locale/*
    # identity is per host (create_host); trixie's sshd-keygen only runs on a first boot, which this is not
    rm -f "$R"/etc/ssh/ssh_host_*
    : >"$R"/etc/machine-id
    # nothing in a lab host may try to reach the internet, and a container has no tty1
    for u in apt-daily-upgrade.timer apt-daily.timer dpkg-db-backup.timer fstrim.timer getty@tty1.service \
        netavark-dhcp-proxy.socket netavark-dhcp-proxy.service; do
        rm -f "$R"/etc/systemd/system/*.wants/$u
        ln -sf /dev/null "$R/etc/systemd/system/$u"
    done
    cat >"$R"/etc/ssh/sshd_config.d/10-labhost.conf <<'EOF'
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
EOF
    chroot "$R" useradd -m -s /bin/bash -G sudo lab
    echo 'lab ALL=(ALL) NOPASSWD: ALL' >"$R"/etc/sudoers.d/lab
    chmod 440 "$R"/etc/sudoers.d/lab
    cat >"$R"/etc/containers/storage.conf <<'EOF'
[storage]
driver = "overlay"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"
EOF
    # The outer machine keeps pids/memory/cpu on cgroup v1, so the host's v2 tree has no such controllers and
    # crun would fail on podman's default pids limit.
    cat >"$R"/etc/containers/containers.conf <<'EOF'
[containers]
pids_limit = 0
EOF
    # /etc/jumpstarter is deliberately absent: on a fresh real host the controller has to create it
    mkdir -p "$R"/etc/containers/systemd
}

base_tarball() {
    # the key covers everything that shapes the tarball, so changing the recipe never reuses a stale one
    local h
    h=$( (echo "$SUITE $MIRROR $PKGS"; declare -f customize_base) | sha256sum | cut -c1-12)
    echo "$CACHE_DIR/base-$SUITE-$h.tar.zst"
}

build_base() {
    local T B t0
    T=$(base_tarball)
    [ -f "$T" ] && return 0
    t0=$(now)
    B=$CACHE_DIR/build-$SUITE
    rm -rf "$B"
    mkdir -p "$CACHE_DIR/debs"
    log "debootstrap $SUITE from $MIRROR (cold build, ~90 s)"
    debootstrap --variant=minbase --cache-dir="$CACHE_DIR/debs" --include="$PKGS" "$SUITE" "$B" "$MIRROR" \
        >"$CACHE_DIR/debootstrap.log" 2>&1 || { tail -20 "$CACHE_DIR/debootstrap.log" >&2; die "debootstrap failed"; }
    customize_base "$B"
    tar --numeric-owner --xattrs --xattrs-include='*' -C "$B" -c . | zstd -q -T0 -o "$T.tmp"
    mv "$T.tmp" "$T"
    rm -rf "$B"
    prune_cache
    log "base $T ($(du -h "$T" | cut -f1)) built in $(since "$t0")s"
}

# ---------------------------------------------------------------- stand-in images' binary (built on the outer machine)
standin_binary() {
    local h
    h=$(cd "$STANDIN_SRC" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) | LC_ALL=C sort |
        xargs sha256sum | sha256sum | cut -c1-12)
    echo "$CACHE_DIR/standin-$h"
}

build_standin() {
    local O go=go
    O=$(standin_binary)
    [ -x "$O" ] && return 0
    command -v go >/dev/null || go=/usr/local/go/bin/go
    log "building stand-in binary $O"
    (cd "$STANDIN_SRC" && CGO_ENABLED=0 "$go" build -trimpath -ldflags='-s -w' -o "$O.tmp" .) >&2
    mv "$O.tmp" "$O"
    prune_cache
}

# Checkouts with other recipes or LAB_EXTRA_PKGS may share the cache, so only what nobody used for two weeks goes
# (create_host touches what it uses).
prune_cache() { find "$CACHE_DIR" -maxdepth 1 \( -name 'base-*.tar.zst' -o -name 'standin-*' \) -mtime +14 -delete; }

# test/podman/build.sh caches and locks by itself
build_podman() {
    [ -n "$LAB_PODMAN" ] || return 0
    PODMAN_DIR=$(bash "$HERE/../podman/build.sh" "$LAB_PODMAN" | tail -n 1)
    [ -x "$PODMAN_DIR/podman" ] || die "test/podman/build.sh $LAB_PODMAN gave no podman"
}

build_all() {
    locked "$CACHE_DIR/base.lock" build_base
    locked "$CACHE_DIR/standin.lock" build_standin
    build_podman
}

# ---------------------------------------------------------------- per host
# Names on the outer machine (nspawn machine, netns, cgroup) carry the bridge name so two sets can coexist.
host_id() { echo "$LAB_BRIDGE-$1"; }
hostdir() { echo "$LAB_DIR/hosts/$1"; }
vethname() {
    local id; id=$(host_id "$1")
    if [ ${#id} -le 13 ]; then echo "v-$id"; else echo "v-$(echo -n "$id" | md5sum | cut -c1-13)"; fi
}

install_host_files() {
    local R=$1 u
    mkdir -p "$R"/usr/local/lib/labhost "$R"/etc/labhost
    install -m755 "$(standin_binary)" "$R"/usr/local/lib/labhost/standin
    install -m755 /dev/stdin "$R"/usr/local/sbin/labhost-images <<'EOF'
#!/bin/sh
# Builds the stand-ins for the production images from /usr/local/lib/labhost/standin (podman import), tagged with
# the production names so that quadlets with the default Pull=missing use them. Rebuilt when the binary or this
# recipe changes. They keep upstream's container contract, so that a deploy that breaks it fails here as it would with the real
# images: the runtime image has USER 65532 and no launcher of its own (ENTRYPOINT /shared/jumpstarter-exec, which
# the controller must stage from the exporter image); the exporter image has USER 65532 and carries
# /jumpstarter/bin/jumpstarter-exec.
set -eu
sum=$(cat /usr/local/lib/labhost/standin "$0" | sha256sum | cut -c1-16)
build() { # IMAGE ROLE CHANGES...
    img=$1; role=$2; shift 2
    # an image given with LAB_IMAGES (labhost-lab-images) takes the place of the stand-in
    if grep -q "^[0-9]* $img " /etc/labhost/images.list 2>/dev/null; then return 0; fi
    have=$(podman image inspect --format '{{index .Config.Labels "labhost.standin"}}' "$img" 2>/dev/null || true)
    [ "$have" = "$sum" ] && return 0
    d=$(mktemp -d)
    mkdir -p $d/bin $d/etc $d/tmp $d/proc $d/sys $d/dev $d/run $d/shared
    chmod 1777 $d/tmp
    cp /usr/bin/busybox $d/bin/busybox
    for a in $(/usr/bin/busybox --list); do [ -e $d/bin/$a ] || ln -s busybox $d/bin/$a; done
    echo 'root:x:0:0:root:/root:/bin/sh' >$d/etc/passwd
    echo 'root:x:0:' >$d/etc/group
    if [ "$role" = exporter ]; then
        mkdir -p $d/jumpstarter/bin
        cp /usr/local/lib/labhost/standin $d/jumpstarter/bin/jumpstarter-exec
        ln -s jumpstarter-exec $d/jumpstarter/bin/jmp
    fi
    tar -C $d -c . | podman import --change "LABEL=labhost.standin=$sum" --change "LABEL=labhost.role=$role" \
        --change 'ENV=PATH=/jumpstarter/bin:/bin' --change 'USER=65532:65532' "$@" - "$img" >/dev/null
    rm -rf $d
    echo "labhost-images: built $img ($role, standin $sum)"
}
build quay.io/jumpstarter-dev/virtual/qemu-runtime:latest runtime \
    --change 'ENTRYPOINT=["/shared/jumpstarter-exec"]' --change 'CMD=["serve","--socket","/shared/launcher.sock"]'
# no entrypoint, like upstream's image: the quadlet's Exec=jmp run ... is the command
build quay.io/jumpstarter-dev/jumpstarter:latest exporter --change 'CMD=["jmp","--help"]'
# the images a changed binary replaced
podman image prune -f >/dev/null
EOF
    cat >"$R"/etc/systemd/system/labhost-images.service <<'EOF'
[Unit]
Description=Build the local stand-in images (no registry is reachable)
# quadlet's containers start after network-online.target: never with an image about to be replaced
Before=ssh.service network-online.target
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/labhost-images
[Install]
WantedBy=multi-user.target
EOF
    # The host's own /dev/kvm, in the /dev nspawn gives it (a tmpfs of its own): its mode and group are the host's,
    # as on a real one, and a chmod inside never reaches the outer machine's node, which a bind mount would share.
    # Where the outer machine has KVM, the node opens the real device (same 10:232); without it, opening fails with
    # ENODEV, which the stand-ins do not mind: podman only stats the node and crun recreates it in the container.
    cat >"$R"/etc/systemd/system/labhost-kvm.service <<'EOF'
[Unit]
Description=The lab host's own /dev/kvm node
Before=ssh.service labhost-images.service
ConditionPathExists=/etc/labhost/kvm-mode
ConditionPathExists=!/dev/kvm
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'mknod -m "$$(cat /etc/labhost/kvm-mode)" /dev/kvm c 10 232 && chgrp kvm /dev/kvm'
[Install]
WantedBy=multi-user.target
EOF
    # minbase has no udev, which would otherwise own this group
    grep -q '^kvm:' "$R/etc/group" || chroot "$R" groupadd -r kvm
    # A real host's udev makes /dev/loop-control and /dev/loopN; a container's /dev is its own tmpfs without them, so
    # podman's loop mount of a /disk volume would fail ("failed to setup loop device"). Loop devices are the outer
    # machine's (the kernel has one set): a mount takes a free one through /dev/loop-control and its autoclear gives
    # it back at the unmount, also when the host dies with its mount namespace. The nodes follow loop's default
    # numbering (minor N for loopN, max_part=0), enough for many hosts' instances side by side.
    install -m755 /dev/stdin "$R"/usr/local/sbin/labhost-loop <<'EOF'
#!/bin/sh
set -eu
[ -c /dev/loop-control ] || mknod -m 0660 /dev/loop-control c 10 237
i=0
while [ $i -lt 64 ]; do
    [ -b /dev/loop$i ] || mknod -m 0660 /dev/loop$i b 7 $i
    i=$((i + 1))
done
EOF
    cat >"$R"/etc/systemd/system/labhost-loop.service <<'EOF'
[Unit]
Description=Loop device nodes (a container's /dev has none)
Before=ssh.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/labhost-loop
[Install]
WantedBy=multi-user.target
EOF
    for u in labhost-images.service labhost-kvm.service labhost-loop.service; do
        ln -sf "/etc/systemd/system/$u" "$R/etc/systemd/system/multi-user.target.wants/$u"
    done
}

# ---------------------------------------------------------------- real images (LAB_IMAGES)
# Each "TARBALL=TAG" of LAB_IMAGES is bind-mounted read-only into the host (no copy on the outer machine) and
# podman-imported under TAG at boot, after the stand-ins, which it replaces; again only when its digest changed.
# Podman's --change lines come from TARBALL.changes, if there is one (test/jumpstarter/image.sh writes it).
install_lab_images() {
    local N=$1 R D i=0 e T tag
    R=$(hostdir "$N")/rootfs
    D=/var/lib/labhost/images
    # a host that never had LAB_IMAGES keeps its boot free of the extra unit
    [ -n "${LAB_IMAGES// /}" ] || [ -f "$R/etc/labhost/images.list" ] || return 0
    rm -rf "$R$D" "$R/etc/labhost/images"
    mkdir -p "$R$D" "$R/etc/labhost/images"
    : >"$R/etc/labhost/images.list"
    for e in $LAB_IMAGES; do
        T=${e%=*} tag=${e##*=}
        [[ $e == *=* && -n $tag && $T != *:* ]] || die "LAB_IMAGES: bad entry '$e' (TARBALL=TAG, no ':' in TARBALL)"
        T=$(realpath "$T") && [ -f "$T" ] || die "LAB_IMAGES: no such file: ${e%=*}"
        i=$((i + 1))
        : >"$R$D/$i.archive"
        cat "$T.changes" 2>/dev/null >"$R/etc/labhost/images/$i.changes" || true
        echo "$i $tag $(cat "$T" "$R/etc/labhost/images/$i.changes" | sha256sum | cut -c1-16)" \
            >>"$R/etc/labhost/images.list"
        LAB_NSPAWN_ARGS+=" --bind-ro=$T:$D/$i.archive"
    done
    install -m755 /dev/stdin "$R"/usr/local/sbin/labhost-lab-images <<'EOF'
#!/bin/sh
# Imports the images of /etc/labhost/images.list (NUMBER TAG DIGEST) from /var/lib/labhost/images/NUMBER.archive with
# the --change lines of /etc/labhost/images/NUMBER.changes, unless TAG already has label labhost.image=DIGEST.
set -eu
label() { podman image inspect --format "{{index .Config.Labels \"$2\"}}" "$1" 2>/dev/null || true; }
listed=" "
while read -r n tag digest; do
    listed="$listed$tag "
    [ "$(label "$tag" labhost.image)" = "$digest" ] && continue
    set -- --change "LABEL=labhost.image=$digest"
    while IFS= read -r c; do [ -z "$c" ] || set -- "$@" --change "$c"; done <"/etc/labhost/images/$n.changes"
    podman import "$@" "/var/lib/labhost/images/$n.archive" "$tag" >/dev/null
    echo "labhost-lab-images: imported $tag ($digest)"
done </etc/labhost/images.list
# an image no longer listed makes way for the stand-in again
gone=
for t in $(podman images --filter label=labhost.image --filter dangling=false --format '{{.Repository}}:{{.Tag}}'); do
    case "$listed" in *" $t "*) ;; *) podman untag "$t" "$t"; gone=1 ;; esac
done
[ -z "$gone" ] || /usr/local/sbin/labhost-images
podman image prune -f >/dev/null
EOF
    cat >"$R"/etc/systemd/system/labhost-lab-images.service <<'EOF'
[Unit]
Description=Import the images given with LAB_IMAGES over the stand-ins
After=labhost-images.service
Before=ssh.service network-online.target
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/labhost-lab-images
[Install]
WantedBy=multi-user.target
EOF
    ln -sf /etc/systemd/system/labhost-lab-images.service "$R"/etc/systemd/system/multi-user.target.wants/
}

create_host() {
    local N=$1 IP=$2 H R t0
    H=$(hostdir "$N")
    R=$H/rootfs
    if [ ! -f "$H/.created" ]; then
        t0=$(now)
        rm -rf "$R"
        mkdir -p "$R"
        zstd -q -dc "$(base_tarball)" | tar --numeric-owner --xattrs --xattrs-include='*' -C "$R" -x
        systemd-id128 new >"$R/etc/machine-id"
        ssh-keygen -q -A -f "$R" >/dev/null
        install_podman "$R"
        echo "$SUITE ${LAB_PODMAN:-suite}" >"$H/.variant"
        install -d -m700 "$R/root/.ssh"
        install -m600 "$KEY.pub" "$R/root/.ssh/authorized_keys"
        install -d -m700 -o 1000 -g 1000 "$R/home/lab/.ssh"
        install -m600 -o 1000 -g 1000 "$KEY.pub" "$R/home/lab/.ssh/authorized_keys"
        touch "$H/.created"
        log "$N: rootfs created in $(since "$t0")s"
    fi
    [ "$(cat "$H/.variant" 2>/dev/null || echo "trixie suite")" = "$SUITE ${LAB_PODMAN:-suite}" ] ||
        die "$N was created as $(cat "$H/.variant" 2>/dev/null || echo "trixie suite") (SUITE, LAB_PODMAN), not" \
            "$SUITE ${LAB_PODMAN:-suite}: destroy it first"
    touch "$(base_tarball)" "$(standin_binary)"
    # refreshed on every boot, so a changed stand-in reaches existing hosts too
    install_host_files "$R"
    echo "$N" >"$R/etc/hostname"
    printf '127.0.0.1 localhost\n::1 localhost\n%s %s\n' "$IP" "$N" >"$R/etc/hosts"
    rm -f "$R/etc/labhost/kvm-node" "$R/etc/labhost/kvm-mode"
    case "$LAB_KVM" in
    node)
        case "$LAB_KVM_MODE" in [0-7][0-7][0-7] | 0[0-7][0-7][0-7]) ;; *) die "LAB_KVM_MODE must be octal, e.g. 0660" ;; esac
        echo "$LAB_KVM_MODE" >"$R/etc/labhost/kvm-mode"
        ;;
    none) ;;
    *) die "LAB_KVM must be node or none" ;;
    esac
    locked "$KNOWN_HOSTS.lock" update_known_hosts "$IP" "$R/etc/ssh/ssh_host_ed25519_key.pub"
}

# The built Podman in place of the suite's, where Debian's package has its files; a new rootfs has no container
# storage yet, so the older Podman never meets a newer one's database.
install_podman() {
    local R=$1
    [ -n "$LAB_PODMAN" ] || return 0
    install -m755 "$PODMAN_DIR/podman" "$R/usr/bin/podman"
    install -D -m755 "$PODMAN_DIR/quadlet" "$R/usr/libexec/podman/quadlet"
    mkdir -p "$R/usr/lib/systemd/system-generators"
    ln -sfn ../../../libexec/podman/quadlet "$R/usr/lib/systemd/system-generators/podman-system-generator"
    log "podman $LAB_PODMAN installed over $SUITE's"
}

update_known_hosts() {
    ssh-keygen -q -R "$1" -f "$KNOWN_HOSTS" >/dev/null 2>&1 || true
    rm -f "$KNOWN_HOSTS.old"
    echo "$1 $(cut -d' ' -f1,2 "$2")" >>"$KNOWN_HOSTS"
}

# The bridge's alias records which LAB_DIR owns it. Two sets that share a bridge name would also share netns and veth
# names, so one set's destroy or net-down would cut off the other's hosts: refuse instead.
bridge_owner() { { ip link show "$LAB_BRIDGE" 2>/dev/null || true; } | sed -n 's/^ *alias qsp-labhost:\(.*\)$/\1/p'; }
check_bridge_owner() {
    local owner; owner=$(bridge_owner)
    [ -z "$owner" ] || [ "$owner" = "$LAB_DIR" ] || die "bridge $LAB_BRIDGE belongs to LAB_DIR=$owner, not $LAB_DIR"
}

setup_bridge() {
    if ip link show "$LAB_BRIDGE" >/dev/null 2>&1; then
        check_bridge_owner
        return 0
    fi
    ip link add "$LAB_BRIDGE" type bridge
    ip link set dev "$LAB_BRIDGE" alias "qsp-labhost:$LAB_DIR"
    ip addr add "$LAB_BRIDGE_ADDR/$LAB_PREFIX" dev "$LAB_BRIDGE"
    ip link set "$LAB_BRIDGE" up
}

setup_net() {
    local N=$1 IP=$2 NS V
    NS=$(host_id "$N")
    V=$(vethname "$N")
    locked "/run/lock/qsp-labhost-$LAB_BRIDGE.lock" setup_bridge
    [ -e "/run/netns/$NS" ] || ip netns add "$NS"
    if ! ip link show "$V" >/dev/null 2>&1; then
        ip -n "$NS" link del eth0 2>/dev/null || true
        ip link add "$V" type veth peer name eth0 netns "$NS"
        ip link set "$V" master "$LAB_BRIDGE" up
    fi
    if ! ip -n "$NS" -4 addr show dev eth0 | grep -q "inet $IP/$LAB_PREFIX "; then
        ip -n "$NS" addr flush dev eth0
        ip -n "$NS" addr add "$IP/$LAB_PREFIX" dev eth0
    fi
    ip -n "$NS" link set lo up
    ip -n "$NS" link set eth0 up
    # deliberately no default route: a lab host can only talk to its bridge
}

# A supervisor (bash loop, pid in supervisor.pid) runs systemd-nspawn (pid in nspawn.pid) and boots the host
# again when nspawn exits with 133, which is what a "reboot" inside the host does.
running_pid() {
    local P
    P=$(cat "$(hostdir "$1")/supervisor.pid" 2>/dev/null) || return 1
    [ -n "$P" ] && [ -r "/proc/$P/cmdline" ] &&
        tr '\0' ' ' <"/proc/$P/cmdline" | grep -q -- "labhost-supervisor $(host_id "$1") " && echo "$P"
}

cg_dirs() { # hybrid v1/v2: name=systemd and unified hierarchies; pure cgroup v2 (untested): one directory
    local id; id=labhost-$(host_id "$1")
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        echo "/sys/fs/cgroup/$id"
    else
        echo "/sys/fs/cgroup/systemd/$id /sys/fs/cgroup/unified/$id"
    fi
}

cg_cleanup() {
    local d
    for d in $(cg_dirs "$1"); do
        [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
    done
    true
}

boot_host() {
    local N=$1 H P d ID
    H=$(hostdir "$N")
    ID=$(host_id "$N")
    cg_cleanup "$N"
    # Without a systemd on the outer machine every nspawn would land in the same /payload cgroup, so each gets its
    # own; SYSTEMD_NSPAWN_UNIFIED_HIERARCHY gives the host a pure cgroup v2 tree, which crun and podman 5 need.
    for d in $(cg_dirs "$N"); do [ -d "${d%/*}" ] && mkdir -p "$d"; done
    (
        for d in $(cg_dirs "$N"); do [ -d "$d" ] && echo $BASHPID >"$d/cgroup.procs"; done
        export SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 SYSTEMD_NSPAWN_API_VFS_WRITABLE=network
        # Why the nspawn flags: no machined/systemd outside (--register=no --keep-unit); netavark needs
        # CAP_NET_ADMIN and writable /proc/sys/net; crun needs keyctl and bpf (cgroup v2 device filter).
        # shellcheck disable=SC2016,SC2086
        exec setsid bash -c '
            H=$2; shift 2; stopping=0; child=
            trap "stopping=1; [ -n \"\$child\" ] && kill -TERM \$child" TERM
            while :; do
                systemd-nspawn "$@" &
                child=$!; echo $child >"$H/nspawn.pid"
                while :; do wait $child; rc=$?; kill -0 $child 2>/dev/null || break; done
                echo "[labhost] nspawn exited rc=$rc" >&2
                [ "$rc" = 133 ] && [ $stopping = 0 ] || break
            done
            rm -f "$H/nspawn.pid"' labhost-supervisor "$ID" "$H" \
            -D "$H/rootfs" -M "$ID" --hostname="$N" --boot \
            --register=no --keep-unit --network-namespace-path="/run/netns/$ID" \
            --capability=CAP_NET_ADMIN,CAP_BPF,CAP_PERFMON --system-call-filter='@keyring bpf' \
            --resolv-conf=off --timezone=off --link-journal=no --console=pipe $LAB_NSPAWN_ARGS
    ) </dev/null >>"$H/console.log" 2>&1 &
    P=$!
    echo $P >"$H/supervisor.pid"
    # until the subshell has exec'd, its cmdline is this script's and running_pid would call the host dead
    for ((d = 0; d < 50; d++)); do
        running_pid "$N" >/dev/null && break
        kill -0 "$P" 2>/dev/null || break
        sleep 0.1
    done
    log "$N: booting as $ID (supervisor pid $P)"
}

wait_ssh() {
    local N=$1 IP=$2 t0 deadline
    t0=$(now)
    deadline=$(($(date +%s) + LAB_BOOT_TIMEOUT))
    # shellcheck disable=SC2046
    until ssh $(ssh_opts) "root@$IP" true 2>/dev/null; do
        running_pid "$N" >/dev/null || { tail -30 "$(hostdir "$N")/console.log" >&2; die "$N: nspawn exited"; }
        [ "$(date +%s)" -lt "$deadline" ] || die "$N: sshd not reachable within ${LAB_BOOT_TIMEOUT}s"
        sleep 0.2
    done
    log "$N: sshd ready at root@$IP after $(since "$t0")s"
}

cmd_up() {
    local N=$1 IP=$2 t0
    t0=$(now)
    [[ $N =~ ^[a-z0-9][a-z0-9-]{0,30}$ ]] || die "bad host name '$N'"
    [[ $IP =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "bad IP '$IP'"
    prepare
    check_bridge_owner
    # LAB_IMAGES are imported only at boot: a host running with others is rebooted (rootfs, keys and host key kept)
    if running_pid "$N" >/dev/null && [ "$(cat "$(hostdir "$N")/.images" 2>/dev/null)" != "$LAB_IMAGES" ]; then
        log "$N: booted with other LAB_IMAGES, rebooting it to import these"
        cmd_down "$N"
    fi
    # a running host keeps its files: rewriting units under a live systemd only earns "changed on disk" warnings
    if ! running_pid "$N" >/dev/null; then
        build_all
        create_host "$N" "$IP"
        install_lab_images "$N"
        echo "$LAB_IMAGES" >"$(hostdir "$N")/.images"
        setup_net "$N" "$IP"
        boot_host "$N"
    fi
    wait_ssh "$N" "$IP"
    log "$N: up in $(since "$t0")s"
}

cmd_down() {
    local N=$1 P H i
    H=$(hostdir "$N")
    if P=$(running_pid "$N"); then
        kill -TERM "$P" # the supervisor forwards it to nspawn, which powers the host off
        for ((i = 0; i < 150; i++)); do
            kill -0 "$P" 2>/dev/null || break
            sleep 0.2
        done
        if kill -0 "$P" 2>/dev/null; then
            log "$N: poweroff timed out, SIGKILL"
            [ -f "$H/nspawn.pid" ] && kill -KILL "$(cat "$H/nspawn.pid")" 2>/dev/null
            kill -KILL "$P" 2>/dev/null || true
            sleep 0.5
        fi
        log "$N: stopped"
    fi
    rm -f "$H/supervisor.pid" "$H/nspawn.pid"
    cg_cleanup "$N"
}

cmd_destroy() {
    local N=$1 NS
    NS=$(host_id "$N")
    # the netns and veth names are not this set's alone: without the host's directory they may be another set's
    if [ ! -d "$(hostdir "$N")" ]; then
        log "$N: no such host in $LAB_DIR"
        return 0
    fi
    check_bridge_owner
    cmd_down "$N"
    ip link del "$(vethname "$N")" 2>/dev/null || true
    [ ! -e "/run/netns/$NS" ] || ip netns del "$NS"
    rm -rf "$(hostdir "$N")"
    log "$N: destroyed"
}

cmd_status() {
    local N=$1 P
    if P=$(running_pid "$N"); then
        echo "$N: running as $(host_id "$N") (supervisor pid $P) $(ip -n "$(host_id "$N")" -4 -br addr show dev eth0)"
    else
        echo "$N: stopped"
        return 3
    fi
}

cmd_ssh() {
    local N=$1 IP
    shift
    IP=$(ip -n "$(host_id "$N")" -4 -o addr show dev eth0 | awk '{print $4}' | cut -d/ -f1)
    # shellcheck disable=SC2046
    exec ssh $(ssh_opts) "root@$IP" "$@"
}

cmd_net_down() {
    if ip link show "$LAB_BRIDGE" >/dev/null 2>&1; then
        check_bridge_owner
        if [ -n "$(ip -br link show master "$LAB_BRIDGE")" ]; then
            log "bridge $LAB_BRIDGE still has hosts attached, keeping it"
        else
            ip link del "$LAB_BRIDGE"
        fi
    fi
    # nspawn leaves these behind because /run is not a tmpfs here; they stay if another set still uses them
    rmdir /run/systemd/nspawn/propagate /run/systemd/nspawn/locks /run/systemd/nspawn 2>/dev/null || true
}

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 2; }

case "${1:-}" in
up) [ $# -eq 3 ] || usage; cmd_up "$2" "$3" ;;
down) [ $# -eq 2 ] || usage; cmd_down "$2" ;;
destroy) [ $# -eq 2 ] || usage; cmd_destroy "$2" ;;
status) [ $# -eq 2 ] || usage; cmd_status "$2" ;;
ssh) [ $# -ge 2 ] || usage; shift; cmd_ssh "$@" ;;
base) prepare; build_all ;;
net-down) cmd_net_down ;;
*) usage ;;
esac
