/**
 * Deploy: render each live Exporter's instance and apply it on its host, unless the last apply still describes it
 * and, once per resync, the host's inspection agrees (host_checks.ts); count the exporters that keep going down
 * without their lease ending, and start them again with back-off.
 */
import { createHash } from "node:crypto";
import type { Exporter, ExporterSet, VirtualTargetClass } from "../api/types.ts";
import { instanceOf, type RenderedInstance, renderInstance } from "../host/render.ts";
import { applyForFacts, type ApplyOutcome } from "../host/lab.ts";
import { factsKey, likelyFacts } from "../host/host_facts.ts";
import type { InstanceParams } from "../host/instance_params.ts";
import { decodeSecretValue, type LabTarget } from "./credentials.ts";
import { type AppliedState, type Context, type ExporterFailures, withJoiners } from "./context.ts";
import { driftSince, unitsSince } from "./host_checks.ts";
import { withHostFacts } from "./first_contact.ts";
import { leaseHolding, leaseState, onlineReport } from "./leases.ts";
import { wasDeployed } from "./marks.ts";
import { applyFailureReason, applyFailureText, errorText } from "./problems.ts";
import type { Problem, Waits } from "./status.ts";
import { withDefaults } from "./plan.ts";
import {
  type HostTarget,
  parseTarget,
  sameHost,
  TARGET_ANNOTATION,
  targetAnnotations,
  targetString,
} from "./targets.ts";
import { annotate, replaceLeftBehind } from "./writes.ts";

const DEFAULT_CA_CONFIGMAP = { name: "jumpstarter-service-ca-cert", key: "ca.crt" };

/**
 * After a pending restart rolled, how soon the set is looked at again for the next; that one waits until no instance
 * of the set is on its way up (the apply queues a restart and does not wait for it).
 */
export const ROLL_NEXT_MS = 5_000;

export type Outdated = { name: string } & Waits;

/**
 * What the deploys of one reconcile share: pending restarts roll one at a time, none while another instance is on its
 * way up; what they report together.
 */
interface Turn {
  rolling: boolean;
  outdated: Outdated[];
  /** Exporters deployed for the first time, with their host, told in one event on the set. */
  deployed: [string, string][];
}

/** What deployAll found: per Exporter uid the last known state, and what it could not do now. */
export interface Deployed {
  states: Map<string, AppliedState | undefined>;
  /** Exporters waiting for their credentials. */
  waiting: string[];
  /** Exporters whose host could not be reached or refused the apply: their state is the last one known. */
  unseen: string[];
  outdated: Outdated[];
}

/**
 * Deploys every live Exporter that has its credentials, in parallel; failures become problems. A change that needs a
 * restart waits while the instance is leased; once its lease ends, those restarts roll one per reconcile.
 *
 * Jumpstarter gives new Exporters their credentials one after another, and the first one's event starts the
 * reconcile: one that waited for the next run, after this one's applies, started a second apply on the same host
 * only once the first was done (most of a 2x2 deploy, bench/results/quick.md). So while the applies run, Exporters
 * that get their credentials join them.
 */
export async function deployAll(
  ctx: Context,
  set: ExporterSet,
  cls: VirtualTargetClass,
  live: Exporter[],
  placeOf: (e: Exporter) => Pick<HostTarget, "params" | "target"> | undefined,
  problems: Problem[],
): Promise<Deployed> {
  const credentialed = (e: Exporter) => !!e.status?.credential?.name && !!e.status?.endpoint;
  const waiting = live.filter((e) => !credentialed(e)).map((e) => e.metadata.name!);
  const unseen: string[] = [];
  // the restart rolled last is not over while its units are on their way up
  const rolling = live.some((e) => ctx.applied.get(e.metadata.uid!)?.startingSince !== undefined);
  const turn: Turn = { rolling, outdated: [], deployed: [] };
  const { outdated } = turn;
  const deployOne = async (e: Exporter): Promise<AppliedState | undefined> => {
    const place = placeOf(e);
    // leaving its host (placement.ts): it keeps its last known state
    if (!place) return ctx.applied.get(e.metadata.uid!);
    const { params, target } = place;
    try {
      return await deploy(ctx, set, cls, e, params, target, turn);
    } catch (err) {
      if (err instanceof LeftBehind) {
        await replaceLeftBehind(ctx, set, e, err.message);
        return undefined;
      }
      const p = { reason: problemReason(err), message: `${e.metadata.name}: ${errorText(err)}` };
      problems.push(p);
      ctx.recorder.event(e, "Warning", p.reason, p.message);
      ctx.log.warn("deploy failed", { exporterSet: set.metadata.name, exporter: e.metadata.name, error: p.message });
      if (wasDeployed(e, ctx.applied.has(e.metadata.uid!))) unseen.push(e.metadata.name!);
      return ctx.applied.get(e.metadata.uid!);
    }
  };
  const ns = set.metadata.namespace;
  const { results, joined } = await withJoiners(
    ctx.exporterChanges,
    live.filter((e) => !waiting.includes(e.metadata.name!)),
    () => waiting.map((name) => ctx.caches.exporters.get(ns, name)),
    (e) =>
      waiting.includes(e.metadata.name!) && credentialed(e) && !e.metadata.deletionTimestamp &&
      live.some((x) => x.metadata.uid === e.metadata.uid),
    deployOne,
  );
  const stillWaiting = waiting.filter((name) => !joined.some((e) => e.metadata.name === name));
  const leases = ctx.caches.leases.list(ns);
  live.forEach((e) => {
    const name = e.metadata.name!;
    if (!results.get(e.metadata.uid!)?.pending || unseen.includes(name) || outdated.some((o) => o.name === name)) {
      return;
    }
    const lease = leaseHolding(e, leases);
    outdated.push({ name, lease, what: `its restart waits for ${lease ? `lease ${lease} to end` : "its turn"}` });
  });
  for (const r of results.values()) if (r?.failing) problems.push({ reason: "ExporterFailing", message: r.failing });
  // one event for the set, not one per instance: 4000 of them slowed 500 sets converging behind a busy API server
  if (turn.deployed.length) {
    const names = turn.deployed.map(([n]) => n).sort();
    const hosts = [...new Set(turn.deployed.map(([, h]) => h))].sort();
    ctx.recorder.event(
      set,
      "Normal",
      "Deployed",
      `deployed ${names.join(", ")} to ${hosts.join(", ")} (units <name>-runtime and <name>-exporter)`,
    );
  }
  return {
    states: new Map(live.map((e) => [e.metadata.uid!, results.get(e.metadata.uid!)])),
    waiting: stillWaiting,
    unseen,
    outdated,
  };
}

async function deploy(
  ctx: Context,
  set: ExporterSet,
  cls: VirtualTargetClass,
  e: Exporter,
  params: InstanceParams,
  target: LabTarget,
  turn: Turn,
): Promise<AppliedState | undefined> {
  const ns = set.metadata.namespace!;
  const name = e.metadata.name!;
  const where = targetString(target);
  const previous = e.metadata.annotations?.[TARGET_ANNOTATION];
  const leases = ctx.caches.leases.list(ns);
  const holder = leaseHolding(e, leases);
  const lease = leaseState(e, leases);
  const from = previous ? parseTarget(previous, target) : undefined;
  // A cosmetic change (Lab1 to lab1., root to ops) is the same host: re-applied there, never removed and re-created.
  if (previous && from && previous !== where && !sameHost(from, target)) {
    // A leased instance is not moved; one whose lease ended is about to be replaced (ExitAndReplace), not moved.
    const replaced = lease === "ended" && withDefaults(set.spec).recycleStrategy === "ExitAndReplace";
    if (holder || replaced) {
      if (holder) turn.outdated.push({ name, lease: holder, what: `stays on ${from.host} until lease ${holder} ends` });
      return ctx.applied.get(e.metadata.uid!);
    }
    // The set now points at another host: remove the instance from the old one before deploying anew.
    await ctx.hosts.remove(from, name, e.metadata.uid).catch((err) => {
      throw new LeftBehind(previous, err);
    });
    ctx.applied.delete(e.metadata.uid!);
    ctx.recorder.event(e, "Normal", "Moved", `removed from ${from.host}, the set's host is now ${target.host}`);
  }
  // The target is recorded before anything reaches the host, so that teardown finds a half-done deploy (for a new
  // Exporter, by its create: writes.ts).
  const recorded = targetAnnotations(where, cls);
  const have = e.metadata.annotations ?? {};
  if (Object.entries(recorded).some(([k, v]) => (have[k] ?? null) !== v)) await annotate(ctx, e, recorded);

  const token = decodeSecretValue(ctx.caches.secrets.get(ns, e.status!.credential!.name), "token");
  if (!token) throw new Error(`Secret ${ns}/${e.status!.credential!.name} has no token yet`);
  const instance = instanceOf(set, cls, params, {
    name,
    uid: e.metadata.uid!,
    endpoint: e.status!.endpoint!,
    token,
    caBundle: caBundle(ctx, cls),
    retain: cls.spec.reclaimPolicy === "Retain",
    controller: ctx.identity,
  });
  const render = (facts: Parameters<typeof renderInstance>[1]) => renderInstance(instance, facts);
  // What is deployed, and where: host-key trust (a new TOFU pin lands in every target of the namespace) and the key
  // are how the host is reached, not what runs on it, so they must not make every instance look changed (M7).
  const hashOf = (r: RenderedInstance) => createHash("sha256").update(JSON.stringify(r)).update(where).digest("hex");
  const facts = factsKey(target);
  const rendered = render(ctx.hostFacts.get(facts));
  const last = ctx.applied.get(e.metadata.uid!);
  const now = ctx.now().getTime();
  const offline = offlineMarker(e);
  // a restart deferred under a lease that is over now is due, whatever else still matches
  const due = last?.pending === true && !holder;
  if (last && !due && stillApplied(last, hashOf(rendered), offline, now)) {
    if (onlineSince(e, last.startingSince)) return up(ctx, e, last, last.at, now);
    const every = checkEveryMs(ctx, last, e, now);
    if (now - last.at < every) return last;
    // due for its check on the host, which one inspection there answers for all instances of every set on it: a
    // close look (units on their way up, a young exporter) asks for the units only, a resync's compares files too
    // (whole inspections for the close looks were 3092 scripts beside 4591 applies at 500 x 8: bench/results)
    const checked = await (every < ctx.resyncMs ? unitsSince : driftSince)(ctx, target, rendered, last.at);
    if (!checked.drift.length) {
      if (!checked.starting.length) return up(ctx, e, last, checked.at, now);
      // on its way up (again: systemd restarts an exporter that crashed): not ready, and looked at closely
      const state = {
        ...last,
        at: checked.at,
        ready: false,
        startingSince: last.startingSince ?? checked.at,
        startingLooks: (last.startingLooks ?? 0) + 1,
      };
      ctx.applied.set(e.metadata.uid!, state);
      return state;
    }
    ctx.log.info("drift on the host, applying again", {
      exporterSet: set.metadata.name,
      exporter: name,
      host: target.host,
      drift: checked.drift.join("; "),
    });
  }

  const failures = ctx.exporterFailures.get(e.metadata.uid!);
  // An exporter that exited while a lease names it is left down: Jumpstarter is about to end that lease, and the plan
  // then replaces the instance. With no lease it should not have exited: it is started again, with back-off.
  const holdExited = instance.exitOnLeaseEnd && (lease !== "none" || (failures !== undefined && now < failures.nextAt));
  const started = performance.now();
  const deferRestart = holder !== undefined || (due && turn.rolling);
  if (due && !deferRestart) turn.rolling = true;
  const opts = { kvmRequired: params.runtime.kvm, keepExited: holdExited, deferRestart };
  // on a host not met yet, the first apply goes alone, rendered for the facts most hosts have, and the others render
  // for the facts it learns: one apply each where the host is like the others, and one more for the first where not
  const applied = await withHostFacts(
    ctx.firstContacts,
    facts,
    () => ctx.hostFacts.get(facts),
    (known, learned) =>
      applyForFacts(ctx.hosts, target, render, known ?? likelyFacts(ctx.hostFacts.values()), opts, (f) => {
        ctx.hostFacts.set(facts, f);
        learned();
      }),
  );
  const report = applied.outcome;
  ctx.metrics.deploySeconds.observe({ host: target.host }, (performance.now() - started) / 1000);
  if (report.errors.length) throw new DeployError(applyFailureText(target.host, report.errors), report.errorCode);
  if (report.changed.length && !last) turn.deployed.push([name, target.host]);
  else if (report.changed.length) {
    ctx.recorder.event(e, "Normal", "Updated", `updated on ${target.host}: ${report.changed.join(", ")}`);
  }
  const state: AppliedState = {
    hash: hashOf(applied.rendered),
    // when the host was last seen as applied: the apply's end, so an inspection begun during it is not trusted
    at: ctx.now().getTime(),
    host: target.host,
    ready: report.ready,
    // the apply queues the units' jobs without waiting for them: one left on its way up is looked at again soon
    startingSince: report.starting ? now : undefined,
    startingLooks: undefined,
    exited: report.exited,
    pending: report.restartPending,
    failing: trackFailures(ctx, e, report, last !== undefined, now),
    offline,
    // a `jmp run` begun now (first start, a restart, a reload) may yet give up on its controller and exit
    startedAt: !last || report.startedExporter || report.changed.length ? now : last.startedAt,
  };
  ctx.applied.set(e.metadata.uid!, state);
  return state;
}

/**
 * How long after its start an exporter not reported Online is checked on its host every FAST_CHECK_MS: `jmp run`
 * exits 0 after 5 failures within 60 s when its controller is not ready, and Restart=on-failure (ExitAndReplace) then
 * leaves it down with nothing to tell us, as Jumpstarter never saw it online. The host's own restart policy cannot
 * tell that exit from the one after a lease, which must stay down to be replaced; the controller can (leases.ts).
 */
const FAST_CHECK_WINDOW_MS = 2 * 60_000;
const FAST_CHECK_MS = 5_000;
/**
 * Units left on their way up (an apply queues their start and does not wait) are looked at STARTING_FIRST_CHECK_MS
 * after the apply, then twice as long after each look that finds them still starting, up to STARTING_CHECK_MS. Each
 * of those looks waits on the host while a start is under way, up to STARTING_WAIT_MS (host_checks.ts), so that the
 * set reports them ready about as soon as they are: they usually come up 0.3 to 1 s after the apply. Looks every 250
 * ms from the controller, each answered at once, found two instances' units up some 0.45 s after their applies only
 * at the second look, 0.55 s after; waiting on the host took a 2 x 2 deploy from 1.92 to 1.68 s (medians). One look
 * at the host answers for all its instances.
 */
const STARTING_FIRST_CHECK_MS = 50;
const STARTING_CHECK_MS = 1_000;

/** How long after the apply, or after the `looks`-th inspection that found them still starting, units are looked at. */
export const startingCheckMs = (looks: number) => Math.min(STARTING_FIRST_CHECK_MS * 2 ** looks, STARTING_CHECK_MS);
/**
 * Units still on their way up this long after the apply are applied again, as any not ready were before: a start
 * stuck in a restart loop is then reported, with systemd's restart count and the journal (trackFailures).
 */
const STARTING_REAPPLY_MS = 20_000;

/**
 * How often the instance is checked on its host: from STARTING_FIRST_CHECK_MS to STARTING_CHECK_MS while its units are
 * on their way up (every FAST_CHECK_MS if its exporter has been found down lately, which keeps a crash loop at the pace
 * of a few seconds), every FAST_CHECK_MS in the window after a start until Jumpstarter reports it Online (an
 * inspection of its host answers for every instance there), else once per resync.
 */
function checkEveryMs(ctx: Context, last: AppliedState, e: Exporter, now: number): number {
  if (last.startingSince !== undefined) {
    const soon = startingCheckMs(last.startingLooks ?? 0);
    return Math.min(ctx.exporterFailures.has(e.metadata.uid!) ? FAST_CHECK_MS : soon, ctx.resyncMs);
  }
  const young = now - last.startedAt < FAST_CHECK_WINDOW_MS;
  return young && onlineReport(e) !== true ? Math.min(FAST_CHECK_MS, ctx.resyncMs) : ctx.resyncMs;
}

/** When the set's next fast check (or re-apply of a start that did not come up) is due (Infinity: none is). */
export function fastCheckInMs(ctx: Context, live: Exporter[]): number {
  const now = ctx.now().getTime();
  const due = live.map((e) => {
    const last = ctx.applied.get(e.metadata.uid!);
    if (!last) return Infinity;
    const every = checkEveryMs(ctx, last, e, now);
    const next = Math.min(last.at + every, (last.startingSince ?? Infinity) + STARTING_REAPPLY_MS);
    // no sooner than a second, but for the first looks at units on their way up
    const floor = Math.min(every, 1_000);
    return every < ctx.resyncMs || last.startingSince !== undefined ? Math.max(floor, next - now) : Infinity;
  });
  return Math.min(Infinity, ...due);
}

/**
 * Jumpstarter saw the exporter come online since its units were found on their way up: they are up (the exporter
 * runs in the runtime's network namespace and is bound to it), without a look at the host. An Online=True from before
 * says nothing about this start. Transition times have whole seconds.
 */
function onlineSince(e: Exporter, starting: number | undefined): boolean {
  const online = e.status?.conditions?.find((c) => c.type === "Online");
  const since = Date.parse(online?.lastTransitionTime ?? "");
  return starting !== undefined && online?.status === "True" && since >= Math.floor(starting / 1000) * 1000;
}

/** The instance's units are up: it is ready, as of `at`. */
function up(ctx: Context, e: Exporter, last: AppliedState, at: number, now: number): AppliedState {
  const state = { ...last, at, ready: true, startingSince: undefined, failing: stillFailing(ctx, e, now, last) };
  ctx.applied.set(e.metadata.uid!, state);
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
  } else if (report.ready) f = forgetIfHealthy(ctx, uid, now);
  // systemd's count also grows with every reload an exporter does by restarting (SIGHUP makes `jmp run` exit), so it
  // says "failing" only while the exporter is down
  const times = Math.max(f?.count ?? 0, report.ready ? 0 : report.exporterRestarts);
  if (times < FAILING_AFTER) return undefined;
  const lines = report.journal.length ? `; last lines: ${report.journal.join(" | ")}` : "";
  return `${e.metadata.name}: the exporter went down ${times} times without its lease ending; restarting it with ` +
    `back-off (journalctl -u ${e.metadata.name}-exporter on the host)${lines}`;
}

/** Forgets the exporter's failures once it has been up long enough since the last; returns those that remain. */
function forgetIfHealthy(ctx: Context, uid: string, now: number): ExporterFailures | undefined {
  const f = ctx.exporterFailures.get(uid);
  if (f && now - f.at > HEALTHY_AFTER_MS) ctx.exporterFailures.delete(uid);
  return ctx.exporterFailures.get(uid);
}

/** An exporter found up: still failing only by the count of its starts (its restarts by systemd are over). */
function stillFailing(ctx: Context, e: Exporter, now: number, last: AppliedState): string | undefined {
  return (forgetIfHealthy(ctx, e.metadata.uid!, now)?.count ?? 0) >= FAILING_AFTER ? last.failing : undefined;
}

/**
 * Whether the last apply still describes what should be on the host, so this reconcile need not apply: same content,
 * found healthy or on its way up (for up to STARTING_REAPPLY_MS), and Jumpstarter has not reported the exporter gone
 * since. That report is the prompt sign of an exporter that exited after its lease (ExitAndReplace) or crashed; it is
 * acted on once per report, so an exporter that stays offline for other reasons (it cannot reach Jumpstarter) is not
 * re-applied on every event. Whether the host still matches is the resync check's question (host_checks.ts).
 */
function stillApplied(last: AppliedState, hash: string, offline: string | undefined, now: number): boolean {
  const upOrStarting = last.ready ||
    (last.startingSince !== undefined && now - last.startingSince < STARTING_REAPPLY_MS);
  return last.hash === hash && upOrStarting && (offline === undefined || offline === last.offline);
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
  if (err instanceof DeployError) return applyFailureReason(err.code);
  const kind = (err as { kind?: string })?.kind;
  if (kind === "hostkey") return "HostKeyRejected";
  if (kind === "auth") return "AuthenticationFailed";
  // closed: the connection died under a running command, which is what a host that went away looks like
  if (kind === "connect" || kind === "timeout" || kind === "closed") return "HostUnreachable";
  return "DeployFailed";
}

function caBundle(ctx: Context, cls: VirtualTargetClass): string {
  const ns = cls.metadata.namespace;
  const ref = cls.spec.caBundleConfigMapRef;
  const cm = ref
    ? ctx.caches.configMaps.get(ns, ref.name)?.data?.[ref.key ?? "ca-bundle.crt"]
    : ctx.caches.configMaps.get(ns, DEFAULT_CA_CONFIGMAP.name)?.data?.[DEFAULT_CA_CONFIGMAP.key];
  return cm ?? "";
}
