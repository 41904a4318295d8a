/**
 * Exporters going away: remove the instance from the host it was deployed to, then drop our finalizer; and the
 * Exporters of a set that is gone.
 */
import type { Exporter, ExporterSet } from "../api/types.ts";
import { isConflict, isNotFound } from "../kube/client.ts";
import type { Outcome } from "../kube/queue.ts";
import { EXPORTERS } from "../kube/resources.ts";
import type { LabTarget } from "./credentials.ts";
import type { Context } from "./context.ts";
import { FINALIZER, RECLAIM_ANNOTATION } from "./marks.ts";
import { errorText, retryAfterMs } from "./problems.ts";
import type { Problem } from "./status.ts";
import { deployedTarget, parseTarget, TARGET_ANNOTATION } from "./targets.ts";

/** Tears down a deleted Exporter's instance, then removes our finalizer. Returns a problem if it cannot. */
export async function finalize(
  ctx: Context,
  owner: ExporterSet | Exporter,
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
export async function orphaned(ctx: Context, ns: string, owned: Exporter[]): Promise<Outcome> {
  // in parallel, as deploys are: one unreachable host must not hold up the instances on the others
  const results = await Promise.all(owned.map(async (e) => {
    if (e.metadata.deletionTimestamp) {
      const retain = e.metadata.annotations?.[RECLAIM_ANNOTATION] === "Retain";
      return await finalize(ctx, e, e, deployedTarget(ctx.caches, ctx.provisioner, e), retain);
    }
    await ctx.client.delete(EXPORTERS, ns, e.metadata.name!);
  }));
  const problems = results.filter((p): p is Problem => p !== undefined);
  if (problems.length) return { requeueAfterMs: retryAfterMs(ctx.resyncMs, problems) };
  return owned.length ? { requeueAfterMs: 1_000 } : {};
}
