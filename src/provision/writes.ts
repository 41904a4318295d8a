/**
 * Every write a reconcile makes to the API: Exporters created, re-enabled, drained, deleted and annotated, and the
 * set's status. Each write records its Event on the set or Exporter.
 */
import type { Exporter, ExporterSet, ExporterSetStatus } from "../api/types.ts";
import { isConflict, isNotFound } from "../kube/client.ts";
import { EXPORTER_SETS, EXPORTERS } from "../kube/resources.ts";
import { leaseHolding } from "./leases.ts";
import type { Context } from "./context.ts";
import { FINALIZER, SET_LABEL, templateMarks } from "./marks.ts";
import { PROVISIONER } from "../api/types.ts";
import type { Plan } from "./plan.ts";
import { statusChanged } from "./status.ts";

/** How long an Exporter we created may take to show up in the cache before we stop counting it as pending. */
const EXPECTATION_MS = 60_000;

export async function act(ctx: Context, set: ExporterSet, p: Plan): Promise<void> {
  const ns = set.metadata.namespace!;
  await createExporters(ctx, set, p.create);
  for (const n of p.enable) await setEnabled(ctx, set, ns, n, true);
  for (const n of p.drain) await setEnabled(ctx, set, ns, n, false);
  for (const n of p.delete) {
    await ctx.client.delete(EXPORTERS, ns, n);
    ctx.recorder.event(set, "Normal", "DeletingExporter", `deleting exporter ${n}`);
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

/** Exporters this process created for the set that the cache does not show yet. */
export function pendingCreates(ctx: Context, set: ExporterSet, live: Exporter[]): string[] {
  const exp = ctx.expectations.get(set.metadata.uid!);
  if (!exp) return [];
  for (const e of live) exp.names.delete(e.metadata.name!);
  if (exp.names.size === 0 || ctx.now().getTime() > exp.until) {
    ctx.expectations.delete(set.metadata.uid!);
    return [];
  }
  return [...exp.names];
}

async function createExporters(ctx: Context, set: ExporterSet, n: number): Promise<void> {
  if (n <= 0) return;
  const m = set.metadata;
  const marks = templateMarks(set);
  if (marks.dropped.length) {
    ctx.recorder.event(
      set,
      "Warning",
      "ReservedKeysIgnored",
      `spec.template.metadata: ${marks.dropped.join(", ")} left out of the Exporters: keys under ` +
        `${PROVISIONER}/ are this controller's to write; remove them from the template`,
    );
  }
  const created = await Promise.all(Array.from({ length: n }, () =>
    ctx.client.create<Exporter>(EXPORTERS, {
      metadata: {
        generateName: `${m.name}-`,
        namespace: m.namespace,
        labels: { ...marks.labels, [SET_LABEL]: m.name! },
        annotations: marks.annotations,
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
  exp.until = ctx.now().getTime() + EXPECTATION_MS;
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
  await ctx.client.delete(EXPORTERS, e.metadata.namespace, e.metadata.name!);
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
