/**
 * The three things we do on a lab host, each one POSIX sh script sent over one SSH session (`sh -s`, the script on
 * stdin, so tokens never appear in a process list), and the parsers of what they print. Pure: building and parsing
 * strings only; ssh.ts runs them.
 *
 * Output protocol: every line meant for us starts with `qsp `; anything else (stray tool output) is ignored.
 *   qsp changed PATH                       a file or link was (re)written
 *   qsp volume-created VOLUME
 *   qsp disk-created IMAGE BYTES | qsp disk-grown IMAGE BYTES | qsp disk-grow-pending IMAGE   /disk's image
 *   qsp reloaded                           systemctl daemon-reload ran
 *   qsp restarted UNIT | qsp hup UNIT | qsp started UNIT
 *   qsp exited UNIT                        the exporter ended by itself (lease over) and was left stopped
 *   qsp restart-pending UNIT               UNIT runs an older definition than its quadlet (deferRestart)
 *   qsp state UNIT ACTIVE SUB RESTARTS     systemd ActiveState, SubState, NRestarts after the apply settled
 *   qsp journal LINE                       the exporter's last journal lines, when it is down, restarted or started
 *   qsp removed WHAT NAME | qsp removed nothing | qsp stopped UNIT
 *   qsp file KIND NAME PATH OWNER | qsp mode PATH MODE | qsp sha256 PATH HASH | qsp unit UNIT LOAD ACTIVE SUB
 *     | qsp record UNIT HASH | qsp loaded UNIT HASH | qsp container ... | qsp volume ...  what inspect found
 *   qsp facts WIRE                         the host's facts (host_facts.ts), printed before anything is written
 *   qsp error CODE MESSAGE                 CODE is one word (see ErrorCode)
 *   qsp done                               the script ran to its end (absent: it died or the connection dropped)
 * Exit status: 0 fine, 2 refused with `qsp error` lines, anything else a step failed (reported as step-failed).
 */
import { createHash } from "node:crypto";
import { Buffer } from "node:buffer";
import { PROVISIONER } from "../api/types.ts";
import {
  CONFIG_DIR,
  configMountDir,
  configPath,
  CONTROLLER_LABEL,
  DISK_DIR,
  diskImagePath,
  diskVolumeName,
  EXPORTER_UID,
  OWNER_PREFIX,
  QUADLET_DIR,
  quadletPath,
  type RenderedInstance,
  stageContainer,
  volumeName,
} from "./render.ts";
import { MIN_PODMAN, podmanVersionParts, quadletDialect } from "./quadlet_dialect.ts";
import { FACTS_SH, factsWire, type HostFacts, kvmAccess, octalMode, parseFacts } from "./host_facts.ts";

/** Single-quotes a value for sh. */
export function shQuote(s: string): string {
  return `'${s.replaceAll("'", `'\\''`)}'`;
}

/**
 * The remote command that reads a script on stdin. Non-root users need passwordless sudo for sh (`user ALL=(root)
 * NOPASSWD: /bin/sh` or broader): the scripts write to /etc and drive systemd and rootful podman. `-n` makes a
 * missing sudo rule fail at once instead of waiting for a password that will never come.
 */
export function shellCommand(user: string): string {
  return user === "root" ? "sh -s" : "sudo -n sh -s";
}

const GENERATORS = ["/usr/lib/systemd/system-generators/podman-system-generator", "/usr/libexec/podman/quadlet"];

/** Whether `podman --version`'s number is older than MIN_PODMAN; undefined when it is not a version number at all. */
export function podmanTooOld(version: string): boolean | undefined {
  return podmanVersionParts(version) === undefined ? undefined : quadletDialect(version) === "too-old";
}

// The apply's check of MIN_PODMAN, after the tools are known to be there. The same comparison as podmanTooOld, in sh.
const [MIN_MAJOR, MIN_MINOR] = MIN_PODMAN;
const PODMAN_CHECK =
  `# Without quadlet the files would be written and no service made: refuse before anything is written. A version
# that is not a number (a development build) is let through.
v=$(podman --version 2>/dev/null || true)
v=\${v##* }
major=\${v%%.*}
minor=\${v#"$major"}
minor=\${minor#.}
minor=\${minor%%[!0-9]*}
case "$major" in '' | *[!0-9]*) minor= ;; esac
if [ -n "$minor" ] &&
  { [ "$major" -lt ${MIN_MAJOR} ] || { [ "$major" -eq ${MIN_MAJOR} ] && [ "$minor" -lt ${MIN_MINOR} ]; }; }; then
  err "podman-too-old podman $v is older than ${MIN_MAJOR}.${MIN_MINOR} and has no quadlet, so no exporter service \\
could be made; upgrade podman to ${MIN_MAJOR}.${MIN_MINOR} or later (Debian 13, Ubuntu 24.04, RHEL 9.2 and later ship it)"
fi`;

// Shared by all scripts: strict mode, a sane PATH, and a trap that names the step a failure happened in.
const PRELUDE = `set -eu
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH LC_ALL=C
step=start
tmp=
refused=0
trap 'rc=$?; [ -z "$tmp" ] || rm -f "$tmp"; [ "$rc" = 0 ] || [ "$refused" = 1 ] || printf "qsp error step-failed %s (exit %s)\\n" "$step" "$rc"' EXIT
# printf, never echo: dash's echo expands backslashes, so a journal line holding "\\nqsp state ..." would forge a line
say() { printf 'qsp %s\\n' "$*"; }
nl='
'
`;

const UNIT_FN = `# UNIT: one systemctl call for the properties the scripts look at, into load, active, sub, ...
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
$(systemctl show -p LoadState,ActiveState,SubState,NRestarts,SourcePath,FragmentPath,NeedDaemonReload \\
    -p Result,ExecMainStatus,ExecMainStartTimestampMonotonic "$1" 2>/dev/null || true)
EOF_UNIT
}
`;

// Refusals: report every problem a step finds, then stop before changing anything that depends on it.
const CHECK_FNS = `errors=0
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
owner_uid() { head -n 2 "$1" 2>/dev/null | sed -n 's/^${sedEscape(OWNER_PREFIX)}.* uid=\\([^ ]*\\)$/\\1/p'; }
# refuse to touch a file another exporter (or a person) owns; UID empty: any of ours
check_owner() {
  if [ ! -e "$1" ]; then return 0; fi
  u=$(owner_uid "$1")
  if [ -z "$u" ]; then
    err "not-owned $1 exists and is not managed by ${PROVISIONER}; move it away or pick another name"
  elif [ -n "$2" ] && [ "$u" != "$2" ]; then
    err "owner-conflict $1 belongs to exporter uid=$u, not uid=$2 (same name in another namespace?)"
  fi
}
`;

/** Where the scripts keep what they know about the host between runs; in /run, as a reboot starts every unit anew. */
export const RUN_DIR = `/run/${PROVISIONER}`;
/** The lock every apply and remove on a host holds while it looks at, writes or removes files and queues systemd jobs. */
export const HOST_LOCK = `${RUN_DIR}/lock`;
/**
 * How long a script waits for the host lock before refusing with host-busy. Holders keep it for file writes, one
 * daemon-reload and queued (not awaited) systemd jobs: seconds. Well inside the SSH command timeout (120 s).
 */
export const LOCK_WAIT_SECONDS = 60;
/** Holds the hash of the service definition a unit was last started with by an apply (its `started_with`). */
export const startedPath = (unit: string) => `${RUN_DIR}/${unit}.started`;

// Serializes the scripts on one host. Without it another script's daemon-reload can load an instance's new definition
// between its file writes and its look at what changed, and a remove's ownership check can go stale before its rm.
// flock's lock goes with the process: a script killed while holding it does not block the next one.
const LOCK_FNS = `lock_host() {
  mkdir -p ${RUN_DIR}
  exec 9>>${HOST_LOCK}
  if ! flock -w ${LOCK_WAIT_SECONDS} 9; then
    err "host-busy another apply or remove on this host has held ${HOST_LOCK} for over ${LOCK_WAIT_SECONDS}s; \\
it is retried; if this persists, see which process holds it: fuser -v ${HOST_LOCK}"
    refuse_if_errors
  fi
}
unlock_host() { exec 9>&-; }
`;

function sedEscape(s: string): string {
  return s.replace(/[.[\]*^$\\/]/g, (c) => `\\${c}`);
}

const JOURNAL_LINES = 5;
export const sha256 = (s: string) => createHash("sha256").update(s, "utf8").digest("hex");
const tempGlob = (path: string) => {
  const slash = path.lastIndexOf("/");
  return `${path.slice(0, slash)}/.${path.slice(slash + 1)}.qsp-tmp.`;
};

export interface ApplyOptions {
  /** Refuse to start (error kvm-missing) when the host has no /dev/kvm. */
  kvmRequired: boolean;
  /**
   * Leave an exporter that ended by itself (exit 0, as `exitOnLeaseEnd` makes it when its lease is over) stopped and
   * report it as exited, so the controller can replace the instance (ExitAndReplace). Default false.
   */
  keepExited?: boolean;
  /**
   * Write files and reload, but leave running units that a change would restart as they are (the instance is leased):
   * the restart is remembered on the host and done by the first apply without this option. Reloads (SIGHUP) still
   * happen. Default false.
   */
  deferRestart?: boolean;
  /** How long to wait for the units to leave "activating" before reporting their state; default 20. */
  settleSeconds?: number;
}

/**
 * Makes the host run this instance, idempotently: files are rewritten only when their content or mode differs, and
 * only what a change affects is restarted (runtime quadlet: both units; exporter quadlet: the exporter; config only:
 * SIGHUP to the exporter, which reloads after its current lease while QEMU keeps running).
 */
export function applyScript(r: RenderedInstance, opts: ApplyOptions): string {
  const q = shQuote;
  const rtQuadlet = quadletPath(r.units.runtime.replace(/\.service$/, ""));
  const exQuadlet = quadletPath(r.units.exporter.replace(/\.service$/, ""));
  const allPaths = r.files.flatMap((f) => [f.path, ...f.links]);
  const dirOf = (p: string) => p.slice(0, p.lastIndexOf("/"));
  const dirs = [...new Set(allPaths.map(dirOf))];
  const secretDirs = [...new Set(r.files.filter((f) => f.secret).flatMap((f) => [f.path, ...f.links]).map(dirOf))];
  // the directory a non-root owner's file lives in is that owner's too: the container mounts it to reach the file
  const ownedDirs = r.files.filter((f) => f.owner !== 0).map((f) => `chown ${f.owner}:${f.owner} ${q(dirOf(f.path))}`);
  const settleTicks = Math.max(0, Math.round((opts.settleSeconds ?? 20) * 5));

  const writes = r.files.map((f) => {
    const flag = f.path === rtQuadlet ? "rt_changed" : f.path === exQuadlet ? "ex_changed" : "cfg_changed";
    const content = Buffer.from(f.content, "utf8").toString("base64");
    return [
      `put ${q(f.path)} ${f.mode.toString(8)} ${f.owner} ${sha256(f.content)} ${q(content)}`,
      `if [ "$changed" = 1 ]; then ${flag}=1; fi`,
      ...f.links.map((l) => `link ${q(f.path)} ${q(l)}`),
    ].join("\n");
  }).join("\n");

  return `# ${r.name}: apply
${PRELUDE}${UNIT_FN}${CHECK_FNS}${LOCK_FNS}
UID_=${q(r.uid)}
RT=${q(r.units.runtime)}
EX=${q(r.units.exporter)}
RTQ=${q(rtQuadlet)}
EXQ=${q(exQuadlet)}
DISK=${q(r.disk.volume)}
IMG=${q(r.disk.image)}
RUN_DIR=${q(RUN_DIR)}
# left by an older version of this script for a restart it deferred: the record a unit is adopted with (adopt)
PENDING=${q(pendingPath(r.uid))}
# PATH MODE OWNER SHA256 BASE64: atomic replace (temp file in the same directory, synced, renamed) unless already equal
put() {
  changed=0
  if [ -f "$1" ] && [ ! -L "$1" ] && [ "$(stat -c %a:%u:%g "$1")" = "$2:$3:$3" ] &&
    [ "$(sha256sum <"$1" | cut -d' ' -f1)" = "$4" ]; then
    return 0
  fi
  tmp=$(mktemp "\${1%/*}/.\${1##*/}.qsp-tmp.XXXXXX")
  printf '%s' "$5" | base64 -d >"$tmp"
  chmod "$2" "$tmp"
  chown "$3:$3" "$tmp"
  sync "$tmp"
  mv -f "$tmp" "$1"
  tmp=
  changed=1
  say changed "$1"
}
# TARGET LINK: LINK becomes a hard link to TARGET, replaced atomically
link() {
  if [ "$(stat -c %d:%i "$1")" = "$(stat -c %d:%i "$2" 2>/dev/null || true)" ]; then return 0; fi
  tmp=$(mktemp -u "\${2%/*}/.\${2##*/}.qsp-tmp.XXXXXX")
  ln "$1" "$tmp"
  mv -f "$tmp" "$2"
  tmp=
  say changed "$2"
}
# hash of the service the generator made from a quadlet, i.e. of the definition systemd has loaded
generated() {
  unit "$1"
  if [ -n "$frag" ] && [ -f "$frag" ]; then sha256sum <"$frag" | cut -d' ' -f1; fi
}
running() {
  unit "$1"
  case "$active" in active | activating | reloading) return 0 ;; esac
  return 1
}
# UNIT: remember on the host which definition UNIT was (re)started with, once its job is queued. Written after the
# start, so a script killed in between leaves the old record: the next apply restarts once more rather than never.
started_with() {
  h=$(generated "$1")
  printf '%s\\n' "$h" >"$RUN_DIR/.$1.started.tmp"
  mv -f "$RUN_DIR/.$1.started.tmp" "$RUN_DIR/$1.started"
}
# UNIT: a unit that runs without a record (started by an older version of this script, or by hand) is taken to run
# what systemd has loaded now, before this apply writes anything: upgrading the controller restarts nothing. A
# restart the older script deferred is still owed.
adopt() {
  if [ -e "$RUN_DIR/$1.started" ] || ! running "$1"; then return 0; fi
  if grep -qxF "$1" "$PENDING" 2>/dev/null; then
    printf 'deferred\\n' >"$RUN_DIR/$1.started"
  else
    started_with "$1"
  fi
}
# UNIT: the unit runs, and not the definition systemd has loaded from its quadlet now
outdated() {
  running "$1" || return 1
  [ "$(cat "$RUN_DIR/$1.started" 2>/dev/null)" != "$(generated "$1")" ]
}

step=preflight
for c in podman systemctl base64 sha256sum mktemp stat flock truncate mkfs.ext4 resize2fs e2fsck losetup; do
  command -v "$c" >/dev/null 2>&1 || err "missing-tool $c is not installed on this host"
done
# podman loop-mounts the /disk volume's image at the first start
if [ ! -c /dev/loop-control ]; then
  err "loop-missing /dev/loop-control is not present on this host: load the loop module (modprobe loop)"
fi
if [ -f "$IMG" ] && [ "$(stat -c %s "$IMG")" -gt ${r.disk.bytes} ]; then
  err "disk-shrink $IMG holds $(($(stat -c %s "$IMG") / 1048576)) MiB, more than the ${
    r.disk.bytes / 2 ** 20
  } MiB that storage.size plus \\
storage.fsOverhead now ask for, and a file system with the guest's disks on it is not shrunk: set them back to at \\
least that much, or replace the instance to start over with an empty /disk"
fi
refuse_if_errors
${FACTS_SH}
say facts "$facts"
${PODMAN_CHECK}
refuse_if_errors
# files made for another host's facts (another podman, another kvm group) are never written: the controller renders
# them again for these and applies at once
if [ "$facts" != ${q(factsWire(r.facts))} ]; then
  err "facts-changed this host is $facts; the files were rendered for "${q(factsWire(r.facts))}
fi
refuse_if_errors

step=lock
lock_host

step=ownership
${allPaths.map((p) => `check_owner ${q(p)} "$UID_"`).join("\n")}
refuse_if_errors
adopt "$RT"
adopt "$EX"
rm -f "$PENDING"

step=make-dirs
(umask 022 && mkdir -p ${dirs.map(q).join(" ")})
chmod 0700 ${secretDirs.map(q).join(" ")}
${ownedDirs.join("\n")}

step=write-files
umask 077
rt_changed=0
ex_changed=0
cfg_changed=0
${writes}

step=volume
# Owned by the exporter's uid, as an emptyDir is writable by the pod's users: the exporter keeps QEMU's sockets and
# disk there, the root runtime writes wherever it likes.
if ! podman volume exists ${q(r.volume)}; then
  # labelled like the containers, so a volume left alone by an interrupted remove still names its owner
  podman volume create --label ${q(`jumpstarter.dev/exporter=${r.name}`)} --label ${q(`${PROVISIONER}/uid=${r.uid}`)} \
    --label ${q(`jumpstarter.dev/namespace=${r.namespace}`)} ${
    r.controller ? `--label ${q(`${CONTROLLER_LABEL}=${r.controller}`)} ` : ""
  }--opt o=uid=${EXPORTER_UID},gid=${EXPORTER_UID} \
    ${q(r.volume)} >/dev/null
  say volume-created ${q(r.volume)}
fi
mp=$(podman volume inspect --format '{{.Mountpoint}}' ${q(r.volume)})
if [ "$(stat -c %u:%g "$mp")" != ${EXPORTER_UID}:${EXPORTER_UID} ]; then chown ${EXPORTER_UID}:${EXPORTER_UID} "$mp"; fi

step=disk
# /disk holds at most its size: an ext4 file system in a sparse file, which podman loop-mounts (mount -o loop) when
# the first container starts and unmounts after the last one stops. The volume first, so an image never lacks the
# labels that name its owner. The root directory is the exporter's, as for the shared volume.
if ! podman volume exists "$DISK"; then
  podman volume create --label ${q(`jumpstarter.dev/exporter=${r.name}`)} --label ${q(`${PROVISIONER}/uid=${r.uid}`)} \
    --label ${q(`jumpstarter.dev/namespace=${r.namespace}`)} ${
    r.controller ? `--label ${q(`${CONTROLLER_LABEL}=${r.controller}`)} ` : ""
  }--opt type=ext4 --opt device="$IMG" --opt o=loop \
    "$DISK" >/dev/null
  say volume-created "$DISK"
fi
# COMMAND...: its output only when it fails
quiet() {
  out=$("$@" 2>&1) || { printf '%s\n' "$out" >&2; return 1; }
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
  truncate -s ${r.disk.bytes} "$IMG"
  quiet e2fsck -f -p "$IMG"
  quiet resize2fs "$IMG"
  say disk-grown "$IMG" ${r.disk.bytes}
}
if [ ! -f "$IMG" ]; then
  mkdir -p ${q(DISK_DIR)}
  tmp=$(mktemp "\${IMG%/*}/.\${IMG##*/}.qsp-tmp.XXXXXX")
  truncate -s ${r.disk.bytes} "$tmp"
  # lazy init: a sparse file reads as zeros, so nothing needs writing; no reserved blocks, the guest gets it all
  quiet mkfs.ext4 -F -q -m 0 -E root_owner=${EXPORTER_UID}:${EXPORTER_UID},lazy_itable_init=1,lazy_journal_init=1 "$tmp"
  mv -f "$tmp" "$IMG"
  tmp=
  say disk-created "$IMG" ${r.disk.bytes}
elif [ "$(stat -c %s "$IMG")" -lt ${r.disk.bytes} ]; then
  # Grown offline, while no container has it mounted: now if none runs, else between the stop and the start of the
  # restart that the new size brings (it is in the runtime quadlet; deferred while leased). Online resizing would
  # need CAP_SYS_RESOURCE, which containers (the sandbox's lab hosts among them) often lack.
  if [ -z "$(losetup -j "$IMG" -n -O NAME)" ]; then grow_disk; else say disk-grow-pending "$IMG"; fi
fi

step=daemon-reload
# Reload when a quadlet changed, and when systemd has not caught up with one (an earlier apply died before it).
reload=0
if [ "$rt_changed$ex_changed" != 00 ]; then reload=1; fi
for u in "$RT" "$EX"; do
  unit "$u"
  if [ "$load" != loaded ] || [ "$need_reload" != no ]; then reload=1; fi
done
if [ "$reload" = 1 ]; then
  systemctl daemon-reload
  say reloaded
fi

step=check-units
for pair in "$RT=$RTQ" "$EX=$EXQ"; do
  u=\${pair%%=*}
  quadlet=\${pair#*=}
  unit "$u"
  if [ "$load" != loaded ]; then
    why=
    for g in ${GENERATORS.map(q).join(" ")}; do
      if [ -x "$g" ]; then
        why=$("$g" --dryrun 2>&1 >/dev/null | grep -F "$quadlet" | head -n 3 | tr '\\n' ' ' || true)
        break
      fi
    done
    err "unit-missing $u: $quadlet generated no service; \${why:-is the podman quadlet generator installed?}"
  elif [ "$src" != "$quadlet" ]; then
    err "unit-shadowed $u is loaded from $frag, not from $quadlet; remove that file"
  fi
done
refuse_if_errors

step=devices
${opts.kvmRequired ? kvmCheck(r.facts) : ""}
${
    r.devices.map((d) => `if [ ! -e ${q(d)} ]; then err ${q(`device-missing ${d} is not present on this host`)}; fi`)
      .join("\n")
  }
# the files are in place; starting without the device would only fail, or run QEMU without KVM unnoticed
refuse_if_errors

step=restart
ex_exited=0
ex_started=0
unit "$EX"
if [ ${
    opts.keepExited ? 1 : 0
  } = 1 ] && [ "$active" = inactive ] && [ "$result" = success ] && [ "$main_status" = 0 ] &&
  [ "\${main_started:-0}" != 0 ]; then
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
if [ -n "$restart" ] && [ ${opts.deferRestart ? 1 : 0} = 1 ]; then
  # the records stay as they are, so every later apply sees the restart owed until one does it
  for u in $restart; do say restart-pending "$u"; done
  restart=
fi
if [ -n "$restart" ]; then
  # One transaction, so the exporter (BindsTo the runtime) restarts once, after the runtime. Queued, not awaited: a
  # pull in ExecStartPre can take minutes, and the host lock is held until here; settle waits for the jobs. With /disk
  # to grow: a stop, the offline resize, then the queued start.
  if [ "$(stat -c %s "$IMG")" -lt ${r.disk.bytes} ]; then
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
    if podman kill --signal HUP ${q(`${r.name}-exporter`)} >/dev/null 2>&1; then
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
# An exporter container that a stop left behind (the stop raced a start job, or ran while the quadlet was gone, and
# ExecStopPost never removed it) sits in the runtime's network namespace: the runtime's \`podman run --replace\` then
# fails ("has dependent containers") at every start and auto-restart, the exporter fails with it (dependency), and
# no apply gets them up again. With the exporter's unit down, its container is a leftover: removed first.
unit "$EX"
case "$active" in
active | activating | deactivating | reloading) ;;
*) podman rm -f -i ${q(`${r.name}-exporter`)} >/dev/null 2>&1 || true ;;
esac
for u in "$RT" "$EX"; do
  if [ "$u" = "$EX" ] && [ "$ex_exited" = 1 ]; then continue; fi
  case " $restart " in *" $u "*) continue ;; esac
  unit "$u"
  # an exporter on its way out after a lease (ExitAndReplace) is let go: the next apply reports it exited
  if [ "$u" = "$EX" ] && [ ${opts.keepExited ? 1 : 0} = 1 ] && [ "$active" = deactivating ]; then continue; fi
  case "$active" in
  active | activating | reloading) ;;
  *)
    # a unit that hit its start limit refuses to start until reset
    if [ "$active" = failed ]; then systemctl reset-failed "$u"; fi
    systemctl start --no-block "$u"
    started_with "$u"
    say started "$u"
    if [ "$u" = "$EX" ]; then ex_started=1; fi
    ;;
  esac
done
# every job is queued and every record written: other scripts may go on while this one waits for its units
unlock_host

step=settle
# wait (bounded) for the start jobs, so the report says running or failed rather than "starting"
i=0
while [ "$i" -lt ${settleTicks} ]; do
  busy=$(systemctl list-jobs --no-legend "$RT" "$EX" 2>/dev/null || true)
  for u in "$RT" "$EX"; do
    unit "$u"
    case "$active/$sub" in
    activating/auto-restart*) ;;
    activating/* | deactivating/* | reloading/*) busy=yes ;;
    esac
  done
  if [ -z "$busy" ]; then break; fi
  sleep 0.2
  i=$((i + 1))
done
for u in "$RT" "$EX"; do
  unit "$u"
  say state "$u" "$active" "$sub" "$restarts"
done
# why an exporter is down, restarting or had to be started again, for the set's status: what a person reads first
if [ "$active" != active ] || [ "\${restarts:-0}" != 0 ] || [ "$ex_started" = 1 ]; then
  journalctl -u "$EX" -n ${JOURNAL_LINES} -o cat --no-pager 2>/dev/null | while IFS= read -r l; do say journal "$l"; done
fi
say "done"
`;
}

/**
 * The devices step's check of /dev/kvm when KVM is required. The facts are the host's (the preflight compared them),
 * so a node that only its owner may open is refused here: the exporter's uid cannot open it whatever group it gets,
 * and QEMU would run under TCG unnoticed.
 */
function kvmCheck(facts: HostFacts | undefined): string {
  const missing = `if [ ! -c /dev/kvm ]; then err "kvm-missing /dev/kvm is not present on this host"; fi`;
  const access = kvmAccess(facts?.kvm ?? null);
  if (access.kind !== "denied") return missing;
  const mode = octalMode(access.mode);
  return `${missing}
err "kvm-denied /dev/kvm is mode ${mode} owned by $(stat -L -c %U:%G /dev/kvm) (gid ${access.gid}): the exporter \
(uid ${EXPORTER_UID}, where the QEMU driver decides on KVM) cannot open it and QEMU would run without KVM; make it \
0660 root:kvm as Debian and Ubuntu ship it (udev rule KERNEL==\\"kvm\\", GROUP=\\"kvm\\", MODE=\\"0660\\"; the group is \
added to the exporter) or 0666 as Fedora and RHEL ship it"`;
}

/** Where older versions of the apply script remembered the units of an instance whose restart they deferred. */
export const pendingPath = (uid: string) => `${RUN_DIR}/${uid}.restart-pending`;

export interface RemoveOptions {
  /** Only remove files whose ownership line names this uid (refuse with owner-conflict otherwise). */
  uid?: string;
}

/**
 * Takes the instance off the host: stops both units, removes the containers, files (and temp files an interrupted
 * apply left), the volume, and reloads systemd if a quadlet went. Idempotent: a second run reports `removed nothing`.
 */
export function removeScript(name: string, opts: RemoveOptions = {}): string {
  const q = shQuote;
  const RT = q(`${name}-runtime.service`);
  const EX = q(`${name}-exporter.service`);
  const quadlets = [quadletPath(`${name}-runtime`), quadletPath(`${name}-exporter`)];
  const mountDir = configMountDir(name);
  const files = [...quadlets, configPath(name), `${mountDir}/${name}.yaml`];
  return `# ${name}: remove
${PRELUDE}${UNIT_FN}${CHECK_FNS}${LOCK_FNS}
removed=0
gone() { removed=$((removed + 1)); say removed "$@"; }

step=lock
lock_host

step=ownership
${files.map((f) => `check_owner ${q(f)} ${q(opts.uid ?? "")}`).join("\n")}
refuse_if_errors

step=stop
for u in ${EX} ${RT}; do
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
for c in ${q(`${name}-exporter`)} ${q(`${name}-runtime`)} ${q(stageContainer(name))}; do
  if podman container exists "$c"; then
    podman rm -f --ignore "$c" >/dev/null
    gone container "$c"
  fi
done

step=files
quadlet_gone=0
for f in ${files.map(q).join(" ")}; do
  if [ -e "$f" ]; then
    rm -f "$f"
    gone file "$f"
    case "$f" in *.container) quadlet_gone=1 ;; esac
  fi
done
for f in ${files.map((f) => `${q(tempGlob(f))}*`).join(" ")}; do
  if [ -e "$f" ]; then
    rm -f "$f"
    gone file "$f"
  fi
done
if [ -d ${q(mountDir)} ]; then
  rmdir ${q(mountDir)}
  gone dir ${q(mountDir)}
fi
rm -f ${q(startedPath(`${name}-runtime.service`))} ${q(startedPath(`${name}-exporter.service`))}
${opts.uid ? `rm -f ${q(pendingPath(opts.uid))}` : "# no uid: no restart-pending marker to name"}

step=volume
for f in ${q(tempGlob(diskImagePath(name)))}*; do
  if [ -e "$f" ]; then
    rm -f "$f"
    gone file "$f"
  fi
done
# by name alone a volume may be anyone's: only under our uid label (the uid asked for, or any of ours without one).
# The disk's image goes before its volume, so that an interrupted remove leaves the volume that names the owner.
for v in ${q(volumeName(name))} ${q(diskVolumeName(name))}; do
  v_uid=$(podman volume inspect --format '{{index .Labels "${PROVISIONER}/uid"}}' "$v" 2>/dev/null || true)
  if [ -n "$v_uid" ] && { [ -z ${q(opts.uid ?? "")} ] || [ "$v_uid" = ${q(opts.uid ?? "")} ]; }; then
    if [ "$v" = ${q(diskVolumeName(name))} ] && [ -e ${q(diskImagePath(name))} ]; then
      rm -f ${q(diskImagePath(name))}
      gone file ${q(diskImagePath(name))}
    fi
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
systemctl reset-failed ${EX} ${RT} >/dev/null 2>&1 || true
if [ "$removed" = 0 ]; then say removed nothing; fi
say "done"
`;
}

/**
 * One round trip that describes the host and every instance we manage on it, including half-deployed leftovers: a
 * config without quadlets, a container or volume without files.
 */
export function inspectScript(): string {
  const q = shQuote;
  return `# inspect
${PRELUDE}
step=versions
${FACTS_SH}
say facts "$facts"
v=$(systemctl --version 2>/dev/null | head -n 1 || true)
v=\${v#systemd }
say systemd "\${v%% *}"
g=none
for c in ${GENERATORS.map(q).join(" ")}; do
  if [ -x "$c" ]; then g=$c; break; fi
done
say generator "$g"

step=disk
for d in /etc /var/lib/containers ${q(DISK_DIR)}; do
  p=$d
  while [ -n "$p" ] && [ ! -e "$p" ]; do p=\${p%/*}; done
  say disk "$d" "$(df -Pk "\${p:-/}" | awk 'NR == 2 { print $4 }')"
done

step=files
owned=
for f in ${q(QUADLET_DIR)}/*-runtime.container ${q(QUADLET_DIR)}/*-exporter.container ${q(CONFIG_DIR)}/*.yaml ${
    q(CONFIG_DIR)
  }/*.d/*.yaml; do
  if [ ! -f "$f" ]; then continue; fi
  o=$(head -n 2 "$f" | sed -n 's/^${sedEscape(OWNER_PREFIX)}//p')
  if [ -z "$o" ]; then continue; fi
  owned="$owned$f$nl"
  b=\${f##*/}
  case "$b" in
  *-runtime.container) say file runtime "\${b%-runtime.container}" "$f" "$o" ;;
  *-exporter.container) say file exporter "\${b%-exporter.container}" "$f" "$o" ;;
  *) say file config "\${b%.yaml}" "$f" "$o" ;;
  esac
done

step=digests
# what the controller compares with what it rendered (drift): two processes for all files, not two per file
if [ -n "$owned" ]; then
  (IFS=$nl && set -f && stat -c '%a:%u:%g %n' $owned) | while read -r m f; do say mode "$f" "$m"; done
  (IFS=$nl && set -f && sha256sum $owned) | while read -r h f; do say sha256 "$f" "$h"; done
fi

step=units
systemctl list-units --all --plain --no-legend --no-pager '*-runtime.service' '*-exporter.service' 2>/dev/null |
  while read -r u load active sub _description; do say unit "$u" "$load" "$active" "$sub"; done

step=records
# what each unit was started with, and what systemd has loaded for it (quadlet units are generated there): a running
# unit where the two differ owes a restart, which an apply gives it
recorded=
for f in ${q(RUN_DIR)}/*.started; do
  if [ -f "$f" ]; then
    h=
    read -r h <"$f" || true
    u=\${f##*/}
    say record "\${u%.started}" "$h"
    recorded="$recorded \${u%.started}"
  fi
done
# what systemd loaded for them: their FragmentPath, as the apply's \`generated\` reads it (named after the unit), hashed by
# one sha256sum for all
if [ -n "$recorded" ]; then
  # shellcheck disable=SC2086
  frags=$(systemctl show -p FragmentPath $recorded 2>/dev/null | sed -n 's/^FragmentPath=\\(..*\\)$/\\1/p')
  if [ -n "$frags" ]; then
    (IFS=$nl && set -f && sha256sum $frags 2>/dev/null) | while read -r h f; do say loaded "\${f##*/}" "$h"; done
  fi
fi

if ! command -v podman >/dev/null 2>&1; then
  say "done"
  exit 0
fi
step=containers
podman ps -a --filter label=${PROVISIONER}/role \\
  --format '{{index .Labels "jumpstarter.dev/exporter"}} {{.Names}} {{.State}} {{index .Labels "${PROVISIONER}/uid"}} {{index .Labels "${CONTROLLER_LABEL}"}}' |
  while read -r n c s u o; do say container "$n" "$c" "$s" "$u" "$o"; done

step=volumes
podman volume ls --format '{{.Name}} {{index .Labels "${PROVISIONER}/uid"}} {{index .Labels "jumpstarter.dev/namespace"}} {{index .Labels "${CONTROLLER_LABEL}"}}' |
  while read -r v u n o; do
    case "$v" in jumpstarter-*-shared | jumpstarter-*-disk) say volume "$v" "$u" "$n" "$o" ;; esac
  done
say "done"
`;
}

// ---------------------------------------------------------------- parsing

export type ErrorCode =
  | "missing-tool"
  | "host-busy"
  | "podman-too-old"
  | "not-owned"
  | "owner-conflict"
  | "unit-missing"
  | "unit-shadowed"
  | "facts-changed"
  | "kvm-missing"
  | "kvm-denied"
  | "loop-missing"
  | "disk-shrink"
  | "device-missing"
  | "step-failed"
  | "incomplete"
  | "exit";

export interface ScriptError {
  code: ErrorCode | string;
  message: string;
}

export interface UnitState {
  active: string;
  sub: string;
  restarts: number;
}

export interface ApplyReport {
  ok: boolean;
  changed: string[];
  volumeCreated: boolean;
  /** The /disk volume's image was made, grown to a larger size, or is to grow at the restart a lease defers. */
  disk?: "created" | "grown" | "grow-pending";
  reloaded: boolean;
  restarted: string[];
  hupped: string[];
  started: string[];
  /** Exporters left stopped after they ended by themselves (keepExited). */
  exited: string[];
  /** Units left running an older definition (deferRestart). */
  pending: string[];
  states: Record<string, UnitState>;
  /** The exporter's last journal lines (reported only when it is down or has restarted), tokens redacted. */
  journal: string[];
  /** The host's facts, as the script found them before writing anything. */
  facts?: HostFacts;
  errors: ScriptError[];
}

export interface RemoveReport {
  ok: boolean;
  removed: { kind: string; name: string }[];
  stopped: string[];
  reloaded: boolean;
  errors: ScriptError[];
}

export interface InspectedInstance {
  name: string;
  /** From the ownership lines of the files; absent for leftovers that have no files. */
  namespace?: string;
  set?: string;
  uid?: string;
  /**
   * Files found by kind (runtime and exporter quadlets, config): fewer than three is a half-deployed instance. Each
   * with its mode and owner as MODE:UID:GID (stat's %a:%u:%g) and the sha256 of its content.
   */
  files: InspectedFile[];
  /** Deployed under reclaimPolicy Retain: kept on the host when its ExporterSet is deleted. */
  retain?: boolean;
  /** The ExporterSet's uid from the ownership lines; absent in files written before it was recorded. */
  setUid?: string;
  /**
   * The controller identity (render.ts controllerIdentity) from the ownership lines, else the labels; absent on
   * instances written before it was recorded, which no sweep removes.
   */
  controller?: string;
  /** Files whose ownership lines disagree (someone copied files around): do not trust the owner fields. */
  ownerMismatch: boolean;
  runtime?: { load: string; active: string; sub: string };
  exporter?: { load: string; active: string; sub: string };
  /** Its units that run a definition older than the one systemd has loaded for them: each owes a restart. */
  outdated?: string[];
  containers: { name: string; state: string; uid: string; controller?: string }[];
  /** The shared volume exists. */
  volume: boolean;
  /** The /disk volume exists. */
  diskVolume: boolean;
}

export interface InspectedFile {
  kind: "runtime" | "exporter" | "config";
  path: string;
  mode?: string;
  sha256?: string;
}

export interface HostInspection {
  ok: boolean;
  /** Absent when the script did not get as far as printing them. */
  facts?: HostFacts;
  systemdVersion?: number;
  generator?: string;
  /** Free space in KiB by the path asked about (/etc, /var/lib/containers, DISK_DIR). */
  diskFreeKiB: Record<string, number>;
  instances: InspectedInstance[];
  errors: ScriptError[];
}

interface Lines {
  lines: string[][];
  errors: ScriptError[];
}

/** The `qsp` lines split into words, and the errors: reported ones plus what the exit status and stderr tell. */
function scan(stdout: string, stderr: string, exitCode: number): Lines {
  const lines: string[][] = [];
  const errors: ScriptError[] = [];
  let done = false;
  for (const raw of stdout.split("\n")) {
    if (!raw.startsWith("qsp ")) continue;
    const words = raw.slice(4).trimEnd().split(" ");
    if (words[0] === "error") {
      errors.push({ code: words[1] ?? "", message: words.slice(2).join(" ") });
    } else if (words[0] === "done") done = true;
    else lines.push(words);
  }
  const why = stderr.trim().split("\n").filter((l) => l.trim()).slice(-3).join(" | ");
  if (!done && !errors.some((e) => e.code === "step-failed")) {
    errors.push({
      code: "incomplete",
      message: `the script did not finish (exit ${exitCode})${why ? `: ${why}` : ""}`,
    });
  } else if (exitCode !== 0 && errors.length === 0) {
    errors.push({ code: "exit", message: `exit ${exitCode}${why ? `: ${why}` : ""}` });
  } else if (why) {
    const failed = errors.find((e) => e.code === "step-failed");
    if (failed) failed.message += `: ${why}`;
  }
  return { lines, errors };
}

export function parseApplyOutput(stdout: string, stderr: string, exitCode: number): ApplyReport {
  const { lines, errors } = scan(stdout, stderr, exitCode);
  const report: ApplyReport = {
    ok: errors.length === 0,
    changed: [],
    volumeCreated: false,
    reloaded: false,
    restarted: [],
    hupped: [],
    started: [],
    exited: [],
    pending: [],
    states: {},
    journal: [],
    errors,
  };
  for (const [kind, a, ...rest] of lines) {
    if (kind === "changed") report.changed.push(a);
    else if (kind === "volume-created") report.volumeCreated = true;
    else if (kind === "disk-created") report.disk = "created";
    else if (kind === "disk-grown") report.disk = "grown";
    else if (kind === "disk-grow-pending") report.disk = "grow-pending";
    else if (kind === "reloaded") report.reloaded = true;
    else if (kind === "restarted") report.restarted.push(a);
    else if (kind === "hup") report.hupped.push(a);
    else if (kind === "started") report.started.push(a);
    else if (kind === "exited") report.exited.push(a);
    else if (kind === "restart-pending") report.pending.push(a);
    else if (kind === "state") report.states[a] = { active: rest[0], sub: rest[1], restarts: Number(rest[2]) || 0 };
    else if (kind === "journal" && a) report.journal.push(redactTokens([a, ...rest].join(" ")));
    else if (kind === "facts") report.facts = parseFacts([a, ...rest].join(" "));
  }
  return report;
}

// A JWT is three base64url parts, the first an encoded JSON object ("eyJ"): nothing else in a log looks like that.
const JWT_RE = /eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*/g;
/** The journal goes into status and events, which many can read: a token an exporter logged must not. */
export const redactTokens = (line: string) => line.replace(JWT_RE, "<redacted>");

export function parseRemoveOutput(stdout: string, stderr: string, exitCode: number): RemoveReport {
  const { lines, errors } = scan(stdout, stderr, exitCode);
  const report: RemoveReport = { ok: errors.length === 0, removed: [], stopped: [], reloaded: false, errors };
  for (const [kind, a, b] of lines) {
    if (kind === "removed" && a !== "nothing") report.removed.push({ kind: a, name: b });
    else if (kind === "stopped") report.stopped.push(a);
    else if (kind === "reloaded") report.reloaded = true;
  }
  return report;
}

const RUNNING = new Set(["active", "activating", "reloading"]);

export function parseInspectOutput(stdout: string, stderr: string, exitCode: number): HostInspection {
  const { lines, errors } = scan(stdout, stderr, exitCode);
  const out: HostInspection = { ok: errors.length === 0, diskFreeKiB: {}, instances: [], errors };
  const byName = new Map<string, InspectedInstance>();
  const instance = (name: string) => {
    let i = byName.get(name);
    if (!i) {
      i = { name, files: [], ownerMismatch: false, containers: [], volume: false, diskVolume: false };
      byName.set(name, i);
    }
    return i;
  };
  const units: Record<string, { load: string; active: string; sub: string }> = {};
  const modes = new Map<string, string>();
  const digests = new Map<string, string>();
  const records = new Map<string, string>();
  const loaded = new Map<string, string>();
  for (const [kind, ...w] of lines) {
    if (kind === "facts") out.facts = parseFacts(w.join(" "));
    else if (kind === "systemd" && /^[0-9]+/.test(w[0] ?? "")) out.systemdVersion = parseInt(w[0], 10);
    else if (kind === "generator" && w[0] !== "none") out.generator = w[0];
    else if (kind === "disk" && w.length >= 2) out.diskFreeKiB[w[0]] = Number(w[1]);
    else if (kind === "file") {
      const [fileKind, name, path, ...owner] = w;
      const i = instance(name);
      i.files.push({ kind: fileKind as InspectedFile["kind"], path });
      const kv = Object.fromEntries(owner.map((p) => p.split("=", 2) as [string, string]));
      if (i.uid === undefined) {
        Object.assign(i, { namespace: kv.namespace, set: kv.set, uid: kv.uid });
        if (kv["set-uid"]) i.setUid = kv["set-uid"];
        if (kv.controller) i.controller = kv.controller;
        if (kv.reclaim === "Retain") i.retain = true;
      } else if (i.uid !== kv.uid || i.namespace !== kv.namespace || i.controller !== kv.controller) {
        i.ownerMismatch = true;
      }
    } else if (kind === "mode") modes.set(w[0], w[1]);
    else if (kind === "sha256") digests.set(w[0], w[1]);
    else if (kind === "unit") units[w[0]] = { load: w[1], active: w[2], sub: w[3] };
    else if (kind === "record") records.set(w[0], w[1] ?? "");
    else if (kind === "loaded") loaded.set(w[0], w[1]);
    else if (kind === "container") {
      instance(w[0]).containers.push({ name: w[1], state: w[2], uid: w[3], ...w[4] ? { controller: w[4] } : {} });
    } else if (kind === "volume") {
      const disk = w[0].endsWith("-disk");
      const i = instance(w[0].replace(/^jumpstarter-/, "").replace(/-(shared|disk)$/, ""));
      if (disk) i.diskVolume = true;
      else i.volume = true;
      if (i.uid === undefined && w[1]) {
        Object.assign(i, { uid: w[1], namespace: w[2] || undefined, ...w[3] ? { controller: w[3] } : {} });
      }
    }
  }
  for (const i of byName.values()) {
    for (const f of i.files) {
      if (modes.has(f.path)) f.mode = modes.get(f.path);
      if (digests.has(f.path)) f.sha256 = digests.get(f.path);
    }
    i.runtime = units[`${i.name}-runtime.service`];
    i.exporter = units[`${i.name}-exporter.service`];
    // as the apply script's `outdated`: a unit without a record is adopted by the next apply, not owed anything
    const owed = [`${i.name}-runtime.service`, `${i.name}-exporter.service`].filter((u) =>
      RUNNING.has(units[u]?.active ?? "") && records.has(u) && records.get(u) !== loaded.get(u)
    );
    if (owed.length) i.outdated = owed;
    if (i.uid === undefined) {
      const labelled = i.containers.find((c) => c.uid);
      i.uid = labelled?.uid;
      if (labelled?.controller) i.controller = labelled.controller;
    }
  }
  out.instances = [...byName.values()].sort((a, b) => a.name.localeCompare(b.name));
  return out;
}
