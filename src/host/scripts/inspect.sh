# inspect: one round trip that describes the host and every instance we manage on it, including half-deployed
# leftovers: a config without quadlets, a container or volume without files (remote.ts inspectScript). After lib.sh;
# the header's constants are all it needs. SCOPE=units asks only for the units and their jobs: the close looks at
# units on their way up (deploy.ts) need no more, and cost a few processes instead of the whole inspection's sixty.
# Such a look first gives the starts under way WAIT_TICKS tenths of a second to end (see starts_queued), so that
# units coming up are seen within a tenth of a second rather than at the controller's next look.
units() {
  step=units
  systemctl list-units --all --plain --no-legend --no-pager '*-runtime.service' '*-exporter.service' 2>/dev/null |
    while read -r u load active sub _description; do say unit "$u" "$load" "$active" "$sub"; done
  # a unit whose start job waits (on the runtime's, or behind a pull) still reads inactive: it is starting, not down
  jobs_of_ours | while read -r _id u type _state; do say job "$u" "$type"; done
}
# the jobs systemd has queued or running for units named like ours, a line each: ID UNIT TYPE STATE
jobs_of_ours() { systemctl list-jobs --no-legend --no-pager '*-runtime.service' '*-exporter.service' 2>/dev/null; }
# a start or restart job among them: systemd keeps a start job until its unit is active (with Type=notify, until
# conmon reports the container up) or has failed; a unit waiting to restart has none
starts_queued() {
  jobs_of_ours | {
    while read -r _id _u type _state; do
      case "$type" in start | restart) return 0 ;; esac
    done
    return 1
  }
}
if [ "$SCOPE" = units ]; then
  step=starts
  i=0
  while [ "$i" -lt "$WAIT_TICKS" ] && starts_queued; do
    sleep 0.1
    i=$((i + 1))
  done
  units
  say "done"
  exit 0
fi

step=versions
host_facts
say facts "$facts"
v=$(systemctl --version 2>/dev/null | head -n 1 || true)
v=${v#systemd }
say systemd "${v%% *}"
g=none
for c in $GENERATORS; do
  if [ -x "$c" ]; then
    g=$c
    break
  fi
done
say generator "$g"

step=disk
for d in /etc /var/lib/containers "$DISK_DIR"; do
  p=$d
  while [ -n "$p" ] && [ ! -e "$p" ]; do p=${p%/*}; done
  say disk "$d" "$(df -Pk "${p:-/}" | awk 'NR == 2 { print $4 }')"
done

step=files
files=
for f in "$QUADLET_DIR"/*-runtime.container "$QUADLET_DIR"/*-exporter.container "$CONFIG_DIR"/*.yaml \
  "$CONFIG_DIR"/*.d/*.yaml; do
  if [ -f "$f" ]; then files="$files$f$nl"; fi
done
owned=
if [ -n "$files" ]; then
  # shellcheck disable=SC2086 # split on newlines only, no globbing: one word per path
  found=$(IFS=$nl && set -f && owners $files)
  while read -r f o; do
    if [ -z "$f" ]; then continue; fi
    owned="$owned$f$nl"
    b=${f##*/}
    case "$b" in
    *-runtime.container) say file runtime "${b%-runtime.container}" "$f" "$o" ;;
    *-exporter.container) say file exporter "${b%-exporter.container}" "$f" "$o" ;;
    *) say file config "${b%.yaml}" "$f" "$o" ;;
    esac
  done <<EOF
$found
EOF
fi

step=digests
# what the controller compares with what it rendered (drift): two processes for all files, not two per file
if [ -n "$owned" ]; then
  # shellcheck disable=SC2086 # split on newlines only, no globbing: one word per path
  (IFS=$nl && set -f && stat -c '%a:%u:%g %n' $owned) | while read -r m f; do say mode "$f" "$m"; done
  # shellcheck disable=SC2086 # as above
  (IFS=$nl && set -f && sha256sum $owned) | while read -r h f; do say sha256 "$f" "$h"; done
fi

units

step=records
# what each unit was started with, and what systemd has loaded for it (quadlet units are generated there): a running
# unit where the two differ owes a restart, which an apply gives it
recorded=
for f in "$RUN_DIR"/*.started; do
  if [ -f "$f" ]; then
    h=
    read -r h <"$f" || true
    u=${f##*/}
    say record "${u%.started}" "$h"
    recorded="$recorded ${u%.started}"
  fi
done
# what systemd loaded for them: their FragmentPath, as the apply's `loaded_defs` reads it (named after the unit),
# hashed by one sha256sum for all
if [ -n "$recorded" ]; then
  # shellcheck disable=SC2086 # unit names, which have no blanks
  frags=$(systemctl show -p FragmentPath $recorded 2>/dev/null | sed -n 's/^FragmentPath=\(..*\)$/\1/p')
  if [ -n "$frags" ]; then
    # shellcheck disable=SC2086 # split on newlines only, no globbing: one word per path
    (IFS=$nl && set -f && sha256sum $frags 2>/dev/null) | while read -r h f; do say loaded "${f##*/}" "$h"; done
  fi
fi

if ! command -v podman >/dev/null 2>&1; then
  say "done"
  exit 0
fi
step=containers
podman ps -a --filter "label=$PROVISIONER/role" --format "{{index .Labels \"jumpstarter.dev/exporter\"}} {{.Names}} \
{{.State}} {{index .Labels \"$PROVISIONER/uid\"}} {{index .Labels \"$CONTROLLER_LABEL\"}}" |
  while read -r n c s u o; do say container "$n" "$c" "$s" "$u" "$o"; done

step=volumes
podman volume ls --format "{{.Name}} {{index .Labels \"$PROVISIONER/uid\"}} \
{{index .Labels \"jumpstarter.dev/namespace\"}} {{index .Labels \"$CONTROLLER_LABEL\"}}" |
  while read -r v u n o; do
    case "$v" in jumpstarter-*-shared | jumpstarter-*-disk) say volume "$v" "$u" "$n" "$o" ;; esac
  done
say "done"
