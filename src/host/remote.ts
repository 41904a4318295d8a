/**
 * The three things we do on a lab host, each one POSIX sh script sent over one SSH session (`sh -s`, the script on
 * stdin, so tokens never appear in a process list), and the parsers of what they print. Pure: building and parsing
 * strings only; ssh.ts runs them. The scripts' steps are scripts/*.sh (lib.sh shared by all); this side writes only
 * their headers, the values they work on.
 *
 * Output protocol: every line meant for us starts with `qsp `; anything else (stray tool output) is ignored.
 *   qsp changed PATH                       a file or link was (re)written
 *   qsp volume-created VOLUME
 *   qsp disk-created IMAGE BYTES | qsp disk-grown IMAGE BYTES | qsp disk-grow-pending IMAGE   /disk's image
 *   qsp reloaded                           systemctl daemon-reload ran
 *   qsp restarted UNIT | qsp hup UNIT | qsp started UNIT
 *   qsp exited UNIT                        the exporter ended by itself (lease over) and was left stopped
 *   qsp restart-pending UNIT               UNIT runs an older definition than its quadlet (deferRestart)
 *   qsp state UNIT ACTIVE SUB RESTARTS     systemd ActiveState, SubState, NRestarts once the apply queued its jobs
 *   qsp journal LINE                       the exporter's last journal lines, when it is down, restarted or started
 *   qsp removed WHAT NAME | qsp removed nothing | qsp stopped UNIT
 *   qsp file KIND NAME PATH OWNER | qsp mode PATH MODE | qsp sha256 PATH HASH | qsp unit UNIT LOAD ACTIVE SUB
 *     | qsp job UNIT TYPE | qsp record UNIT HASH | qsp loaded UNIT HASH | qsp container ... | qsp volume ...  what inspect found
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
  EXEC_IN_EXPORTER_IMAGE,
  EXPORTER_UID,
  LAUNCHER_CACHE,
  MANAGED_HEADER,
  OWNER_PREFIX,
  QUADLET_DIR,
  quadletPath,
  type RenderedInstance,
  STAGE_SCRIPT,
  stageContainer,
  STAGED_NAME,
  volumeName,
} from "./render.ts";
import { MIN_PODMAN, podmanVersionParts, quadletDialect } from "./quadlet_dialect.ts";
import { factsWire, type HostFacts, kvmAccess, octalMode, parseFacts } from "./host_facts.ts";
import { APPLY_SH, INSPECT_SH, LIB_SH, REMOVE_SH, STAGE_SH } from "./script_text.ts";

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

/** Where the scripts keep what they know about the host between runs; in /run, as a reboot starts every unit anew. */
export const RUN_DIR = `/run/${PROVISIONER}`;
/**
 * The lock every apply and remove on a host holds while it looks at, writes or removes files and queues systemd jobs:
 * shared, and exclusive for a daemon-reload (lib.sh lock_host).
 */
export const HOST_LOCK = `${RUN_DIR}/lock`;
/** An instance's own lock, held with the shared host lock: one script at a time for a name. */
export const nameLockPath = (name: string) => `${RUN_DIR}/${name}.lock`;
/**
 * How long a script waits for the host lock before refusing with host-busy. Holders keep it for file writes, one
 * daemon-reload and queued (not awaited) systemd jobs: seconds. Well inside the SSH command timeout (120 s).
 */
export const LOCK_WAIT_SECONDS = 60;
/**
 * How long a remove that owes a daemon-reload waits for the other removes under way on its host to owe theirs, so that
 * one reload serves them all: a unit's stop takes a few hundred milliseconds, and one that takes longer (a container
 * that ignores SIGTERM for its 10 s) is not waited for.
 */
export const REMOVE_JOIN_SECONDS = 3;
/** Holds the hash of the service definition a unit was last started with by an apply (its `started_with`). */
export const startedPath = (unit: string) => `${RUN_DIR}/${unit}.started`;

const JOURNAL_LINES = 5;
export const sha256 = (s: string) => createHash("sha256").update(s, "utf8").digest("hex");

/** `NAME='value'` lines: the values reach the script as data, single-quoted, never as code. */
function assignments(values: Record<string, string | number>): string {
  return Object.entries(values).map(([k, v]) => `${k}=${shQuote(String(v))}`).join("\n");
}

// What every script reads from its header besides its own values: the names and limits defined on this side.
const CONSTANTS = assignments({
  PROVISIONER,
  CONTROLLER_LABEL,
  EXPORTER_UID,
  OWNER_PREFIX,
  RUN_DIR,
  HOST_LOCK,
  LOCK_WAIT_SECONDS,
  GENERATORS: GENERATORS.join(" "),
  QUADLET_DIR,
  CONFIG_DIR,
  DISK_DIR,
  MIN_MAJOR: MIN_PODMAN[0],
  MIN_MINOR: MIN_PODMAN[1],
  JOURNAL_LINES,
});

/** The text sent to the host: a comment naming it, its values, lib.sh, then the script's own steps. */
function script(title: string, values: Record<string, string | number>, body: string): string {
  return `# ${title}\n${CONSTANTS}\n${assignments(values)}\n${LIB_SH}${body}`;
}

/**
 * The host's copy of scripts/stage.sh (render.ts STAGE_SCRIPT), which the runtime quadlets' ExecStartPre runs: its
 * constants as a header, then its steps. The same text for every instance, so the applies on a host agree on it.
 */
export const STAGE_SCRIPT_TEXT = `#!/bin/sh\n${MANAGED_HEADER}\n${
  assignments({ LAUNCHERS: LAUNCHER_CACHE, EXEC_IN_IMAGE: EXEC_IN_EXPORTER_IMAGE, STAGED: STAGED_NAME })
}\n${STAGE_SH}`;
const STAGE_VALUES = {
  STAGE_SCRIPT,
  STAGE_HASH: sha256(STAGE_SCRIPT_TEXT),
  STAGE_SH: Buffer.from(STAGE_SCRIPT_TEXT, "utf8").toString("base64"),
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
}

/**
 * Makes the host run this instance, idempotently: files are rewritten only when their content or mode differs, and
 * only what a change affects is restarted (runtime quadlet: both units; exporter quadlet: the exporter; config only:
 * SIGHUP to the exporter, which reloads after its current lease while QEMU keeps running).
 */
export function applyScript(r: RenderedInstance, opts: ApplyOptions): string {
  const rtQuadlet = quadletPath(r.units.runtime.replace(/\.service$/, ""));
  const exQuadlet = quadletPath(r.units.exporter.replace(/\.service$/, ""));
  const files = r.files.map((f) => {
    const kind = f.path === rtQuadlet ? "runtime" : f.path === exQuadlet ? "exporter" : "config";
    const content = Buffer.from(f.content, "utf8").toString("base64");
    return [kind, f.secret ? 1 : 0, f.mode.toString(8), f.owner, sha256(f.content), content, f.path, ...f.links]
      .join(" ");
  });
  const access = kvmAccess(r.facts?.kvm ?? null);
  return script(`${r.name}: apply`, {
    NAME: r.name,
    NAME_LOCK: nameLockPath(r.name),
    UID_: r.uid,
    NAMESPACE: r.namespace,
    CONTROLLER: r.controller ?? "",
    RT: r.units.runtime,
    EX: r.units.exporter,
    RTQ: rtQuadlet,
    EXQ: exQuadlet,
    VOLUME: r.volume,
    DISK: r.disk.volume,
    IMG: r.disk.image,
    DISK_BYTES: r.disk.bytes,
    DISK_MIB: r.disk.bytes / 2 ** 20,
    // left by an older version of this script for a restart it deferred: the record a unit is adopted with (adopt)
    PENDING: pendingPath(r.uid),
    RENDERED_FACTS: factsWire(r.facts),
    KVM_REQUIRED: opts.kvmRequired ? 1 : 0,
    KVM_DENIED_MODE: access.kind === "denied" ? octalMode(access.mode) : "",
    KVM_GID: access.kind === "denied" ? access.gid : "",
    DEVICES: r.devices.join("\n"),
    KEEP_EXITED: opts.keepExited ? 1 : 0,
    DEFER_RESTART: opts.deferRestart ? 1 : 0,
    FILES: files.join("\n"),
    ...STAGE_VALUES,
  }, APPLY_SH);
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
  const units = [`${name}-runtime.service`, `${name}-exporter.service`];
  return script(`${name}: remove`, {
    UID_: opts.uid ?? "",
    NAME_LOCK: nameLockPath(name),
    RT: units[0],
    EX: units[1],
    CONTAINERS: [`${name}-exporter`, `${name}-runtime`, stageContainer(name)].join(" "),
    FILES: [
      quadletPath(`${name}-runtime`),
      quadletPath(`${name}-exporter`),
      configPath(name),
      `${configMountDir(name)}/${name}.yaml`,
    ].join("\n"),
    MOUNT_DIR: configMountDir(name),
    VOLUME: volumeName(name),
    DISK: diskVolumeName(name),
    IMG: diskImagePath(name),
    STARTED: units.map(startedPath).join(" "),
    PENDING: opts.uid ? pendingPath(opts.uid) : "",
    REMOVE_JOIN_SECONDS,
  }, REMOVE_SH);
}

/**
 * One round trip that describes the host and every instance we manage on it, including half-deployed leftovers: a
 * config without quadlets, a container or volume without files.
 */
export function inspectScript(): string {
  return script("inspect", { SCOPE: "all" }, INSPECT_SH);
}

/**
 * The same script asked only for the units of every instance and the jobs systemd has queued for them, once no start
 * of theirs is under way or `waitMs` (rounded up to a tenth of a second) has passed.
 */
export function unitsScript(waitMs = 0): string {
  return script("units", { SCOPE: "units", WAIT_TICKS: Math.ceil(waitMs / 100) }, INSPECT_SH);
}

// ---------------------------------------------------------------- parsing

export type ErrorCode =
  | "missing-tool"
  | "host-busy"
  | "podman-too-old"
  | "not-owned"
  | "owner-conflict"
  | "removed-meanwhile"
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
  runtime?: InspectedUnit;
  exporter?: InspectedUnit;
  /** Its units that run a definition older than the one systemd has loaded for them: each owes a restart. */
  outdated?: string[];
  containers: { name: string; state: string; uid: string; controller?: string }[];
  /** The shared volume exists. */
  volume: boolean;
  /** The /disk volume exists. */
  diskVolume: boolean;
}

export interface InspectedUnit {
  load: string;
  active: string;
  sub: string;
  /** The type of the job systemd has queued for it (start, restart, stop...), if any. */
  job?: string;
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

/** What a units-only inspection found: each unit of ours systemd knows, by name, with its queued job. */
export interface HostUnits {
  ok: boolean;
  units: Record<string, InspectedUnit>;
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

/** The `unit` lines by unit name, each with the type of the job a `job` line gives it. */
function unitsIn(lines: string[][]): Record<string, InspectedUnit> {
  const units: Record<string, InspectedUnit> = {};
  for (const [kind, ...w] of lines) if (kind === "unit") units[w[0]] = { load: w[1], active: w[2], sub: w[3] };
  for (const [kind, u, job] of lines) if (kind === "job" && units[u]) units[u].job = job;
  return units;
}

export function parseUnitsOutput(stdout: string, stderr: string, exitCode: number): HostUnits {
  const { lines, errors } = scan(stdout, stderr, exitCode);
  return { ok: errors.length === 0, units: unitsIn(lines), errors };
}

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
  const units = unitsIn(lines);
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
