/**
 * One ExporterSet, from its cached state to Exporters in the API and instances on its lab host. Every step reads the
 * world and does what is missing, so a reconcile can be killed anywhere and the next one finishes the job.
 *
 * Order of work: finish Exporters being deleted (tear down on the host, then drop our finalizer); deploy or refresh
 * every live Exporter that has credentials; plan the count; create, re-enable, drain or delete; write status.
 */
import { Buffer } from "node:buffer";
import { createHash } from "node:crypto";
import type {
  ConfigMap,
  Exporter,
  ExporterSet,
  ExporterSetStatus,
  Lease,
  Secret,
  VirtualTargetClass,
} from "../api/types.ts";
import { EXPORTER_SETS, EXPORTERS, SECRETS } from "../kube/resources.ts";
import { isConflict, isNotFound, type KubeClient } from "../kube/client.ts";
import type { Informer } from "../kube/informer.ts";
import type { Recorder } from "../kube/events.ts";
import type { Outcome } from "../kube/queue.ts";
import type { Logger } from "../observe/log.ts";
import type { Metrics } from "../observe/metrics.ts";
import { instanceOf, renderInstance } from "../host/render.ts";
import type { ApplyOutcome, HostOps } from "../host/lab.ts";
import { SshError } from "../host/ssh.ts";
import { fieldErrorLine, type InstanceParams, resolveParams } from "./params.ts";
import {
  decodeSecretValue,
  type LabTarget,
  PINNED_HOST_KEYS_KEY,
  PINNED_HOST_KEYS_SECRET,
  sshTarget,
} from "./credentials.ts";
import { type ExporterView, type Plan, plan, selectorMatches, selectorString, withDefaults } from "./plan.ts";
import { computeStatus, type ExporterState, type Problem, statusChanged, type StatusInput } from "./status.ts";

export const FINALIZER = "qemu-ssh.jumpstarter.dev/teardown";
export const HOST_ANNOTATION = "qemu-ssh.jumpstarter.dev/host";
/** Where an instance was deployed (user@host:port), so teardown finds it even after the set's host changed. */
export const TARGET_ANNOTATION = "qemu-ssh.jumpstarter.dev/ssh-target";
export const SET_LABEL = "qemu-ssh.jumpstarter.dev/exporter-set";
/** Set to "Retain" when the class's reclaimPolicy is Retain: the instance outlives the deletion of its set. */
export const RECLAIM_ANNOTATION = "qemu-ssh.jumpstarter.dev/reclaim-policy";
const DEFAULT_CA_CONFIGMAP = { name: "jumpstarter-service-ca-cert", key: "ca.crt" };

export interface Caches {
  sets: Informer<ExporterSet>;
  classes: Informer<VirtualTargetClass>;
  exporters: Informer<Exporter>;
  leases: Informer<Lease>;
  secrets: Informer<Secret>;
  configMaps: Informer<ConfigMap>;
}

export interface Context {
  client: KubeClient;
  caches: Caches;
  hosts: HostOps;
  recorder: Recorder;
  log: Logger;
  metrics: Metrics;
  provisioner: string;
  now: () => Date;
  /** Re-apply every instance at least this often, to repair drift on the host. */
  resyncMs: number;
  /** Per-process memory of what was applied, so an unchanged instance is not re-sent on every event. */
  applied: Map<string, AppliedState>;
  /** Exporters created but not yet seen in the cache, per set uid (avoids double creation). */
  expectations: Map<string, { names: Set<string>; until: number }>;
  /** The status last written per set key ("ns/name"), for the set of that uid (see lastStatus). */
  statuses: Map<string, { uid: string; status: ExporterSetStatus }>;
  /** Per Exporter uid: how often its exporter was found down without its lease ending, and when to start it next. */
  exporterFailures: Map<string, ExporterFailures>;
}

export interface ExporterFailures {
  count: number;
  /** When we last started it again. */
  at: number;
  /** Not started again before this (back-off). */
  nextAt: number;
}

export interface AppliedState {
  hash: string;
  at: number;
  host: string;
  ready: boolean;
  /** The exporter ended by itself and was left down (waiting for its lease to end, or for the back-off). */
  exited: boolean;
  /** Why the exporter keeps going down, with its last journal lines; undefined while it is healthy. */
  failing?: string;
  /** Jumpstarter's offline report (see offlineMarker) as it stood when this apply ran. */
  offline?: string;
}

const split = (key: string) => {
  const i = key.indexOf("/");
  return [key.slice(0, i), key.slice(i + 1)] as const;
};

export function ownerSetName(e: Exporter): string | undefined {
  return e.metadata.ownerReferences?.find((o) => o.controller && o.kind === "ExporterSet")?.name;
}

export async function reconcile(ctx: Context, key: string): Promise<Outcome> {
  const [ns, name] = split(key);
  const set = ctx.caches.sets.get(ns, name);
  const named = ctx.caches.exporters.list(ns).filter((e) => ownerSetName(e) === name);
  const isMine = (e: Exporter) => !!set && e.metadata.ownerReferences!.some((o) => o.uid === set.metadata.uid);
  // Exporters of a deleted set, including an earlier incarnation of a set re-created under the same name.
  const stale = named.filter((e) => !isMine(e));
  const orphanOutcome = stale.length ? await orphaned(ctx, ns, stale) : {};
  if (!set) {
    ctx.statuses.delete(key);
    return orphanOutcome;
  }
  const owned = named.filter(isMine);
  const cls = ctx.caches.classes.get(ns, set.spec.virtualTargetClassName);
  if (cls && cls.spec.provisioner !== ctx.provisioner) return orphanOutcome; // another provisioner's set
  const old = lastStatus(ctx, key, set);
  if (!cls) {
    await writeStatus(
      ctx,
      key,
      set,
      old,
      computeStatus({ ...statusBasics(ctx, set, old), classMissing: set.spec.virtualTargetClassName }),
    );
    return orphanOutcome;
  }

  const { params, target, problems } = configuration(ctx, set, cls);
  // 1. Exporters being deleted: tear down on the host first (all at once), then let them go.
  const live = owned.filter((e) => !e.metadata.deletionTimestamp);
  const finalized = await Promise.all(
    owned.filter((e) => e.metadata.deletionTimestamp).map((e) => finalize(ctx, set, e, target)),
  );
  problems.push(...finalized.filter((p): p is Problem => p !== undefined));
  // 2. Deploy or refresh what has credentials.
  const { states, waiting } = params && target
    ? await deployAll(ctx, set, cls, live, params, target, problems)
    : { states: new Map<string, AppliedState | undefined>(), waiting: [] };
  // 3. Plan and act.
  const views = exporterViews(ctx, ns, live);
  const pending = pendingCreates(ctx, set, live);
  const p = plan({
    spec: set.spec,
    exporters: [...views, ...pending.map(pendingView)],
    pendingDemand: pendingDemand(ctx, set),
    waitForFirstConsumer: cls.spec.bindingMode === "WaitForFirstConsumer",
    surplusSince: old?.surplusSince,
    now: ctx.now(),
  });
  if (!params || !target) p.create = 0; // nothing can be deployed until the configuration is fixed
  await act(ctx, set, p);
  // 4. Status.
  const exporterStates: ExporterState[] = live.map((e, i) => ({
    name: e.metadata.name!,
    enabled: views[i].enabled && !p.drain.includes(views[i].name),
    leased: views[i].leased,
    ready: lastKnown(ctx, states, e.metadata.uid!)?.ready ?? false,
    online: onlineReport(e),
  }));
  await writeStatus(
    ctx,
    key,
    set,
    old,
    computeStatus({
      ...statusBasics(ctx, set, old),
      desired: p.desired,
      wanted: p.wanted,
      exporters: exporterStates,
      waitingForCredentials: waiting,
      problems,
      surplusSince: p.surplusSince,
    }),
  );
  return {
    requeueAfterMs: Math.min(
      retryAfterMs(ctx, problems),
      p.requeueAfterMs ?? Infinity,
      orphanOutcome.requeueAfterMs ?? Infinity,
      backoffEndsInMs(ctx, live, states),
    ),
  };
}

/** When the first exporter left down for its back-off may be started again. */
function backoffEndsInMs(ctx: Context, live: Exporter[], states: Map<string, AppliedState | undefined>): number {
  const now = ctx.now().getTime();
  const waits = live.map((e) => {
    const f = ctx.exporterFailures.get(e.metadata.uid!);
    return states.get(e.metadata.uid!)?.exited && f ? Math.max(1_000, f.nextAt - now) : Infinity;
  });
  return Math.min(Infinity, ...waits);
}

/** The parts of the status input that do not depend on what this reconcile did. */
function statusBasics(ctx: Context, set: ExporterSet, old: ExporterSetStatus | undefined): StatusInput {
  const s = withDefaults(set.spec);
  return {
    generation: set.metadata.generation,
    old,
    // taken when the status is computed, not when the reconcile began: a deploy can take seconds
    now: ctx.now(),
    selector: selectorString(set.spec.template?.metadata?.labels ?? set.spec.selector?.matchLabels ?? {}),
    minReplicas: s.minReplicas,
    minAvailableReplicas: s.minAvailableReplicas,
    maxReplicas: s.maxReplicas,
    exporters: [],
    waitingForCredentials: [],
    problems: [],
  };
}

/** The instance parameters and SSH target of the set, or the problems that keep it from having them. */
function configuration(
  ctx: Context,
  set: ExporterSet,
  cls: VirtualTargetClass,
): { params?: InstanceParams; target?: LabTarget; problems: Problem[] } {
  const ns = set.metadata.namespace!;
  const resolved = resolveParams(cls, set);
  if (!resolved.ok) {
    const message = resolved.errors.map(fieldErrorLine).join("; ");
    ctx.recorder.event(set, "Warning", "InvalidParameters", message);
    return { problems: [{ reason: "InvalidParameters", message }] };
  }
  for (const w of resolved.warnings) ctx.recorder.event(set, "Warning", "UnknownParameter", w);
  const cred = sshTarget(
    cls,
    resolved.params,
    ctx.caches.secrets.get(ns, cls.spec.credentialsSecretRef?.name ?? ""),
    ctx.caches.secrets.get(ns, PINNED_HOST_KEYS_SECRET),
  );
  if (!cred.ok) {
    ctx.recorder.event(set, "Warning", cred.problem.reason, cred.problem.message);
    return { params: resolved.params, problems: [cred.problem] };
  }
  return { params: resolved.params, target: cred.target, problems: [] };
}

/** Deploys every live Exporter that has its credentials, in parallel; failures become problems. */
async function deployAll(
  ctx: Context,
  set: ExporterSet,
  cls: VirtualTargetClass,
  live: Exporter[],
  params: InstanceParams,
  target: LabTarget,
  problems: Problem[],
): Promise<{ states: Map<string, AppliedState | undefined>; waiting: string[] }> {
  const waiting = live.filter((e) => !e.status?.credential?.name || !e.status?.endpoint).map((e) => e.metadata.name!);
  const results = await Promise.all(live.map(async (e) => {
    if (waiting.includes(e.metadata.name!)) return undefined;
    try {
      return await deploy(ctx, set, cls, e, params, target);
    } catch (err) {
      if (err instanceof LeftBehind && !isLeased(e, ctx.caches.leases.list(e.metadata.namespace))) {
        await replaceLeftBehind(ctx, set, e, err);
        return undefined;
      }
      const p = { reason: problemReason(err), message: `${e.metadata.name}: ${errorText(err)}` };
      problems.push(p);
      ctx.recorder.event(e, "Warning", p.reason, p.message);
      ctx.log.warn("deploy failed", { exporterSet: set.metadata.name, exporter: e.metadata.name, error: p.message });
      return undefined;
    }
  }));
  for (const r of results) if (r?.failing) problems.push({ reason: "ExporterFailing", message: r.failing });
  return { states: new Map(live.map((e, i) => [e.metadata.uid!, results[i]])), waiting };
}

function exporterViews(ctx: Context, ns: string, live: Exporter[]): ExporterView[] {
  const leases = ctx.caches.leases.list(ns);
  return live.map((e) => ({
    name: e.metadata.name!,
    enabled: e.spec?.enabled !== false,
    leased: isLeased(e, leases),
    deleting: false,
    leaseEnded: leaseState(e, leases) === "ended",
    createdAt: e.metadata.creationTimestamp ?? "",
  }));
}

/** An Exporter just created but not in the cache yet: counts as a fresh, idle one. */
const pendingView = (name: string): ExporterView => ({
  name,
  enabled: true,
  leased: false,
  deleting: false,
  leaseEnded: false,
  createdAt: "",
});

/** Pending Leases (not bound to any exporter) whose selector matches the set's template labels. */
function pendingDemand(ctx: Context, set: ExporterSet): number {
  const labels = set.spec.template?.metadata?.labels ?? {};
  return ctx.caches.leases.list(set.metadata.namespace).filter((l) =>
    !l.status?.ended && !l.status?.exporterRef && !l.spec?.exporterRef && selectorMatches(l.spec?.selector, labels)
  ).length;
}

async function act(ctx: Context, set: ExporterSet, p: Plan): Promise<void> {
  const ns = set.metadata.namespace!;
  await createExporters(ctx, set, p.create);
  for (const n of p.enable) await setEnabled(ctx, set, ns, n, true);
  for (const n of p.drain) await setEnabled(ctx, set, ns, n, false);
  for (const n of p.delete) {
    await ctx.client.delete(EXPORTERS, ns, n);
    ctx.recorder.event(set, "Normal", "DeletingExporter", `deleting exporter ${n}`);
  }
}

/** Jumpstarter's view: true = online, false = reported offline, undefined = not reported yet. */
function onlineReport(e: Exporter): boolean | undefined {
  const online = e.status?.conditions?.find((c) => c.type === "Online");
  return online ? online.status === "True" : undefined;
}

/** Problems that fix themselves (a host back online) are retried sooner than those that wait for a person. */
const TRANSIENT_PROBLEMS = new Set(["HostUnreachable", "TeardownFailed", "MoveBlocked"]);
const TRANSIENT_RETRY_MS = 10_000;
const PROBLEM_RETRY_MS = 30_000;

function retryAfterMs(ctx: Context, problems: Problem[]): number {
  if (problems.some((p) => TRANSIENT_PROBLEMS.has(p.reason))) return TRANSIENT_RETRY_MS;
  return problems.length ? PROBLEM_RETRY_MS : ctx.resyncMs;
}

/**
 * The state of an instance as this reconcile found it; when it could not even try (the parameters or credentials are
 * broken), as the last apply found it: those instances keep running with their last good configuration.
 */
function lastKnown(
  ctx: Context,
  states: Map<string, AppliedState | undefined>,
  uid: string,
): AppliedState | undefined {
  return states.has(uid) ? states.get(uid) : ctx.applied.get(uid);
}

// ---------------------------------------------------------------- deploy

async function deploy(
  ctx: Context,
  set: ExporterSet,
  cls: VirtualTargetClass,
  e: Exporter,
  params: InstanceParams,
  target: LabTarget,
): Promise<AppliedState> {
  const ns = set.metadata.namespace!;
  const name = e.metadata.name!;
  const where = targetString(target);
  const previous = e.metadata.annotations?.[TARGET_ANNOTATION];
  if (previous && previous !== where) {
    // The set now points at another host: remove the instance from the old one before deploying anew.
    await ctx.hosts.remove(parseTarget(previous, target), name).catch((err) => {
      throw new LeftBehind(previous, err);
    });
    ctx.applied.delete(e.metadata.uid!);
  }
  // The target is recorded before anything reaches the host, so that teardown finds a half-done deploy; the host
  // annotation (what people read) only once the instance is really there.
  if (previous !== where) await annotate(ctx, e, { [TARGET_ANNOTATION]: where, [HOST_ANNOTATION]: null });

  const token = decodeSecretValue(ctx.caches.secrets.get(ns, e.status!.credential!.name), "token");
  if (!token) throw new Error(`Secret ${ns}/${e.status!.credential!.name} has no token yet`);
  const instance = instanceOf(set, params, {
    name,
    uid: e.metadata.uid!,
    endpoint: e.status!.endpoint!,
    token,
    caBundle: caBundle(ctx, cls),
    retain: cls.spec.reclaimPolicy === "Retain",
  });
  const rendered = renderInstance(instance);
  const hash = createHash("sha256").update(JSON.stringify(rendered)).update(JSON.stringify(target)).digest("hex");
  const last = ctx.applied.get(e.metadata.uid!);
  const now = ctx.now().getTime();
  const offline = offlineMarker(e);
  if (last && stillApplied(last, hash, offline, now - last.at < ctx.resyncMs)) return last;

  const lease = leaseState(e, ctx.caches.leases.list(ns));
  const failures = ctx.exporterFailures.get(e.metadata.uid!);
  // An exporter that exited while a lease names it is left down: Jumpstarter is about to end that lease, and the plan
  // then replaces the instance. With no lease it should not have exited: it is started again, with back-off.
  const holdExited = instance.exitOnLeaseEnd && (lease !== "none" || (failures !== undefined && now < failures.nextAt));
  const started = performance.now();
  const report = await ctx.hosts.apply(target, rendered, { kvmRequired: params.runtime.kvm, keepExited: holdExited });
  ctx.metrics.deploySeconds.observe({ host: target.host }, (performance.now() - started) / 1000);
  if (report.errors.length) throw new DeployError(report.errors.join("; "), report.errorCode);
  if (report.changed.length && !last) {
    ctx.recorder.event(
      e,
      "Normal",
      "Deployed",
      `deployed to ${target.host} (units ${rendered.units.runtime}, ${rendered.units.exporter})`,
    );
  } else if (report.changed.length) {
    ctx.recorder.event(e, "Normal", "Updated", `updated on ${target.host}: ${report.changed.join(", ")}`);
  }
  const state: AppliedState = {
    hash,
    at: now,
    host: target.host,
    ready: report.ready,
    exited: report.exited,
    failing: trackFailures(ctx, e, report, last !== undefined, now),
    offline,
  };
  ctx.applied.set(e.metadata.uid!, state);
  const reclaim = instance.retain ? "Retain" : undefined;
  const annotations = e.metadata.annotations ?? {};
  if (
    annotations[HOST_ANNOTATION] !== target.host || previous !== where || annotations[RECLAIM_ANNOTATION] !== reclaim
  ) {
    await annotate(ctx, e, { [HOST_ANNOTATION]: target.host, [RECLAIM_ANNOTATION]: reclaim ?? null });
  }
  return state;
}

/** Starts counted before the set reports the exporter as failing; systemd's own restarts after crashes count too. */
const FAILING_AFTER = 3;
const BACKOFF_FIRST_MS = 10_000;
const BACKOFF_MAX_MS = 5 * 60_000;
/** Up this long since we last had to start it: the exporter is healthy again and its count starts over. */
const HEALTHY_AFTER_MS = 10 * 60_000;

/**
 * Counts the starts of an exporter that went down by itself (not the first start, not a restart for a change) and
 * returns the problem to report once they pile up. Exit status is not evidence of anything: a crash and a clean exit
 * without a lease end are the same failure to the set.
 */
function trackFailures(
  ctx: Context,
  e: Exporter,
  report: ApplyOutcome,
  deployedBefore: boolean,
  now: number,
): string | undefined {
  const uid = e.metadata.uid!;
  let f = ctx.exporterFailures.get(uid);
  if (report.startedExporter && deployedBefore) {
    const count = (f?.count ?? 0) + 1;
    f = { count, at: now, nextAt: now + Math.min(BACKOFF_FIRST_MS * 2 ** (count - 1), BACKOFF_MAX_MS) };
    ctx.exporterFailures.set(uid, f);
    ctx.log.warn("exporter was down, started it again", { exporter: e.metadata.name, times: count });
  } else if (f && report.ready && now - f.at > HEALTHY_AFTER_MS) {
    ctx.exporterFailures.delete(uid);
    f = undefined;
  }
  // systemd's count also grows with every reload an exporter does by restarting (SIGHUP makes `jmp run` exit), so it
  // says "failing" only while the exporter is down
  const times = Math.max(f?.count ?? 0, report.ready ? 0 : report.exporterRestarts);
  if (times < FAILING_AFTER) return undefined;
  const lines = report.journal.length ? `; last lines: ${report.journal.join(" | ")}` : "";
  return `${e.metadata.name}: the exporter went down ${times} times without its lease ending; restarting it with ` +
    `back-off (journalctl -u ${e.metadata.name}-exporter on the host)${lines}`;
}

/**
 * Whether the last apply still describes the host, so this reconcile need not send anything: same content, found
 * healthy, recent, and Jumpstarter has not reported the exporter gone since. That report is the prompt sign of an
 * exporter that exited after its lease (ExitAndReplace) or crashed; it is acted on once per report, so an exporter
 * that stays offline for other reasons (it cannot reach Jumpstarter) is not re-applied on every event.
 */
function stillApplied(last: AppliedState, hash: string, offline: string | undefined, recent: boolean): boolean {
  return last.hash === hash && last.ready && recent && (offline === undefined || offline === last.offline);
}

/** Jumpstarter's current "offline" report on the Exporter, as a value that changes with each new report. */
function offlineMarker(e: Exporter): string | undefined {
  const online = e.status?.conditions?.find((c) => c.type === "Online");
  if (online?.status === "False") return `Online=False@${online.lastTransitionTime ?? ""}`;
  if (e.status?.exporterStatus === "Offline") return `Offline@${e.status.lastSeen ?? ""}`;
  return undefined;
}

class DeployError extends Error {
  constructor(message: string, readonly code?: string) {
    super(message);
  }
}

/** The set moved to another host, and the instance could not be removed from the one it was on. */
class LeftBehind extends Error {
  constructor(readonly where: string, readonly reason: unknown) {
    super(`could not remove it from its previous host ${where}: ${errorText(reason)}`);
  }
}

function problemReason(err: unknown): string {
  if (err instanceof LeftBehind) return "MoveBlocked";
  if (err instanceof DeployError && err.code === "kvm-missing") return "KvmMissing";
  const kind = (err as { kind?: string })?.kind;
  if (kind === "hostkey") return "HostKeyRejected";
  if (kind === "auth") return "AuthenticationFailed";
  // closed: the connection died under a running command, which is what a host that went away looks like
  if (kind === "connect" || kind === "timeout" || kind === "closed") return "HostUnreachable";
  return "DeployFailed";
}

/**
 * An instance stuck on a host the set left (usually because that host is down): the Exporter is deleted, so its
 * finalizer removes the old instance whenever that host is back, and a fresh Exporter starts on the new host now
 * instead of the set waiting for the old one. A new Exporter, not the same one moved: the old instance may come back
 * to life with the old identity until it is removed.
 */
async function replaceLeftBehind(ctx: Context, set: ExporterSet, e: Exporter, err: LeftBehind): Promise<void> {
  await ctx.client.delete(EXPORTERS, e.metadata.namespace, e.metadata.name!);
  ctx.recorder.event(
    set,
    "Warning",
    "MoveBlocked",
    `replacing ${e.metadata.name}: ${err.message}; it is removed there once that host is reachable`,
  );
}

/**
 * An error's message for status and events. While the SSH pool backs off it rethrows the last failure with a
 * countdown ("next attempt allowed in 7s"); that text changes on every reconcile and would make a new Event object and
 * a status write each time, so the underlying failure is reported instead.
 */
function errorText(e: unknown): string {
  if (e instanceof SshError && e.retryAt !== undefined && e.cause instanceof Error) {
    return `${e.cause.message} (retrying with backoff)`;
  }
  return e instanceof Error ? e.message : String(e);
}

function caBundle(ctx: Context, cls: VirtualTargetClass): string {
  const ns = cls.metadata.namespace;
  const ref = cls.spec.caBundleConfigMapRef;
  const cm = ref
    ? ctx.caches.configMaps.get(ns, ref.name)?.data?.[ref.key ?? "ca-bundle.crt"]
    : ctx.caches.configMaps.get(ns, DEFAULT_CA_CONFIGMAP.name)?.data?.[DEFAULT_CA_CONFIGMAP.key];
  return cm ?? "";
}

export const targetString = (t: LabTarget) => `${t.user}@${t.host}:${t.port}`;

/** The form of TARGET_ANNOTATION: user@host:port. */
const TARGET_RE = /^(.+)@(.+):(\d+)$/;

function parseTarget(s: string, like: LabTarget): LabTarget {
  const m = TARGET_RE.exec(s);
  return m ? { ...like, user: m[1], host: m[2], port: Number(m[3]) } : like;
}

// ---------------------------------------------------------------- teardown

/** Tears down a deleted Exporter's instance, then removes our finalizer. Returns a problem if it cannot. */
async function finalize(
  ctx: Context,
  owner: KubeObjectLike,
  e: Exporter,
  target: LabTarget | undefined,
  keepInstance = false,
): Promise<Problem | undefined> {
  if (!e.metadata.finalizers?.includes(FINALIZER)) return undefined;
  const where = e.metadata.annotations?.[TARGET_ANNOTATION];
  if (where && !keepInstance) {
    const problem = await removeInstance(ctx, e, where, target);
    if (problem) {
      ctx.recorder.event(e, "Warning", problem.reason, problem.message);
      return problem;
    }
  }
  ctx.applied.delete(e.metadata.uid!);
  ctx.exporterFailures.delete(e.metadata.uid!);
  await ctx.client.mergePatch(EXPORTERS, e.metadata.namespace, e.metadata.name!, {
    metadata: {
      resourceVersion: e.metadata.resourceVersion,
      finalizers: e.metadata.finalizers.filter((f) => f !== FINALIZER),
    },
  }).catch((err) => {
    if (!isNotFound(err) && !isConflict(err)) throw err;
  });
  if (keepInstance) {
    ctx.recorder.event(
      owner,
      "Normal",
      "Retained",
      `reclaimPolicy Retain: ${e.metadata.name} keeps running on ${where ?? "(never deployed)"}; remove it there by ` +
        "hand when it is no longer wanted",
    );
  } else {
    ctx.recorder.event(owner, "Normal", "TornDown", `removed ${e.metadata.name} from ${where ?? "(never deployed)"}`);
  }
  return undefined;
}

type KubeObjectLike = ExporterSet | Exporter;

/** Removes the Exporter's instance from the host it was deployed to; a problem if that cannot be done now. */
async function removeInstance(
  ctx: Context,
  e: Exporter,
  where: string,
  target: LabTarget | undefined,
): Promise<Problem | undefined> {
  if (!target) {
    return {
      reason: "TeardownBlocked",
      message: `cannot tear down ${e.metadata.name} on ${where}: no usable SSH credentials for it (see the ` +
        "VirtualTargetClass and its credentials Secret); the Exporter stays until the instance is removed",
    };
  }
  try {
    await ctx.hosts.remove(parseTarget(where, target), e.metadata.name!);
    return undefined;
  } catch (err) {
    return {
      reason: "TeardownFailed",
      message: `teardown of ${e.metadata.name} on ${where} failed, will retry: ${errorText(err)}`,
    };
  }
}

/**
 * The set is gone (the garbage collector may not be running, or not yet): delete its Exporters and tear down their
 * instances with the credentials of the class they were deployed with, if it is still there.
 */
async function orphaned(ctx: Context, ns: string, owned: Exporter[]): Promise<Outcome> {
  // in parallel, as deploys are: one unreachable host must not hold up the instances on the others
  const results = await Promise.all(owned.map(async (e) => {
    if (e.metadata.deletionTimestamp) {
      const retain = e.metadata.annotations?.[RECLAIM_ANNOTATION] === "Retain";
      return await finalize(ctx, e, e, deployedTarget(ctx, e), retain);
    }
    await ctx.client.delete(EXPORTERS, ns, e.metadata.name!);
  }));
  const problems = results.filter((p): p is Problem => p !== undefined);
  if (problems.length) return { requeueAfterMs: retryAfterMs(ctx, problems) };
  return owned.length ? { requeueAfterMs: 1_000 } : {};
}

/**
 * The SSH target an Exporter was deployed to (its target annotation), with the credentials of a class of ours in its
 * namespace that can reach it; undefined if it was never deployed or no class has usable credentials.
 */
export function deployedTarget(ctx: Context, e: Exporter): LabTarget | undefined {
  const ns = e.metadata.namespace!;
  const m = TARGET_RE.exec(e.metadata.annotations?.[TARGET_ANNOTATION] ?? "");
  if (!m) return undefined;
  const params = { host: { name: m[2], user: m[1], port: Number(m[3]) } } as InstanceParams;
  for (const cls of ctx.caches.classes.list(ns)) {
    if (cls.spec.provisioner !== ctx.provisioner) continue;
    const cred = sshTarget(
      cls,
      params,
      ctx.caches.secrets.get(ns, cls.spec.credentialsSecretRef?.name ?? ""),
      ctx.caches.secrets.get(ns, PINNED_HOST_KEYS_SECRET),
    );
    if (cred.ok) return cred.target;
  }
  return undefined;
}

// ---------------------------------------------------------------- API writes

function isLeased(e: Exporter, leases: Lease[]): boolean {
  if (e.status?.leaseRef?.name) return true;
  return leases.some((l) => !l.status?.ended && l.status?.exporterRef?.name === e.metadata.name);
}

/** Jumpstarter's word on an Exporter's leases: none names it, one is under way, or the one it had has ended. */
function leaseState(e: Exporter, leases: Lease[]): "none" | "active" | "ended" {
  if (isLeased(e, leases)) return "active";
  return leases.some((l) => l.status?.ended && l.status?.exporterRef?.name === e.metadata.name) ? "ended" : "none";
}

function pendingCreates(ctx: Context, set: ExporterSet, live: Exporter[]): string[] {
  const exp = ctx.expectations.get(set.metadata.uid!);
  if (!exp) return [];
  for (const e of live) exp.names.delete(e.metadata.name!);
  if (exp.names.size === 0 || Date.now() > exp.until) {
    ctx.expectations.delete(set.metadata.uid!);
    return [];
  }
  return [...exp.names];
}

async function createExporters(ctx: Context, set: ExporterSet, n: number): Promise<void> {
  if (n <= 0) return;
  const m = set.metadata;
  const created = await Promise.all(Array.from({ length: n }, () =>
    ctx.client.create<Exporter>(EXPORTERS, {
      metadata: {
        generateName: `${m.name}-`,
        namespace: m.namespace,
        labels: { ...set.spec.template?.metadata?.labels, [SET_LABEL]: m.name! },
        annotations: set.spec.template?.metadata?.annotations,
        finalizers: [FINALIZER],
        ownerReferences: [{
          apiVersion: `${EXPORTER_SETS.group}/${EXPORTER_SETS.version}`,
          kind: "ExporterSet",
          name: m.name!,
          uid: m.uid!,
          controller: true,
          blockOwnerDeletion: true,
        }],
      },
      spec: { enabled: true },
    })));
  const names = created.map((e) => e.metadata.name!);
  const exp = ctx.expectations.get(m.uid!) ?? { names: new Set<string>(), until: 0 };
  for (const name of names) exp.names.add(name);
  exp.until = Date.now() + 60_000;
  ctx.expectations.set(m.uid!, exp);
  ctx.recorder.event(set, "Normal", "CreatedExporters", `created ${names.join(", ")}`);
}

async function setEnabled(ctx: Context, set: ExporterSet, ns: string, name: string, enabled: boolean) {
  await ctx.client.mergePatch(EXPORTERS, ns, name, { spec: { enabled } });
  ctx.recorder.event(
    set,
    "Normal",
    enabled ? "EnabledExporter" : "DrainingExporter",
    `${enabled ? "re-enabled" : "draining"} ${name}`,
  );
}

/** Sets annotations on an Exporter; null removes one. */
async function annotate(ctx: Context, e: Exporter, annotations: Record<string, string | null>): Promise<void> {
  await ctx.client.mergePatch(EXPORTERS, e.metadata.namespace, e.metadata.name!, { metadata: { annotations } });
}

/**
 * The set's status as this process last wrote it, else as cached. Right after a write the cache still holds the
 * previous status for a moment; computing from that would re-stamp lastTransitionTime on conditions that did not
 * flip and write a second time. The status is ours alone (no one else writes it), so our own last write is the truth.
 */
function lastStatus(ctx: Context, key: string, set: ExporterSet): ExporterSetStatus | undefined {
  const mine = ctx.statuses.get(key);
  return mine && mine.uid === set.metadata.uid ? mine.status : set.status;
}

async function writeStatus(
  ctx: Context,
  key: string,
  set: ExporterSet,
  old: ExporterSetStatus | undefined,
  next: ExporterSetStatus,
): Promise<void> {
  if (!statusChanged(old, next)) return;
  // A merge patch keeps keys it does not mention: null out the ones that went away.
  const patch: Record<string, unknown> = { ...next };
  for (const k of Object.keys(old ?? {})) if (!(k in next)) patch[k] = null;
  await ctx.client.mergePatch(EXPORTER_SETS, set.metadata.namespace, set.metadata.name!, { status: patch }, "status");
  ctx.statuses.set(key, { uid: set.metadata.uid!, status: next });
}

/** Trust on first use: records a host key seen for the first time in the namespace's pin Secret. */
export async function pinHostKey(client: KubeClient, target: LabTarget, line: string): Promise<void> {
  for (let attempt = 0; attempt < 5; attempt++) {
    const current = await client.find<Secret>(SECRETS, target.namespace, PINNED_HOST_KEYS_SECRET);
    const text = decodeSecretValue(current, PINNED_HOST_KEYS_KEY) ?? "";
    if (text.split("\n").includes(line)) return;
    const data = {
      [PINNED_HOST_KEYS_KEY]: Buffer.from(`${text}${text && !text.endsWith("\n") ? "\n" : ""}${line}\n`).toString(
        "base64",
      ),
    };
    try {
      if (!current) {
        await client.create<Secret>(SECRETS, {
          metadata: { name: PINNED_HOST_KEYS_SECRET, namespace: target.namespace },
          type: "Opaque",
          data,
        });
      } else {
        await client.mergePatch(SECRETS, target.namespace, PINNED_HOST_KEYS_SECRET, {
          metadata: { resourceVersion: current.metadata.resourceVersion },
          data,
        });
      }
      return;
    } catch (e) {
      if (!isConflict(e)) throw e; // someone else pinned at the same time: read again
    }
  }
  throw new Error(
    `could not pin the host key of ${target.host} in Secret ${target.namespace}/${PINNED_HOST_KEYS_SECRET}`,
  );
}
