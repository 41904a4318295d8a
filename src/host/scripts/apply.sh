# apply: makes the host run one instance, idempotently (remote.ts applyScript). After lib.sh; the header sets NAME,
# NAME_LOCK, UID_, NAMESPACE, CONTROLLER, RT, EX (units), RTQ, EXQ (their quadlets), VOLUME, DISK, IMG, DISK_BYTES,
# DISK_MIB, PENDING, RENDERED_FACTS (the host facts the files were rendered for), KVM_REQUIRED, KVM_DENIED_MODE,
# KVM_GID, DEVICES (one a line), KEEP_EXITED, DEFER_RESTART, and FILES: one line per file, KIND SECRET MODE OWNER
# SHA256 BASE64 PATH LINK..., KIND runtime, exporter or config (which units a change affects), SECRET 1 or 0;
# STAGE_SCRIPT, STAGE_HASH, STAGE_SH: where the host keeps remote.ts STAGE_SCRIPT_TEXT, its sha256 and its base64.

# FN: FN for each file of FILES, with its fields in f_kind, f_secret, f_mode, f_owner, f_hash, f_content, f_path and
# f_links (blank-separated: render.ts paths have no blanks or glob characters)
each_file() {
  while read -r f_kind f_secret f_mode f_owner f_hash f_content f_path f_links; do
    "$1"
  done <<EOF_FILES
$FILES
EOF_FILES
}
# PATH MODE OWNER SHA256 BASE64: atomic replace (temp file in the same directory, synced, renamed) unless already
# equal; changed=1 if it was written
replace() {
  changed=0
  if [ -f "$1" ] && [ ! -L "$1" ] && [ "$(stat -c %a:%u:%g "$1")" = "$2:$3:$3" ] &&
    [ "$(sha256sum <"$1" | cut -d' ' -f1)" = "$4" ]; then
    return 0
  fi
  tmp=$(mktemp "${1%/*}/.${1##*/}.qsp-tmp.XXXXXX")
  printf '%s' "$5" | base64 -d >"$tmp"
  chmod "$2" "$tmp"
  chown "$3:$3" "$tmp"
  sync "$tmp"
  mv -f "$tmp" "$1"
  tmp=
  changed=1
}
# the same, reported as changed
put() {
  replace "$@"
  if [ "$changed" = 1 ]; then say changed "$1"; fi
}
# TARGET LINK: LINK becomes a hard link to TARGET, replaced atomically
link() {
  if [ "$(stat -c %d:%i "$1")" = "$(stat -c %d:%i "$2" 2>/dev/null || true)" ]; then return 0; fi
  tmp=$(mktemp -u "${2%/*}/.${2##*/}.qsp-tmp.XXXXXX")
  ln "$1" "$tmp"
  mv -f "$tmp" "$2"
  tmp=
  say changed "$2"
}
# The definitions systemd has loaded for the two units, as of the last look: hashes of the services the generator made
# from their quadlets, into rt_def and ex_def. Read under the host lock, as a daemon-reload rewrites the generator's
# output, and kept for the steps after the writes, which hold the instance's lock alone.
loaded_defs() {
  for u in "$RT" "$EX"; do
    unit "$u"
    h=
    if [ -n "$frag" ] && [ -f "$frag" ]; then h=$(sha256sum <"$frag" | cut -d' ' -f1); fi
    if [ "$u" = "$RT" ]; then rt_def=$h; else ex_def=$h; fi
  done
}
# UNIT: its loaded definition, into def
loaded() { if [ "$1" = "$RT" ]; then def=$rt_def; else def=$ex_def; fi; }
running() {
  unit "$1"
  case "$active" in active | activating | reloading) return 0 ;; esac
  return 1
}
# UNIT: the jobs queued for UNIT and not done yet, their lines joined, into jobs (the apply queues start and restart
# jobs and does not wait)
queued() { jobs=$(systemctl list-jobs --no-legend "$1" 2>/dev/null | tr '\n' ' '); }
# UNIT: remember on the host which definition UNIT was (re)started with, once its job is queued. Written after the
# start, so a script killed in between leaves the old record: the next apply restarts once more rather than never.
started_with() {
  loaded "$1"
  printf '%s\n' "$def" >"$RUN_DIR/.$1.started.tmp"
  mv -f "$RUN_DIR/.$1.started.tmp" "$RUN_DIR/$1.started"
}
# UNIT: a unit that runs without a record (started by an older version of this script, or by hand) is taken to run
# what systemd has loaded now, before this apply writes anything: upgrading the controller restarts nothing. A
# restart the older script deferred is still owed.
adopt() {
  if [ -e "$RUN_DIR/$1.started" ] || ! running "$1"; then return 0; fi
  if grep -qxF "$1" "$PENDING" 2>/dev/null; then
    printf 'deferred\n' >"$RUN_DIR/$1.started"
  else
    started_with "$1"
  fi
}
# UNIT: the unit runs, and not the definition systemd has loaded from its quadlet now
outdated() {
  running "$1" || return 1
  loaded "$1"
  [ "$(cat "$RUN_DIR/$1.started" 2>/dev/null)" != "$def" ]
}

# the ownership step
check_paths() {
  check_owner "$f_path" "$UID_"
  for l in $f_links; do check_owner "$l" "$UID_"; done
}
check_present() {
  for p in "$f_path" $f_links; do
    if [ ! -e "$p" ]; then err "removed-meanwhile $p was removed while this apply waited for daemon-reload"; fi
  done
  check_paths
}
# the directory a non-root owner's file lives in is that owner's too: the container mounts it to reach the file
make_dirs() {
  for p in "$f_path" $f_links; do
    (umask 022 && mkdir -p "${p%/*}")
    if [ "$f_secret" = 1 ]; then chmod 0700 "${p%/*}"; fi
  done
  if [ "$f_owner" != 0 ]; then chown "$f_owner:$f_owner" "${f_path%/*}"; fi
}
# the write-files step: which units a change affects
write_file() {
  put "$f_path" "$f_mode" "$f_owner" "$f_hash" "$f_content"
  if [ "$changed" = 1 ]; then
    case "$f_kind" in
    runtime) rt_changed=1 ;;
    exporter) ex_changed=1 ;;
    *) cfg_changed=1 ;;
    esac
  fi
  for l in $f_links; do link "$f_path" "$l"; done
}
# VOLUME OPTION...: a volume labelled like the containers, so one left alone by an interrupted remove still names its
# owner
make_volume() {
  v=$1
  shift
  if [ -n "$CONTROLLER" ]; then set -- --label "$CONTROLLER_LABEL=$CONTROLLER" "$@"; fi
  podman volume create --label "jumpstarter.dev/exporter=$NAME" --label "$PROVISIONER/uid=$UID_" \
    --label "jumpstarter.dev/namespace=$NAMESPACE" "$@" "$v" >/dev/null
  say volume-created "$v"
}
# COMMAND...: its output only when it fails
quiet() {
  out=$("$@" 2>&1) || {
    printf '%s\n' "$out" >&2
    return 1
  }
}
grow_disk() {
  # the loop device of a just unmounted image may take a moment to be released
  i=0
  while [ -n "$(losetup -j "$IMG" -n -O NAME)" ]; do
    if [ "$i" -ge 50 ]; then
      echo "$IMG is still attached to a loop device: not growing a mounted file system" >&2
      return 1
    fi
    sleep 0.1
    i=$((i + 1))
  done
  truncate -s "$DISK_BYTES" "$IMG"
  quiet e2fsck -f -p "$IMG"
  quiet resize2fs "$IMG"
  say disk-grown "$IMG" "$DISK_BYTES"
}

step=preflight
for c in podman systemctl base64 sha256sum mktemp stat flock truncate mkfs.ext4 resize2fs e2fsck losetup; do
  command -v "$c" >/dev/null 2>&1 || err "missing-tool $c is not installed on this host"
done
# podman loop-mounts the /disk volume's image at the first start
if [ ! -c /dev/loop-control ]; then
  err "loop-missing /dev/loop-control is not present on this host: load the loop module (modprobe loop)"
fi
if [ -f "$IMG" ] && [ "$(stat -c %s "$IMG")" -gt "$DISK_BYTES" ]; then
  err "disk-shrink $IMG holds $(($(stat -c %s "$IMG") / 1048576)) MiB, more than the $DISK_MIB MiB that storage.size \
plus storage.fsOverhead now ask for, and a file system with the guest's disks on it is not shrunk: set them back to \
at least that much, or replace the instance to start over with an empty /disk"
fi
refuse_if_errors
host_facts
say facts "$facts"
# Without quadlet the files would be written and no service made: refuse before anything is written. A version that
# is not a number (a development build) is let through. The same comparison as remote.ts podmanTooOld.
v=$podman_version
major=${v%%.*}
minor=${v#"$major"}
minor=${minor#.}
minor=${minor%%[!0-9]*}
case "$major" in '' | *[!0-9]*) minor= ;; esac
if [ -n "$minor" ] &&
  { [ "$major" -lt "$MIN_MAJOR" ] || { [ "$major" -eq "$MIN_MAJOR" ] && [ "$minor" -lt "$MIN_MINOR" ]; }; }; then
  err "podman-too-old podman $v is older than $MIN_MAJOR.$MIN_MINOR and has no quadlet, so no exporter service \
could be made; upgrade podman to $MIN_MAJOR.$MIN_MINOR or later (Debian 13, Ubuntu 24.04, RHEL 9.2 and later ship it)"
fi
refuse_if_errors
# files made for another host's facts (another podman, another kvm group) are never written: the controller renders
# them again for these and applies at once
if [ "$facts" != "$RENDERED_FACTS" ]; then
  err "facts-changed this host is $facts; the files were rendered for $RENDERED_FACTS"
fi
refuse_if_errors

step=lock
lock_host -s

step=ownership
each_file check_paths
refuse_if_errors
look
loaded_defs
adopt "$RT"
adopt "$EX"
rm -f "$PENDING"

step=make-dirs
each_file make_dirs

step=write-files
umask 077
rt_changed=0
ex_changed=0
cfg_changed=0
each_file write_file

step=stage-script
# The host's, not the instance's: every runtime's ExecStartPre runs it at its next start, so its rewrite is no change
# of this instance and restarts nothing. Replaced atomically: the applies of other instances write it too, side by
# side.
(umask 022 && mkdir -p "${STAGE_SCRIPT%/*}")
replace "$STAGE_SCRIPT" 755 0 "$STAGE_HASH" "$STAGE_SH"

step=daemon-reload
# Reload when a quadlet changed, and when systemd has not caught up with one (an earlier apply died before it). Right
# after the writes (the generator needs no volume), so that applies at once reach the exclusive lock together and
# share one reload.
reload=0
if [ "$rt_changed$ex_changed" != 00 ]; then reload=1; fi
for u in "$RT" "$EX"; do
  unit "$u"
  if [ "$load" != loaded ] || [ "$need_reload" != no ]; then reload=1; fi
done
if [ "$reload" = 1 ]; then
  reload_owed
  step=lock
  lock_host -x
  step=daemon-reload
  reload_systemd
  step=lock
  lock_host -s
  # A remove may have run while the lock was dropped: go on only with every file still there and ours, else a unit
  # would be started without its quadlet, config or volumes.
  step=ownership
  each_file check_present
  refuse_if_errors
  look
  loaded_defs
fi
# The rest (volumes, /disk, starts: most of an apply's time) under the instance's lock alone: a daemon-reload waits for
# every holder of the host lock, and on a busy host, for scripts past their writes, it waited past LOCK_WAIT_SECONDS.
release_host

step=volume
# Owned by the exporter's uid, as an emptyDir is writable by the pod's users: the exporter keeps QEMU's sockets and
# disk there, the root runtime writes wherever it likes.
# One inspect for both volumes (a line per volume that exists): podman calls are most of an apply's time.
volumes=$(podman volume inspect --format '{{.Name}} {{.Mountpoint}}' "$VOLUME" "$DISK" 2>/dev/null || true)
mp=
disk_made=0
while read -r v m; do
  case "$v" in
  "$VOLUME") mp=$m ;;
  "$DISK") disk_made=1 ;;
  esac
done <<EOF_VOLUMES
$volumes
EOF_VOLUMES
# Podman gives a volume made with o=uid,gid that owner itself; one made otherwise (by hand, by an older version) is
# chowned. A volume made now has no container: none can be left over that mounts it.
fresh=0
if [ -z "$mp" ]; then
  make_volume "$VOLUME" --opt "o=uid=$EXPORTER_UID,gid=$EXPORTER_UID"
  fresh=1
elif [ "$(stat -c %u:%g "$mp")" != "$EXPORTER_UID:$EXPORTER_UID" ]; then
  chown "$EXPORTER_UID:$EXPORTER_UID" "$mp"
fi

step=disk
# /disk holds at most its size: an ext4 file system in a sparse file, which podman loop-mounts (mount -o loop) when
# the first container starts and unmounts after the last one stops. The volume first, so an image never lacks the
# labels that name its owner. The root directory is the exporter's, as for the shared volume.
if [ "$disk_made" = 0 ]; then make_volume "$DISK" --opt type=ext4 --opt device="$IMG" --opt o=loop; fi
if [ ! -f "$IMG" ]; then
  mkdir -p "${IMG%/*}"
  tmp=$(mktemp "${IMG%/*}/.${IMG##*/}.qsp-tmp.XXXXXX")
  truncate -s "$DISK_BYTES" "$tmp"
  # lazy init: a sparse file reads as zeros, so nothing needs writing; no reserved blocks, the guest gets it all
  quiet mkfs.ext4 -F -q -m 0 \
    -E "root_owner=$EXPORTER_UID:$EXPORTER_UID,lazy_itable_init=1,lazy_journal_init=1" "$tmp"
  mv -f "$tmp" "$IMG"
  tmp=
  say disk-created "$IMG" "$DISK_BYTES"
elif [ "$(stat -c %s "$IMG")" -lt "$DISK_BYTES" ]; then
  # Grown offline, while no container has it mounted: now if none runs, else between the stop and the start of the
  # restart that the new size brings (it is in the runtime quadlet; deferred while leased). Online resizing would
  # need CAP_SYS_RESOURCE, which containers (the sandbox's lab hosts among them) often lack.
  if [ -z "$(losetup -j "$IMG" -n -O NAME)" ]; then grow_disk; else say disk-grow-pending "$IMG"; fi
fi

step=check-units
for pair in "$RT=$RTQ" "$EX=$EXQ"; do
  u=${pair%%=*}
  quadlet=${pair#*=}
  unit "$u"
  if [ "$load" != loaded ]; then
    why=
    for g in $GENERATORS; do
      if [ -x "$g" ]; then
        why=$("$g" --dryrun 2>&1 >/dev/null | grep -F "$quadlet" | head -n 3 | tr '\n' ' ' || true)
        break
      fi
    done
    err "unit-missing $u: $quadlet generated no service; ${why:-is the podman quadlet generator installed?}"
  elif [ "$src" != "$quadlet" ]; then
    err "unit-shadowed $u is loaded from $frag, not from $quadlet; remove that file"
  fi
done
refuse_if_errors

step=devices
# The facts are the host's (the preflight compared them), so a node that only its owner may open is refused: the
# exporter's uid cannot open it whatever group it gets, and QEMU would run under TCG unnoticed.
if [ "$KVM_REQUIRED" = 1 ]; then
  if [ ! -c /dev/kvm ]; then err "kvm-missing /dev/kvm is not present on this host"; fi
  if [ -n "$KVM_DENIED_MODE" ]; then
    err "kvm-denied /dev/kvm is mode $KVM_DENIED_MODE owned by $(stat -L -c %U:%G /dev/kvm) (gid $KVM_GID): the \
exporter (uid $EXPORTER_UID, where the QEMU driver decides on KVM) cannot open it and QEMU would run without KVM; make \
it 0660 root:kvm as Debian and Ubuntu ship it (udev rule KERNEL==\"kvm\", GROUP=\"kvm\", MODE=\"0660\"; the group is \
added to the exporter) or 0666 as Fedora and RHEL ship it"
  fi
fi
while read -r d; do
  if [ -n "$d" ] && [ ! -e "$d" ]; then err "device-missing $d is not present on this host"; fi
done <<EOF_DEVICES
$DEVICES
EOF_DEVICES
# the files are in place; starting without the device would only fail, or run QEMU without KVM unnoticed
refuse_if_errors

step=restart
ex_exited=0
ex_started=0
unit "$EX"
if [ "$KEEP_EXITED" = 1 ] && [ "$active" = inactive ] && [ "$result" = success ] && [ "$main_status" = 0 ] &&
  [ "${main_started:-0}" != 0 ]; then
  ex_exited=1
  say exited "$EX"
fi
# A running unit restarts when the definition systemd has loaded differs from the one it was started with, by this
# apply's change or by any earlier one (deferred, interrupted, or loaded by another script's daemon-reload): a quadlet
# rewritten with the same content (a hand-deleted file put back) leaves QEMU alone. The exporter lives in the
# runtime's network namespace, which a runtime restart replaces, so it goes along.
restart=
if outdated "$RT"; then
  restart=$RT
  if [ "$ex_exited" = 0 ]; then restart="$RT $EX"; fi
fi
if [ -z "$restart" ] && outdated "$EX"; then restart=$EX; fi
if [ -n "$restart" ] && [ "$DEFER_RESTART" = 1 ]; then
  # the records stay as they are, so every later apply sees the restart owed until one does it
  for u in $restart; do say restart-pending "$u"; done
  restart=
fi
if [ -n "$restart" ]; then
  # One transaction, so the exporter (BindsTo the runtime) restarts once, after the runtime. Queued, not awaited: a
  # pull in ExecStartPre can take minutes, and the host lock is held until here. With /disk to grow: a stop, the
  # offline resize, then the queued start. $restart: unit names, which have no blanks.
  if [ "$(stat -c %s "$IMG")" -lt "$DISK_BYTES" ]; then
    # shellcheck disable=SC2086
    systemctl stop $restart
    grow_disk
    # shellcheck disable=SC2086
    systemctl start --no-block $restart
  else
    # shellcheck disable=SC2086
    systemctl restart --no-block $restart
  fi
  for u in $restart; do
    started_with "$u"
    say restarted "$u"
  done
fi

step=hup
case " $restart " in
*" $EX "*) ;;
*)
  unit "$EX"
  if [ "$cfg_changed" = 1 ] && [ "$active" = active ]; then
    if podman kill --signal HUP "$NAME-exporter" >/dev/null 2>&1; then
      say hup "$EX"
    else
      # the container went away between the two checks; a restart reads the new config just as well
      systemctl restart --no-block "$EX"
      started_with "$EX"
      say restarted "$EX"
    fi
  fi
  ;;
esac

step=start
# As they are now, not as the script's first look saw them: a start or restart queued before this apply (an earlier
# apply's, or a restart's second half) may have brought a unit up meanwhile, or taken it down on its way up.
look
# An exporter container that a stop left behind (the stop raced a start job, or ran while the quadlet was gone, and
# ExecStopPost never removed it) sits in the runtime's network namespace: the runtime's `podman run --replace` then
# fails ("has dependent containers") at every start and auto-restart, the exporter fails with it (dependency), and
# no apply gets them up again. With the exporter's unit down and no start of it queued, its container is a leftover:
# removed first, unless this apply just made the shared volume, which every exporter container mounts. (Taken for a
# leftover on a stale look, the container of an exporter that a queued start had just brought up was removed, and the
# apply started the exporter once more.)
unit "$EX"
case "$fresh/$active" in
1/* | */active | */activating | */deactivating | */reloading) ;;
*)
  queued "$EX"
  case " $jobs " in
  *" start "* | *" restart "*) ;;
  *) podman rm -f -i "$NAME-exporter" >/dev/null 2>&1 || true ;;
  esac
  ;;
esac
for u in "$RT" "$EX"; do
  if [ "$u" = "$EX" ] && [ "$ex_exited" = 1 ]; then continue; fi
  case " $restart " in *" $u "*) continue ;; esac
  unit "$u"
  case "$active" in
  active | activating | reloading) ;;
  *)
    queued "$u"
    case " $jobs " in
    # an earlier apply's start or restart still under way (a restart passes through deactivating): not down
    *" start "* | *" restart "*) continue ;;
    esac
    # deactivating with no job: its process ended by itself and systemd's Restart= decides, which a start now would
    # race (an exporter comes back; one on its way out after a lease, under KEEP_EXITED, is let go and the next apply
    # reports it exited). One that stays down is the next apply's to start.
    if [ "$active" = deactivating ] && [ -z "$jobs" ]; then continue; fi
    # a unit that hit its start limit refuses to start until reset
    if [ "$active" = failed ]; then systemctl reset-failed "$u"; fi
    systemctl start --no-block "$u"
    started_with "$u"
    say started "$u"
    if [ "$u" = "$EX" ]; then ex_started=1; fi
    ;;
  esac
done
# every job is queued and every record written: other scripts of this instance may go on while this one reports
unlock_host

step=report
# The units as they are now, their jobs queued, not awaited: a start often still reads "activating". The controller
# learns that they came up from a later inspection of the host or from Jumpstarter, without holding this channel.
look
for u in "$RT" "$EX"; do
  unit "$u"
  say state "$u" "$active" "$sub" "$restarts"
done
# why an exporter is down, restarting or had to be started again, for the set's status: what a person reads first.
# One whose start or restart this apply just queued is not down, whatever it reads while the job waits.
case " $restart " in *" $EX "*) queued=1 ;; *) queued=$ex_started ;; esac
case "$active/$sub" in
activating/auto-restart*) down=1 ;;
active/* | activating/* | deactivating/* | reloading/*) down=0 ;;
*) down=$((1 - queued)) ;;
esac
if [ "$down" = 1 ] || [ "${restarts:-0}" != 0 ] || [ "$ex_started" = 1 ]; then
  journalctl -u "$EX" -n "$JOURNAL_LINES" -o cat --no-pager 2>/dev/null |
    while IFS= read -r l; do say journal "$l"; done
fi
say "done"
