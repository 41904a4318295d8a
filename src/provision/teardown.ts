/**
 * Exporters going away: remove the instance from the host it was deployed to, then drop our finalizer; and the
 * Exporters of a set that is gone.
 */
import type { Exporter, ExporterSet } from "../api/types.ts";
import { HostScriptError } from "../host/lab.ts";
import { isConflict, isNotFound } from "../kube/client.ts";
import type { Outcome } from "../kube/queue.ts";
import { EXPORTER_SETS, EXPORTERS } from "../kube/resources.ts";
import type { LabTarget } from "./credentials.ts";
import { type Context, withJoiners } from "./context.ts";
import { FINALIZER, isOurs, RECLAIM_ANNOTATION, SET_LABEL, setOwner } from "./marks.ts";
import { errorText, retryAfterMs } from "./problems.ts";
import type { Problem } from "./status.ts";
import { deployedTargets, parseTarget, TARGET_ANNOTATION } from "./targets.ts";
import { candidateTargets, NoneTaken, withFirstTaken } from "./known_targets.ts";

const OWNER_CONFLICT = "OwnerConflict";

/**
 * Tears down a deleted Exporter's instance, trying each of `targets` (the same host with different credentials) until
 * one is let in, then removes our finalizer. When its set is being deleted, reclaimPolicy Retain keeps the instance.
 * Returns a problem if it cannot.
 */
export async function finalize(
  ctx: Context,
  owner: ExporterSet | Exporter,
  e: Exporter,
  targets: LabTarget[],
  setDeleted: boolean,
): Promise<Problem | undefined> {
  if (!e.metadata.finalizers?.includes(FINALIZER)) return undefined;
  if (ctx.finalized.get(e.metadata.uid!) === e.metadata.resourceVersion) return undefined;
  const where = e.metadata.annotations?.[TARGET_ANNOTATION];
  const keepInstance = setDeleted && e.metadata.annotations?.[RECLAIM_ANNOTATION] === "Retain";
  const candidates = where ? candidateTargets(ctx.knownTargets, where, targets) : [];
  const problem = where && !keepInstance ? await removeInstance(ctx, e, where, candidates) : undefined;
  if (problem) {
    ctx.recorder.event(e, "Warning", problem.reason, problem.message);
    // another's instance under the name: nothing of ours is there to wait for
    if (problem.reason !== OWNER_CONFLICT) {
      if (graceLeftMs(ctx, e) > 0) return problem;
      abandon(ctx, owner, e, where!, candidates);
    }
  }
  ctx.applied.delete(e.metadata.uid!);
  ctx.exporterFailures.delete(e.metadata.uid!);
  await ctx.client.mergePatch(EXPORTERS, e.metadata.namespace, e.metadata.name!, {
    metadata: {
      resourceVersion: e.metadata.resourceVersion,
      finalizers: e.metadata.finalizers.filter((f) => f !== FINALIZER),
    },
  }).then(
    () => ctx.finalized.set(e.metadata.uid!, e.metadata.resourceVersion!),
    (err) => {
      // a conflict: the Exporter changed meanwhile, and the next reconcile looks at it again
      if (!isNotFound(err) && !isConflict(err)) throw err;
    },
  );
  if (keepInstance) {
    ctx.recorder.event(
      owner,
      "Normal",
      "Retained",
      `reclaimPolicy Retain: ${e.metadata.name} keeps running on ${where ?? "(never deployed)"}; remove it there by ` +
        "hand when it is no longer wanted",
    );
  } else if (!problem) {
    ctx.recorder.event(owner, "Normal", "TornDown", `removed ${e.metadata.name} from ${where ?? "(never deployed)"}`);
  }
  return undefined;
}

/**
 * How long the Exporter may still wait for its teardown: `teardownGraceMs` from its deletion. Past it the finalizer
 * goes whatever the host says, so neither a namespace nor an uninstall hangs on a host that is gone for good.
 */
export function graceLeftMs(ctx: Context, e: Exporter): number {
  const since = Date.parse(e.metadata.deletionTimestamp ?? "");
  return Number.isNaN(since) ? Infinity : since + ctx.teardownGraceMs - ctx.now().getTime();
}

/**
 * The finalizer goes without a teardown: said in a Warning event naming host and instance, and the host is
 * remembered so a later sweep there removes the instance (ours, and its Exporter gone) once it can.
 */
function abandon(ctx: Context, owner: ExporterSet | Exporter, e: Exporter, where: string, candidates: LabTarget[]) {
  const grace = Math.round(ctx.teardownGraceMs / 1000);
  const later = candidates.length
    ? "the orphan sweep removes it there once the host lets us in"
    : "no SSH key for that host is known: remove it there by hand";
  const message = `gave up tearing down ${e.metadata.name} on ${where} after ${grace}s (--teardown-grace): ` +
    `${later}`;
  for (const o of owner === e ? [e] : [e, owner]) ctx.recorder.event(o, "Warning", "TeardownAbandoned", message);
  ctx.log.warn("dropping a finalizer without teardown", { exporter: e.metadata.name, host: where });
  // every way the teardown had: the key the host refused now may be the one a rotation has not reached yet
  if (candidates.length) ctx.leftOn.set(where, candidates.map((t) => parseTarget(where, t)));
}

/**
 * Removes the Exporter's instance from the host it was deployed to; a problem if that cannot be done now, or an
 * OwnerConflict when the files there name another uid (a same-name instance of another namespace: ours was never
 * applied there, so there is nothing of ours to remove).
 */
async function removeInstance(
  ctx: Context,
  e: Exporter,
  where: string,
  targets: LabTarget[],
): Promise<Problem | undefined> {
  if (!targets.length) {
    return {
      reason: "TeardownBlocked",
      message: `cannot tear down ${e.metadata.name} on ${where}: no usable SSH credentials for it (see the ` +
        "VirtualTargetClass and its credentials Secret); the Exporter stays until the instance is removed, at most " +
        "--teardown-grace",
    };
  }
  try {
    await withFirstTaken(targets, (t) => ctx.hosts.remove(parseTarget(where, t), e.metadata.name!, e.metadata.uid));
    return undefined;
  } catch (err) {
    if (err instanceof NoneTaken) {
      ctx.log.warn("teardown found no key the host accepts", { exporter: e.metadata.name, host: where });
      return {
        reason: "TeardownNoKey",
        message: `cannot tear down ${e.metadata.name} on ${where}: the host accepts none of the ${targets.length} ` +
          "SSH keys known for it (the classes' in its namespace, and those it took before); give a class the key of " +
          "that host, or remove the instance there by hand; the finalizer goes after --teardown-grace",
      };
    }
    if (err instanceof HostScriptError && err.code === "owner-conflict") {
      ctx.log.warn("teardown left an instance that is not ours", { exporter: e.metadata.name, error: err.message });
      return { reason: OWNER_CONFLICT, message: `left ${e.metadata.name} on ${where} as it is: ${err.message}` };
    }
    return {
      reason: "TeardownFailed",
      message: `teardown of ${e.metadata.name} on ${where} failed, will retry: ${errorText(err)}`,
    };
  }
}

/**
 * Exporters of a set that is gone (`current` is the set now under that name, if any): ours are deleted (see
 * deleteOwnerless), then torn down behind our finalizer with the credentials of a class of theirs still there, with
 * those that `joins` takes meanwhile (finalizeAll). Exporters that are not ours are left as they are.
 */
export async function orphaned(
  ctx: Context,
  current: ExporterSet | undefined,
  stale: Exporter[],
  joins: (e: Exporter) => boolean,
): Promise<Outcome> {
  await deleteOwnerless(ctx, current, stale);
  for (const e of stale.filter((e) => e.metadata.deletionTimestamp && !isOurs(e))) {
    if (!e.metadata.finalizers?.includes(FINALIZER)) continue;
    const message = `${e.metadata.name} carries our finalizer but not our label ${SET_LABEL}: not ours to tear ` +
      "down; it stays until its owner removes the finalizer";
    ctx.recorder.event(e, "Warning", "NotOurs", message);
    ctx.log.warn("an Exporter that is not ours carries our finalizer", { exporter: e.metadata.name });
  }
  const { requeueAfterMs } = await finalizeAll(
    ctx,
    undefined,
    stale.filter((e) => e.metadata.deletionTimestamp && isOurs(e)),
    [],
    true,
    (e) => isOurs(e) && joins(e),
  );
  return requeueAfterMs === undefined ? {} : { requeueAfterMs };
}

/**
 * Finalizes Exporters being deleted, in parallel as deploys are (one unreachable host must not hold up the instances
 * on the others), each with `targets` first, then the credentials of the classes in its namespace, then those
 * remembered for its host. `owner`: the set whose Events tell of it; none for the Exporters of a set that is gone.
 * Returns the problems, when to look again (for a retry, and at the latest when a grace ends), and the uids of those
 * that joined.
 *
 * The deletions of a set's Exporters reach the cache one after another, and the first one's event starts the
 * reconcile: one that waited for the next run, after this one's removes, removed a second instance from the same host
 * only once the first was gone (most of a 2x2 teardown, bench/results/quick.md). So while the removes run, Exporters
 * that `joins` takes and that are being deleted now join them.
 */
export async function finalizeAll(
  ctx: Context,
  owner: ExporterSet | undefined,
  doomed: Exporter[],
  targets: LabTarget[],
  setDeleted: boolean,
  joins: (e: Exporter) => boolean = () => false,
): Promise<{ problems: Problem[]; requeueAfterMs?: number; joined: Set<string> }> {
  const { results, joined } = await withJoiners(
    ctx.exporterChanges,
    doomed,
    () => ctx.caches.exporters.list(doomed[0].metadata.namespace),
    (e) => !!e.metadata.deletionTimestamp && joins(e),
    (e) => finalize(ctx, owner ?? e, e, [...targets, ...deployedTargets(ctx.caches, ctx.provisioner, e)], setDeleted),
  );
  const all = [...doomed, ...joined];
  const problems = [...results.values()].filter((p): p is Problem => p !== undefined);
  const uids = new Set(joined.map((e) => e.metadata.uid!));
  if (!problems.length) return { problems, joined: uids };
  const graceEnds = Math.min(...all.map((e) => graceLeftMs(ctx, e)).filter((ms) => ms > 0));
  return {
    problems,
    requeueAfterMs: Math.min(retryAfterMs(ctx.resyncMs, problems), Math.max(1_000, graceEnds)),
    joined: uids,
  };
}

/**
 * Deletes our Exporters whose owner reference names a set that no longer exists, instead of waiting for the garbage
 * collector: its client-side rate limit (20 requests/s by default) made deleting 500 sets of 8 take minutes
 * (bench/results/scale-findings.md). Only once the API confirms the owner is gone, as the sets' cache may lag the
 * Exporters'; and only the version seen, so an Exporter orphaned meanwhile (`kubectl delete --cascade=orphan` has the
 * garbage collector drop the owner reference before the set goes) is left alone: its delete fails its precondition.
 */
async function deleteOwnerless(ctx: Context, current: ExporterSet | undefined, stale: Exporter[]): Promise<void> {
  const candidates = stale.filter((e) => !e.metadata.deletionTimestamp && isOurs(e) && setOwner(e));
  if (!candidates.length) return;
  const { namespace } = candidates[0].metadata;
  const owner = current ?? await ctx.client.find<ExporterSet>(EXPORTER_SETS, namespace, setOwner(candidates[0])!.name);
  const doomed = candidates.filter((e) => setOwner(e)!.uid !== owner?.metadata.uid);
  await Promise.all(
    doomed.map((e) =>
      ctx.client.delete(EXPORTERS, namespace, e.metadata.name!, { resourceVersion: e.metadata.resourceVersion })
        .catch((err) => {
          if (!isConflict(err)) throw err;
        })
    ),
  );
  if (doomed.length) {
    ctx.log.info("deleting the Exporters of a deleted ExporterSet", {
      exporterSet: `${namespace}/${setOwner(doomed[0])!.name}`,
      exporters: doomed.length,
    });
  }
}
