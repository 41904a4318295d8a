# Shared by the apply, remove and inspect scripts (remote.ts sends each as one text: its header of values, this
# file, then its own steps). The header's values are uppercase; lowercase names are the scripts' own.

# Strict mode, a sane PATH, and a trap that names the step a failure happened in.
set -eu
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH LC_ALL=C
step=start
tmp=
refused=0
# shellcheck disable=SC2154 # rc is assigned inside the trap's own text
trap 'rc=$?; [ -z "$tmp" ] || rm -f "$tmp"; [ "$rc" = 0 ] || [ "$refused" = 1 ] || printf "qsp error step-failed %s (exit %s)\n" "$step" "$rc"' EXIT
# printf, never echo: dash's echo expands backslashes, so a journal line holding "\nqsp state ..." would forge a line
say() { printf 'qsp %s\n' "$*"; }
# shellcheck disable=SC2034 # a newline, for the scripts that split on it (not every one does)
nl='
'

# UNIT: one systemctl call for the properties the scripts look at, into load, active, sub, ...
# shellcheck disable=SC2034 # each script reads the properties it needs
unit() {
  load='' active='' sub='' restarts='' src='' frag='' need_reload='' result='' main_status='' main_started=''
  while IFS='=' read -r k v; do
    case "$k" in
    LoadState) load=$v ;;
    ActiveState) active=$v ;;
    SubState) sub=$v ;;
    NRestarts) restarts=$v ;;
    SourcePath) src=$v ;;
    FragmentPath) frag=$v ;;
    NeedDaemonReload) need_reload=$v ;;
    Result) result=$v ;;
    ExecMainStatus) main_status=$v ;;
    ExecMainStartTimestampMonotonic) main_started=$v ;;
    esac
  done <<EOF_UNIT
$(systemctl show -p LoadState,ActiveState,SubState,NRestarts,SourcePath,FragmentPath,NeedDaemonReload \
    -p Result,ExecMainStatus,ExecMainStartTimestampMonotonic "$1" 2>/dev/null || true)
EOF_UNIT
}

# Refusals: report every problem a step finds, then stop before changing anything that depends on it.
errors=0
err() { say error "$@"; errors=$((errors + 1)); }
# after reported errors: stop here, with a status the trap does not mistake for a failed step
refuse_if_errors() {
  if [ "$errors" != 0 ]; then
    say "done"
    refused=1
    exit 2
  fi
}
# the uid in the ownership line of a file we wrote (first two lines only: the config's values cannot start a line
# there), empty if it has none
owner_uid() { head -n 2 "$1" 2>/dev/null | sed -n "s/^$OWNER_RE.* uid=\\([^ ]*\\)\$/\\1/p"; }
# PATH UID: refuse to touch a file another exporter (or a person) owns; UID empty: any of ours
check_owner() {
  if [ ! -e "$1" ]; then return 0; fi
  u=$(owner_uid "$1")
  if [ -z "$u" ]; then
    err "not-owned $1 exists and is not managed by $PROVISIONER; move it away or pick another name"
  elif [ -n "$2" ] && [ "$u" != "$2" ]; then
    err "owner-conflict $1 belongs to exporter uid=$u, not uid=$2 (same name in another namespace?)"
  fi
}

# Serializes the scripts on one host. Without it another script's daemon-reload can load an instance's new definition
# between its file writes and its look at what changed, and a remove's ownership check can go stale before its rm.
# flock's lock goes with the process: a script killed while holding it does not block the next one.
lock_host() {
  mkdir -p "$RUN_DIR"
  exec 9>>"$HOST_LOCK"
  if ! flock -w "$LOCK_WAIT_SECONDS" 9; then
    err "host-busy another apply or remove on this host has held $HOST_LOCK for over ${LOCK_WAIT_SECONDS}s; \
it is retried; if this persists, see which process holds it: fuser -v $HOST_LOCK"
    refuse_if_errors
  fi
}
unlock_host() { exec 9>&-; }

# Coalesced daemon-reload: systemd serializes reloads, so N scripts writing quadlets at once share one or two rather
# than queue N. Each bumps a generation counter after its writes (reload_owed, under the host lock, so no bump is
# lost and none precedes its writes) and then calls reload_systemd without the host lock: a reload that read the
# counter at or past its generation began after its writes and covers them. Scripts wait on a lock of their own.
# A script holds a shared lock on RUN_DIR/writers from its host lock until it has written and bumped (writing,
# written): a reload waits (bounded) for those, so scripts that arrive together share it; a killed one's lock goes.
writing() {
  mkdir -p "$RUN_DIR"
  exec 7>>"$RUN_DIR/writers"
  flock -s 7
}
written() { exec 7>&-; }
# NAME: the counter in RUN_DIR/NAME, 0 before the first bump (since boot: RUN_DIR is in /run)
get_gen() { cat "$RUN_DIR/$1" 2>/dev/null || echo 0; }
# NAME VALUE: replaced atomically (the counters are read without the lock that writes them)
put_gen() {
  printf '%s\n' "$2" >"$RUN_DIR/.$1.tmp"
  mv -f "$RUN_DIR/.$1.tmp" "$RUN_DIR/$1"
}
reload_owed() {
  my_gen=$(($(get_gen reload-gen) + 1))
  put_gen reload-gen "$my_gen"
}
reload_systemd() {
  exec 8>>"$RUN_DIR/reload-lock"
  if ! flock -w "$LOCK_WAIT_SECONDS" 8; then
    err "host-busy another script on this host has held $RUN_DIR/reload-lock for over ${LOCK_WAIT_SECONDS}s; \
it is retried; if this persists, see which process holds it: fuser -v $RUN_DIR/reload-lock"
    refuse_if_errors
  fi
  if [ "$(get_gen reloaded-gen)" -lt "$my_gen" ]; then
    # writers hold it for a fraction of a second; a stuck one delays this reload by 2 s at most
    exec 7>>"$RUN_DIR/writers"
    flock -x -w 2 7 || true
    exec 7>&-
    g=$(get_gen reload-gen)
    systemctl daemon-reload
    put_gen reloaded-gen "$g"
    say reloaded
  fi
  exec 8>&-
}

# Sets facts to this host's wire form (host_facts.ts factsWire). `stat -L`: /dev/kvm may be a symlink to the node
# (some device managers do that); the container gets the node's mode and gid.
# shellcheck disable=SC2034 # facts is the result, read by the caller
host_facts() {
  v=$(podman --version 2>/dev/null || true)
  kvm=none
  if [ -c /dev/kvm ]; then kvm=$(stat -L -c %a:%g /dev/kvm); fi
  facts="podman=${v##* } kvm=$kvm"
}
