/**
 * Every write a reconcile makes to the API: Exporters created, re-enabled, drained, deleted and annotated, and the
 * set's status. Each write records its Event on the set or Exporter.
 */
import type { Exporter, ExporterSet, ExporterSetStatus, VirtualTargetClass } from "../api/types.ts";
import { isConflict, isNotFound } from "../kube/client.ts";
import { EXPORTER_SETS, EXPORTERS } from "../kube/resources.ts";
import { leaseHolding } from "./leases.ts";
import type { Context } from "./context.ts";
import { FINALIZER, SET_LABEL, templateMarks } from "./marks.ts";
import { PROVISIONER } from "../api/types.ts";
import type { Plan } from "./plan.ts";
import { statusChanged } from "./status.ts";
import { targetAnnotations } from "./targets.ts";

/**
 * How long an Exporter we created may take to show up in the cache before we stop counting it as pending. Longer than
 * an informer takes to notice a silently dead watch (its 60 s watch timeout + 30 s, informer.ts) and relist: expiring
 * sooner would create again while the cache is merely late (review M11). ReplicaSets wait 5 minutes.
 */
const EXPECTATION_MS = 120_000;

/**
 * Creates per reconcile, at most; the rest come at the next one (each create's watch event requeues the set). A
 * runaway plan (maxReplicas 0 with a minReplicas typo, thousands of pending Leases) must not fire thousands of POSTs,
 * each followed by an instance on one host. ReplicaSets cap at 500 with far cheaper Pods.
 */
export const MAX_CREATES = 50;

/**
 * Drains and deletes are conditional on the resourceVersion the plan saw: Jumpstarter may lease an Exporter between
 * the cache read and the write, and a leased Exporter must never be drained or deleted. A conflict ends this round
 * with an error, so the set is planned again on fresh data.
 */
export async function act(ctx: Context, set: ExporterSet, p: Plan, places: string[] = []): Promise<void> {
  const ns = set.metadata.namespace!;
  await createExporters(ctx, set, p.create, places);
  for (const n of p.enable) await setEnabled(ctx, set, ns, n, true);
  const changed: string[] = [];
  const asPlanned = async (n: string, write: (e: Exporter) => Promise<void>) => {
    const e = ctx.caches.exporters.get(ns, n);
    if (!e) return;
    try {
      await write(e);
    } catch (err) {
      if (!isConflict(err)) throw err;
      changed.push(n);
    }
  };
  for (const n of p.drain) await asPlanned(n, (e) => setEnabled(ctx, set, ns, n, false, e.metadata.resourceVersion));
  for (const n of p.delete) {
    await asPlanned(n, async (e) => {
      await ctx.client.delete(EXPORTERS, ns, n, { uid: e.metadata.uid, resourceVersion: e.metadata.resourceVersion });
      ctx.recorder.event(set, "Normal", "DeletingExporter", `deleting exporter ${n}`);
    });
  }
  if (changed.length) {
    throw new Error(
      `exporter(s) ${changed.join(", ")} of ExporterSet ${ns}/${set.metadata.name} changed since they were planned ` +
        "to drain or delete (409 Conflict, e.g. just leased): planning again",
    );
  }
  for (const n of p.recycle) await recycle(ctx, set, ns, n);
}

/**
 * ExitAndReplace without the race of upstream #935: right after its lease ended an exporter can look available, and
 * Jumpstarter may hand it the next lease just before we delete it. So it is disabled first (no new lease), then read
 * afresh, and deleted only if it is still unleased, and only as read (a lease bound meanwhile changes its version, and
 * the delete fails its precondition: the next reconcile looks again).
 */
async function recycle(ctx: Context, set: ExporterSet, ns: string, name: string): Promise<void> {
  if (ctx.caches.exporters.get(ns, name)?.spec?.enabled !== false) {
    try {
      await ctx.client.mergePatch(EXPORTERS, ns, name, { spec: { enabled: false } });
    } catch (err) {
      // gone already (the cache lags): nothing left to recycle
      if (isNotFound(err)) return;
      throw err;
    }
  }
  const fresh = await ctx.client.find<Exporter>(EXPORTERS, ns, name);
  if (!fresh || fresh.metadata.deletionTimestamp) return;
  const lease = leaseHolding(fresh, ctx.caches.leases.list(ns));
  if (lease) {
    ctx.recorder.event(set, "Normal", "RecycleDeferred", `${name} took lease ${lease} before it was replaced`);
    return;
  }
  try {
    await ctx.client.delete(EXPORTERS, ns, name, { resourceVersion: fresh.metadata.resourceVersion });
  } catch (err) {
    if (isConflict(err)) return;
    throw err;
  }
  ctx.recorder.event(set, "Normal", "DeletingExporter", `deleting exporter ${name}, its lease ended`);
}

/** Exporters this process created for the set that the cache does not show yet, with the target each was placed on. */
export function pendingCreates(
  ctx: Context,
  set: ExporterSet,
  live: Exporter[],
): { name: string; where?: string }[] {
  const exp = ctx.expectations.get(set.metadata.uid!);
  if (!exp) return [];
  for (const e of live) exp.names.delete(e.metadata.name!);
  if (exp.names.size === 0 || ctx.now().getTime() > exp.until) {
    ctx.expectations.delete(set.metadata.uid!);
    return [];
  }
  return [...exp.names].map(([name, where]) => ({ name, where }));
}

/**
 * Creates in batches of 1, 2, 4, ... (client-go's slowStartBatch), stopping at the first batch with a failure, so a
 * create the API server refuses (quota, webhook, overload) fails once rather than n times. Every create that did
 * succeed is expected, failed batch included, so the next reconcile does not create it again.
 */
async function createExporters(ctx: Context, set: ExporterSet, n: number, places: string[]): Promise<void> {
  n = Math.min(n, MAX_CREATES);
  if (n <= 0) return;
  const m = set.metadata;
  const marks = templateMarks(set);
  const cls = ctx.caches.classes.get(m.namespace, set.spec.virtualTargetClassName);
  if (marks.dropped.length) {
    ctx.recorder.event(
      set,
      "Warning",
      "ReservedKeysIgnored",
      `spec.template.metadata: ${marks.dropped.join(", ")} left out of the Exporters: keys under ` +
        `${PROVISIONER}/ are this controller's to write; remove them from the template`,
    );
  }
  const names: string[] = [];
  const created = new Map<string, string | undefined>();
  let failure: unknown;
  for (let batch = 1, done = 0; done < n && failure === undefined; done += batch, batch *= 2) {
    const results = await Promise.allSettled(
      Array.from({ length: Math.min(batch, n - done) }, (_, i) => createOne(ctx, set, marks, cls, places[done + i])),
    );
    results.forEach((r, i) => {
      if (r.status === "fulfilled") {
        names.push(r.value.metadata.name!);
        created.set(r.value.metadata.name!, places[done + i]);
      } else failure ??= r.reason;
    });
  }
  if (names.length) {
    const exp = ctx.expectations.get(m.uid!) ?? { names: new Map<string, string | undefined>(), until: 0 };
    for (const [name, where] of created) exp.names.set(name, where);
    exp.until = ctx.now().getTime() + EXPECTATION_MS;
    ctx.expectations.set(m.uid!, exp);
    ctx.recorder.event(set, "Normal", "CreatedExporters", `created ${names.join(", ")}`);
  }
  if (failure !== undefined) throw failure;
}

/**
 * One Exporter. Its target annotations come with the create: a pooled set's placement takes its slot at once, and
 * for any set it saves what deploy.ts would otherwise write before the first apply, one PATCH per instance (4000 of
 * the 14,000 requests converging 500 x 8 under a 50 qps client bucket).
 */
function createOne(
  ctx: Context,
  set: ExporterSet,
  marks: ReturnType<typeof templateMarks>,
  cls: VirtualTargetClass | undefined,
  where: string | undefined,
): Promise<Exporter> {
  const m = set.metadata;
  return ctx.client.create<Exporter>(EXPORTERS, {
    metadata: {
      generateName: `${m.name}-`,
      namespace: m.namespace,
      labels: { ...marks.labels, [SET_LABEL]: m.name! },
      annotations: where
        ? {
          ...marks.annotations,
          ...Object.fromEntries(
            Object.entries(targetAnnotations(where, cls)).filter((kv): kv is [string, string] => kv[1] !== null),
          ),
        }
        : marks.annotations,
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
  });
}

async function setEnabled(
  ctx: Context,
  set: ExporterSet,
  ns: string,
  name: string,
  enabled: boolean,
  /** The version planned on: a merge patch carrying it is refused (409) if the Exporter changed since. */
  resourceVersion?: string,
) {
  const metadata = resourceVersion ? { metadata: { resourceVersion } } : {};
  await ctx.client.mergePatch(EXPORTERS, ns, name, { ...metadata, spec: { enabled } });
  ctx.recorder.event(
    set,
    "Normal",
    enabled ? "EnabledExporter" : "DrainingExporter",
    `${enabled ? "re-enabled" : "draining"} ${name}`,
  );
}

/** Sets annotations on an Exporter; null removes one. */
export async function annotate(ctx: Context, e: Exporter, annotations: Record<string, string | null>): Promise<void> {
  await ctx.client.mergePatch(EXPORTERS, e.metadata.namespace, e.metadata.name!, { metadata: { annotations } });
}

/**
 * An instance stuck on a host the set left (usually because that host is down): the Exporter is deleted, so its
 * finalizer removes the old instance whenever that host is back, and a fresh Exporter starts on the new host now
 * instead of the set waiting for the old one. A new Exporter, not the same one moved: the old instance may come back
 * to life with the old identity until it is removed.
 */
export async function replaceLeftBehind(ctx: Context, set: ExporterSet, e: Exporter, why: string): Promise<void> {
  // as planned: not if it was leased meanwhile (a conflict fails the reconcile, which then looks again)
  const { uid, resourceVersion } = e.metadata;
  await ctx.client.delete(EXPORTERS, e.metadata.namespace, e.metadata.name!, { uid, resourceVersion });
  ctx.recorder.event(
    set,
    "Warning",
    "MoveBlocked",
    `replacing ${e.metadata.name}: ${why}; it is removed there once that host is reachable`,
  );
}

/**
 * The set's status as this process last wrote it, else as cached. Right after a write the cache still holds the
 * previous status for a moment; computing from that would re-stamp lastTransitionTime on conditions that did not
 * flip and write a second time. The status is ours alone (no one else writes it), so our own last write is the truth.
 */
export function lastStatus(ctx: Context, key: string, set: ExporterSet): ExporterSetStatus | undefined {
  const mine = ctx.statuses.get(key);
  return mine && mine.uid === set.metadata.uid ? mine.status : set.status;
}

export async function writeStatus(
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
