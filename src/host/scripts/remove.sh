# remove: takes one instance off the host (remote.ts removeScript). After lib.sh; the header sets UID_ (empty: any of
# ours), NAME_LOCK, RT, EX (units), CONTAINERS, FILES (the files written, one a line), MOUNT_DIR (the config's
# directory), VOLUME, DISK (the /disk volume), IMG (its image), STARTED (the units' records), PENDING (an older
# apply's marker, or '') and REMOVE_JOIN_SECONDS (join_removes). render.ts names have no blanks or glob characters,
# so the lists split on blanks.
removed=0
gone() {
  removed=$((removed + 1))
  say removed "$@"
}

# the host lock, and the files still ours (or none of anyone's) under it
lock_owned() {
  step=lock
  lock_host -s
  step=ownership
  for f in $FILES; do check_owner "$f" "$UID_"; done
  refuse_if_errors
}

lock_owned

step=stop
# Removes on one host share their daemon-reload, as applies do (lib.sh reload_systemd), but each first awaits its own
# units' stops, which end at different times: the first done would reload before the others had taken their quadlets
# away, and each of those would reload once more. So a remove holds the removes' lock shared until it knows whether it
# owes a reload, and before reloading waits, at most REMOVE_JOIN_SECONDS, for the others to get that far (join_removes).
removes_lock=$RUN_DIR/removes.lock
exec 7>>"$removes_lock"
flock -s 7
# Queued under the lock (in order with other scripts' jobs for these units), awaited without it: a unit takes seconds
# to stop, and a reload (under the exclusive lock) need not wait for it.
stop=
look
for u in "$EX" "$RT"; do
  unit "$u"
  if [ "$load" = loaded ]; then
    case "$active" in
    inactive | failed) ;;
    *) stop="$stop $u" ;;
    esac
  fi
done
if [ -n "$stop" ]; then
  # shellcheck disable=SC2086 # unit names, no blanks
  systemctl stop --no-block $stop
  unlock_host
  # joins the queued jobs and returns once they are done (bounded by the units' stop timeouts)
  # shellcheck disable=SC2086
  systemctl stop $stop
  for u in $stop; do say stopped "$u"; done
  # an apply may have run meanwhile
  lock_owned
fi

step=containers
# One call for all; --depend, or podman removes them side by side and refuses the runtime while the exporter in its
# network namespace is still there. Podman prints each name it removed.
# shellcheck disable=SC2086 # names without blanks
out=$(podman rm -f --ignore --depend $CONTAINERS)
for c in $out; do gone container "$c"; done

# The removes' lock let go; with a reload owed, taken exclusive for a moment once the removes under way have let go
# too (or REMOVE_JOIN_SECONDS passed), so the reload that follows covers their quadlets as well. Without the host lock
# meanwhile: an apply may reload in between, which only covers more.
join_removes() {
  exec 7>&-
  if [ "$quadlet_gone" = 1 ]; then
    unlock_host
    exec 7>>"$removes_lock"
    flock -x -w "$REMOVE_JOIN_SECONDS" 7 || true
    exec 7>&-
  fi
}
# PATH: PATH removed, if there
remove_path() {
  if [ -e "$1" ]; then
    rm -f "$1"
    gone file "$1"
  fi
}
# PATH: the temp files an interrupted write left beside PATH (apply.sh put, mktemp)
remove_temps() { for p in "${1%/*}/.${1##*/}.qsp-tmp."*; do remove_path "$p"; done; }

step=files
quadlet_gone=0
for f in $FILES; do
  case "$f" in *.container) if [ -e "$f" ]; then quadlet_gone=1; fi ;; esac
  remove_path "$f"
done
for f in $FILES; do remove_temps "$f"; done
if [ -d "$MOUNT_DIR" ]; then
  rmdir "$MOUNT_DIR"
  gone dir "$MOUNT_DIR"
fi
# shellcheck disable=SC2086 # paths without blanks; PENDING may be empty
rm -f $STARTED $PENDING

step=volume
remove_temps "$IMG"
# by name alone a volume may be anyone's: only under our uid label (the uid asked for, or any of ours without one).
# The disk's image goes before its volume, so that an interrupted remove leaves the volume that names the owner. One
# inspect for both (one line per volume that exists), one rm.
ours=
while read -r v v_uid; do
  if [ -n "$v_uid" ] && { [ -z "$UID_" ] || [ "$v_uid" = "$UID_" ]; }; then
    if [ "$v" = "$DISK" ]; then remove_path "$IMG"; fi
    ours="$ours $v"
  fi
done <<EOF_VOLUMES
$(podman volume inspect --format "{{.Name}} {{index .Labels \"$PROVISIONER/uid\"}}" "$VOLUME" "$DISK" 2>/dev/null || true)
EOF_VOLUMES
if [ -n "$ours" ]; then
  # shellcheck disable=SC2086 # volume names, no blanks
  podman volume rm -f $ours >/dev/null
  for v in $ours; do gone volume "$v"; done
fi

if [ "$quadlet_gone" = 1 ]; then reload_owed; fi
step=join-removes
join_removes
step=lock
# Under the exclusive lock nobody takes the instance's lock anew (the host's comes first) or waits for it; an apply
# past its writes may still hold it, and its file goes only when free, or one of the same name would lock another.
lock_host -x
exec 8>>"$NAME_LOCK"
if flock -n -x 8; then rm -f "$NAME_LOCK"; fi
exec 8>&-
step=daemon-reload
reload_systemd
unlock_host
# a unit that failed lingers in systemctl's list after its file is gone
systemctl reset-failed "$EX" "$RT" >/dev/null 2>&1 || true
if [ "$removed" = 0 ]; then say removed nothing; fi
say "done"
