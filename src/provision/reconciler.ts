/**
 * One ExporterSet, from its cached state to Exporters in the API and instances on its lab host. Every step reads the
 * world and does what is missing, so a reconcile can be killed anywhere and the next one finishes the job.
 *
 * Order of work: finish Exporters being deleted (teardown.ts); deploy or refresh every live Exporter that has
 * credentials (deploy.ts); plan the count (plan.ts); create, re-enable, drain or delete, and write status (writes.ts).
 */
import type { Exporter, ExporterSet, ExporterSetStatus, VirtualTargetClass } from "../api/types.ts";
import type { Outcome } from "../kube/queue.ts";
import type { InstanceParams } from "../host/instance_params.ts";
import type { LabTarget } from "./credentials.ts";
import type { AppliedState, Context } from "./context.ts";
import { deployAll, type Deployed, fastCheckInMs, ROLL_NEXT_MS } from "./deploy.ts";
import { type DemandTaker, isLeased, leaseHolding, leaseState, onlineReport, pendingDemand } from "./leases.ts";
import { routedSetName, SET_LABEL, setOwner, templateMarks, wasDeployed } from "./marks.ts";
import { fieldErrorLine, type Placement } from "./params.ts";
import { poolPlan } from "./pool.ts";
import { inspectHost } from "./host_checks.ts";
import { demandRoom, type ExporterView, plan, selectorString, withDefaults } from "./plan.ts";
import { retryAfterMs } from "./problems.ts";
import { computeStatus, type ExporterState, type Problem, type StatusInput } from "./status.ts";
import { cachedSetTarget, type HostTarget, targetString } from "./targets.ts";
import { finalizeAll, orphaned } from "./teardown.ts";
import { rememberTarget } from "./known_targets.ts";
import { act, lastStatus, pendingCreates, writeStatus } from "./writes.ts";

const split = (key: string) => {
  const i = key.indexOf("/");
  return [key.slice(0, i), key.slice(i + 1)] as const;
};

export async function reconcile(ctx: Context, key: string): Promise<Outcome> {
  const [ns, name] = split(key);
  const set = ctx.caches.sets.get(ns, name);
  // with the Exporters orphaned by `kubectl delete --cascade=orphan`: torn down when they are deleted
  const named = ctx.caches.exporters.list(ns).filter((e) => routedSetName(e) === name);
  const isMine = (e: Exporter) => !!set && e.metadata.ownerReferences!.some((o) => o.uid === set.metadata.uid);
  const isNamed = (e: Exporter) => e.metadata.namespace === ns && routedSetName(e) === name;
  // Exporters of a deleted set, including an earlier incarnation of a set re-created under the same name.
  const stale = named.filter((e) => !isMine(e));
  const orphanOutcome = await orphaned(ctx, set, stale, (e) => isNamed(e) && !isMine(e));
  if (!set) {
    ctx.statuses.delete(key);
    return orphanOutcome;
  }
  const owned = named.filter(isMine);
  const cls = ctx.caches.classes.get(ns, set.spec.virtualTargetClassName);
  if (cls && cls.spec.provisioner !== ctx.provisioner) return orphanOutcome; // another provisioner's set
  const old = lastStatus(ctx, key, set);
  const { params, target, pooled, problems } = cls ? configuration(ctx, set, cls) : { problems: [] as Problem[] };
  // 1. Exporters being deleted: tear down on the host first (all at once), then let them go. Also without the class
  // or its Secret: the teardown tries the credentials remembered for the host.
  const teardown = await finalizeAll(
    ctx,
    set,
    owned.filter((e) => e.metadata.deletionTimestamp),
    target ? [target] : [],
    !!set.metadata.deletionTimestamp,
    (e) => isNamed(e) && isMine(e),
  );
  // those deleted meanwhile are gone from their hosts: not deployed again
  const live = owned.filter((e) => !e.metadata.deletionTimestamp && !teardown.joined.has(e.metadata.uid!));
  problems.push(...teardown.problems);
  if (!cls) {
    await writeStatus(
      ctx,
      key,
      set,
      old,
      computeStatus({ ...statusBasics(ctx, set, old), classMissing: set.spec.virtualTargetClassName }),
    );
    const requeueAfterMs = Math.min(orphanOutcome.requeueAfterMs ?? Infinity, teardown.requeueAfterMs ?? Infinity);
    return requeueAfterMs === Infinity ? {} : { requeueAfterMs };
  }
  // 2. Deploy or refresh what has credentials: on the set's host, or on each one's host of the pool.
  const pending = pendingCreates(ctx, set, live);
  const leases = ctx.caches.leases.list(ns);
  const pool = pooled && poolPlan({
    ...pooled,
    live,
    leased: (e) => leaseHolding(e, leases),
    pending,
    reach: ctx.hostReach,
    now: ctx.now().getTime(),
  });
  if (pool) problems.push(...pool.unreachable);
  // a pool host that no deploy reaches now (its instances moved away) is still asked, so its return is seen
  const probes = pool && pooled ? probeSilent(ctx, pooled.hosts, live, pool.placeOf) : Promise.resolve();
  const placeOf = pool ? pool.placeOf : params && target ? () => ({ params, target }) : undefined;
  // with no target, what was deployed cannot be looked at
  const { states, waiting, unseen, outdated }: Deployed = placeOf
    ? await deployAll(ctx, set, cls, live, placeOf, problems)
    : {
      states: new Map(),
      waiting: [],
      unseen: live.filter((e) => wasDeployed(e, ctx.applied.has(e.metadata.uid!))).map((e) => e.metadata.name!),
      outdated: [],
    };
  await probes;
  if (pool) outdated.push(...pool.held.filter((h) => !outdated.some((o) => o.name === h.name)));
  // 3. Plan and act.
  const evict = new Set(pool ? pool.failover.evict : []);
  const views = exporterViews(ctx, ns, live);
  const waitForFirstConsumer = cls.spec.bindingMode === "WaitForFirstConsumer";
  const p = plan({
    spec: set.spec,
    // instances leaving their host are out of the count: the plan replaces them
    exporters: [
      ...views.map((v) => evict.has(v.name) ? { ...v, deleting: true } : v),
      ...pending.map((x) => x.name)
        .map(pendingView),
    ],
    pendingDemand: waitForFirstConsumer ? pendingDemand(set, demandTakers(ctx, ns), ctx.caches.leases.list(ns)) : 0,
    waitForFirstConsumer,
    surplusSince: old?.surplusSince,
    now: ctx.now(),
  });
  // nothing can be deployed until the configuration is fixed; under foreground deletion the garbage collector is
  // deleting them
  if (!params || !target || set.metadata.deletionTimestamp) p.create = 0;
  for (const v of views) {
    if (!evict.has(v.name)) continue;
    // drained first, so no lease lands on it; deleted once the drain is seen (the finalizer removes it from its host)
    if (v.enabled) p.drain.push(v.name);
    else if (!v.leased) p.delete.push(v.name);
  }
  const places = pool ? pool.placeNew(p.create) : target ? Array(p.create).fill(targetString(target)) : [];
  const short = pool ? p.create - places.length : 0;
  if (pool) p.create = places.length;
  await act(ctx, set, p, places);
  // 4. Status.
  const exporterStates: ExporterState[] = live.map((e, i) => ({
    name: e.metadata.name!,
    // drained or recycled by this reconcile: no lease can land on it any more
    enabled: views[i].enabled && !p.drain.includes(views[i].name) && !p.recycle.includes(views[i].name),
    leased: views[i].leased,
    // never looked at by this process (it restarted) and not reachable now: Jumpstarter's word
    ready: lastKnown(ctx, states, e.metadata.uid!)?.ready ?? onlineReport(e) === true,
    starting: lastKnown(ctx, states, e.metadata.uid!)?.startingSince !== undefined,
    online: onlineReport(e),
    unseen: unseen.includes(e.metadata.name!),
    waitsFor: outdated.find((o) => o.name === e.metadata.name),
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
      ...pool ? { hosts: pool.rows(places), slotsShort: short } : {},
    }),
  );
  return {
    requeueAfterMs: Math.min(
      retryAfterMs(ctx.resyncMs, problems),
      p.requeueAfterMs ?? Infinity,
      orphanOutcome.requeueAfterMs ?? Infinity,
      teardown.requeueAfterMs ?? Infinity,
      backoffEndsInMs(ctx, live, states),
      fastCheckInMs(ctx, live),
      outdated.some((o) => !o.lease) ? ROLL_NEXT_MS : Infinity,
      // a host's failover is due then
      pool ? pool.failover.nextInMs ?? Infinity : Infinity,
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
    // our set label keeps the selector from spanning sets whose template labels overlap
    selector: selectorString({
      ...set.spec.template?.metadata?.labels ? templateMarks(set).labels : set.spec.selector?.matchLabels,
      [SET_LABEL]: set.metadata.name!,
    }),
    minReplicas: s.minReplicas,
    minAvailableReplicas: s.minAvailableReplicas,
    maxReplicas: s.maxReplicas,
    exporters: [],
    waitingForCredentials: [],
    problems: [],
  };
}

/**
 * The instance parameters and SSH target of the set (of its first host), and its pool when it has one, or the
 * problems that keep it from having them.
 */
function configuration(
  ctx: Context,
  set: ExporterSet,
  cls: VirtualTargetClass,
): {
  params?: InstanceParams;
  target?: LabTarget;
  pooled?: { hosts: HostTarget[]; placement: Placement };
  problems: Problem[];
} {
  const resolved = cachedSetTarget(ctx.caches, cls, set);
  if (!resolved.ok && resolved.stage === "parameters") {
    const message = resolved.errors.map(fieldErrorLine).join("; ");
    ctx.recorder.event(set, "Warning", "InvalidParameters", message);
    return { problems: [{ reason: "InvalidParameters", message }] };
  }
  for (const w of resolved.warnings) ctx.recorder.event(set, "Warning", "UnknownParameter", w);
  if (!resolved.ok) {
    ctx.recorder.event(set, "Warning", resolved.problem.reason, resolved.problem.message);
    return { params: resolved.params, problems: [resolved.problem] };
  }
  for (const h of resolved.hosts) rememberTarget(ctx.knownTargets, h.target);
  const { placement, hosts } = resolved;
  return {
    params: resolved.params,
    target: resolved.target,
    ...placement.pooled ? { pooled: { hosts, placement } } : {},
    problems: [],
  };
}

/** Inspects each pool host that fails and that no instance of the set is deployed to now (host_reach.ts records it). */
async function probeSilent(
  ctx: Context,
  hosts: HostTarget[],
  live: Exporter[],
  placeOf: (e: Exporter) => HostTarget | undefined,
): Promise<void> {
  const used = new Set(live.map((e) => placeOf(e)?.key));
  const silent = hosts.filter((h) => ctx.hostReach.has(h.key) && !used.has(h.key));
  const since = ctx.now().getTime() - ctx.resyncMs;
  await Promise.allSettled(silent.map((h) => inspectHost(ctx, h.target, since).result));
}

/**
 * The sets of the namespace that count pending leases as demand (ours, WaitForFirstConsumer, not being deleted), each
 * with its room: one pass over the Exporters, as every set's reconcile needs the whole namespace's view.
 */
function demandTakers(ctx: Context, ns: string): DemandTaker[] {
  const leases = ctx.caches.leases.list(ns);
  const leased = new Map<string, number>();
  for (const e of ctx.caches.exporters.list(ns)) {
    const owner = setOwner(e)?.uid;
    if (owner && !e.metadata.deletionTimestamp && isLeased(e, leases)) leased.set(owner, (leased.get(owner) ?? 0) + 1);
  }
  return ctx.caches.sets.list(ns).filter((s) => {
    const cls = ctx.caches.classes.get(ns, s.spec.virtualTargetClassName);
    return !s.metadata.deletionTimestamp && cls?.spec.provisioner === ctx.provisioner &&
      cls.spec.bindingMode === "WaitForFirstConsumer";
  }).map((s) => ({ set: s, room: demandRoom(s.spec, leased.get(s.metadata.uid!) ?? 0) }));
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
