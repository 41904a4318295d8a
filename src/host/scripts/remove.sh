# remove: takes one instance off the host (remote.ts removeScript). After lib.sh; the header sets UID_ (empty: any of
# ours), RT, EX (units), CONTAINERS, FILES (the files written, one a line), MOUNT_DIR (the config's directory), VOLUME,
# DISK (the /disk volume), IMG (its image), STARTED (the units' records) and PENDING (an older apply's marker, or '').
# render.ts names have no blanks or glob characters, so the lists split on blanks.
removed=0
gone() {
  removed=$((removed + 1))
  say removed "$@"
}

step=lock
lock_host

step=ownership
for f in $FILES; do check_owner "$f" "$UID_"; done
refuse_if_errors

step=stop
for u in "$EX" "$RT"; do
  unit "$u"
  if [ "$load" = loaded ]; then
    case "$active" in
    inactive | failed) ;;
    *)
      systemctl stop "$u"
      say stopped "$u"
      ;;
    esac
  fi
done

step=containers
for c in $CONTAINERS; do
  if podman container exists "$c"; then
    podman rm -f --ignore "$c" >/dev/null
    gone container "$c"
  fi
done

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
# The disk's image goes before its volume, so that an interrupted remove leaves the volume that names the owner.
for v in "$VOLUME" "$DISK"; do
  v_uid=$(podman volume inspect --format "{{index .Labels \"$PROVISIONER/uid\"}}" "$v" 2>/dev/null || true)
  if [ -n "$v_uid" ] && { [ -z "$UID_" ] || [ "$v_uid" = "$UID_" ]; }; then
    if [ "$v" = "$DISK" ]; then remove_path "$IMG"; fi
    podman volume rm -f "$v" >/dev/null
    gone volume "$v"
  fi
done

step=daemon-reload
if [ "$quadlet_gone" = 1 ]; then
  systemctl daemon-reload
  say reloaded
fi
# a unit that failed lingers in systemctl's list after its file is gone
systemctl reset-failed "$EX" "$RT" >/dev/null 2>&1 || true
if [ "$removed" = 0 ]; then say removed nothing; fi
say "done"
