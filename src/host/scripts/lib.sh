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
# a newline, to split on
nl='
'

# The properties the scripts look at, of the instance's two units (RT, EX), in one systemctl call: `look` asks
# systemd, `unit UNIT` reads what the last look saw of UNIT into load, active, sub, ... A script looks again after
# whatever changes what it reads next (a daemon-reload; its own jobs, before it reports them): each call is a round
# trip to systemd, and asking per unit and step made 17 of them an apply.
look() {
  seen=$(systemctl show -p LoadState,ActiveState,SubState,NRestarts,SourcePath,FragmentPath,NeedDaemonReload \
    -p Result,ExecMainStatus,ExecMainStartTimestampMonotonic "$RT" "$EX" 2>/dev/null || true)
}
# shellcheck disable=SC2034 # each script reads the properties it needs
unit() {
  load='' active='' sub='' restarts='' src='' frag='' need_reload='' result='' main_status='' main_started=''
  # systemctl prints the units in the order asked, a blank line between
  block=
  case "$seen" in
  *"$nl$nl"*)
    if [ "$1" = "$RT" ]; then block=${seen%%"$nl$nl"*}; else block=${seen#*"$nl$nl"}; fi
    ;;
  esac
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
$block
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
# FILE...: "FILE OWNER" for each file we wrote, OWNER its ownership line after OWNER_PREFIX (first two lines only: the
# config's values cannot start a line there). One awk for all the files: a head and a sed for each made a whole
# inspection of a host with 8 instances cost some 150 processes.
owners() {
  # getline rather than awk's own file loop: mawk (Debian's awk) stops at a file it cannot open, and one removed since
  # it was listed would hide all the files after it
  P=$OWNER_PREFIX awk 'BEGIN {
    p = ENVIRON["P"]
    for (i = 1; i < ARGC; i++) {
      for (k = 1; k <= 2 && (getline l <ARGV[i]) > 0; k++) {
        if (index(l, p) == 1 && length(l) > length(p)) {
          print ARGV[i] " " substr(l, length(p) + 1)
          break
        }
      }
      close(ARGV[i])
    }
  }' "$@"
}
# the uid at the end of the ownership line of a file we wrote, empty if it has none
owner_uid() {
  ou=$(owners "$1")
  case "$ou" in *" uid="*) ou=${ou##* uid=} ;; *) ou= ;; esac
  case "$ou" in *" "*) ;; *) printf '%s\n' "$ou" ;; esac
}
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

# The host lock, shared or exclusive, and each instance's own lock (NAME_LOCK) beneath the shared one. A script
# checks and writes its own instance's files under the shared lock and its instance's, so scripts of other instances
# go on side by side, and one of the same name (another namespace's too) cannot slip in between an ownership check and
# the writes or removals it allows; an apply then makes the volumes and starts the units under its instance's alone
# (release_host). A daemon-reload needs the host lock exclusive: no script is then between its writes and its look at
# what systemd loaded. flock's locks go with the process: a script killed while holding one does not block the next.
# FD FILE MODE (-s, -x): FILE's lock on FD (open on FILE), in MODE, waited for at most LOCK_WAIT_SECONDS, else refused
lock() {
  if ! flock "$3" -w "$LOCK_WAIT_SECONDS" "$1"; then
    err "host-busy another apply or remove on this host has held $2 for over ${LOCK_WAIT_SECONDS}s; \
it is retried; if this persists, see which process holds it: fuser -v $2"
    refuse_if_errors
  fi
}
# MODE: the host lock in MODE, and with the shared one the instance's (taken after it). Taken again in the other mode,
# it is dropped first (so whoever waited may come in between), and the instance's before it: waiting for the exclusive
# one with it would wait on a script of the same name that waits for it.
lock_host() {
  unlock_host
  if [ ! -d "$RUN_DIR" ]; then mkdir -p "$RUN_DIR"; fi
  exec 9>>"$HOST_LOCK"
  lock 9 "$HOST_LOCK" "$1"
  if [ "$1" = -s ]; then
    exec 8>>"$NAME_LOCK"
    lock 8 "$NAME_LOCK" -x
  fi
}
unlock_host() { exec 8>&- 9>&-; }
# the host lock let go and the instance's kept, past a script's writes and its look at what systemd loaded
release_host() { exec 9>&-; }

# Coalesced daemon-reload: systemd serializes reloads, so scripts writing quadlets at once share one rather than queue
# one each. A script that needs one marks it owed after its writes (reload_owed, under the shared lock) and calls
# reload_systemd under the exclusive lock: whoever holds that first after the mark reloads for every script that
# marked it, as none of them is writing then, and clears the mark; the others find it cleared, their writes covered.
reload_owed() { : >"$RUN_DIR/reload-owed"; }
reload_systemd() {
  if [ -e "$RUN_DIR/reload-owed" ]; then
    systemctl daemon-reload
    # after the reload: a script killed during it leaves the mark to the next
    rm -f "$RUN_DIR/reload-owed"
    say reloaded
  fi
}

# Sets facts to this host's wire form (host_facts.ts factsWire). `stat -L`: /dev/kvm may be a symlink to the node
# (some device managers do that); the container gets the node's mode and gid.
# shellcheck disable=SC2034 # facts and podman_version are the result, read by the caller
host_facts() {
  read_podman_version
  kvm=none
  if [ -c /dev/kvm ]; then kvm=$(stat -L -c %a:%g /dev/kvm); fi
  facts="podman=$podman_version kvm=$kvm"
}
# Sets podman_version to the number `podman --version` prints, "" without one. That command starts all of Podman, some
# 50 ms of CPU where a stat takes 2: every apply and whole inspection asks, so the answer is kept in RUN_DIR (a tmpfs,
# empty at boot) for the binary that gave it: its path, device, inode, size and modification and change times, which
# an upgrade, a rewrite in place or another podman first in PATH all change. Keeping it is best effort: a write that
# fails leaves the next script to ask Podman again. Not an instance's file: nothing of an instance is written before
# the facts are checked.
read_podman_version() {
  p=$(command -v podman 2>/dev/null || true)
  id=
  case "$p" in /*) id=$(stat -L -c '%n %d %i %s %y %z' "$p" 2>/dev/null || true) ;; esac
  if [ -n "$id" ] && [ -f "$RUN_DIR/podman-version" ] &&
    { read -r c_id && read -r c_version; } <"$RUN_DIR/podman-version" && [ "$c_id" = "$id" ]; then
    podman_version=$c_version
    return 0
  fi
  podman_version=$(podman --version 2>/dev/null || true)
  podman_version=${podman_version##* }
  if [ -n "$id" ] && [ -n "$podman_version" ]; then
    (mkdir -p "$RUN_DIR" && c_tmp=$(mktemp "$RUN_DIR/.podman-version.XXXXXX") &&
      printf '%s\n%s\n' "$id" "$podman_version" >"$c_tmp" && mv -f "$c_tmp" "$RUN_DIR/podman-version") \
      2>/dev/null || true
  fi
}
