/**
 * The orphan sweep: instances on our hosts whose Exporter no longer exists (left behind by a controller killed
 * mid-way, an Exporter deleted behind our back, or one whose teardown was given up after its grace) are removed; only
 * those carrying this controller's identity (cluster and provisioner), so clusters sharing a host never touch each
 * other's instances.
 */
import { abortableSleep } from "../kube/backoff.ts";
import type { LabTarget } from "./credentials.ts";
import type { Context } from "./context.ts";
import { forgetOldInspections, inspectHost } from "./host_checks.ts";
import { hostTargets, targetString } from "./targets.ts";
import { candidateTargets, withFirstTaken } from "./known_targets.ts";
import { mapAtMost } from "./at_most.ts";

/**
 * Hosts inspected at once by a pass: all at once, a pass over 500 hosts made the controller's peak memory
 * (at_most.ts); at 16, a pass is 32 turns of one inspection each, well inside the 5-minute interval.
 */
const HOSTS_AT_ONCE = 16;

/**
 * Sweeps every `everyMs` until `signal` aborts; a failed sweep is logged and the next one tries again. Each pass
 * takes a host's inspection from the resync checks when one began since the previous pass.
 */
export async function sweepLoop(ctx: Context, namespace: string | undefined, everyMs: number, signal: AbortSignal) {
  while (!signal.aborted) {
    await abortableSleep(everyMs, signal);
    if (signal.aborted) break;
    const since = ctx.now().getTime() - everyMs;
    await sweep(ctx, namespace, since).catch((e) => ctx.log.warn("orphan sweep failed", { error: String(e) }));
    forgetOldInspections(ctx, since - Math.max(everyMs, ctx.resyncMs));
  }
}

/**
 * Removes instances on our hosts whose Exporter no longer exists, judged by an inspection of each host begun after
 * `since` (default: just now). Returns how many were removed. Hosts are swept HOSTS_AT_ONCE at a time, each on its
 * own: one that is down neither stops the sweep of the others nor holds more than its own turn. With a namespace,
 * instances of other namespaces are not ours to judge.
 */
export async function sweep(ctx: Context, namespace: string | undefined, since?: number): Promise<number> {
  const from = since ?? ctx.now().getTime();
  const ways = new Map(hostTargets(ctx.caches, ctx.provisioner).map((t) => [targetString(t), [t]]));
  for (const [where, ts] of ctx.leftOn) ways.set(where, [...ways.get(where) ?? [], ...ts]);
  const removed = await mapAtMost([...ways], HOSTS_AT_ONCE, ([where, first]) =>
    // the current key first; one the host refuses (a rotation not on it yet) is followed by those it took before
    withFirstTaken(candidateTargets(ctx.knownTargets, where, first), (t) => sweepHost(ctx, namespace, t, from)).then(
      (n) => {
        ctx.leftOn.delete(where);
        return n;
      },
      (e) => {
        ctx.log.warn("orphan sweep of a host failed", { host: where, error: String(e) });
        return 0;
      },
    ));
  forgetGone(ctx);
  return removed.reduce((a, b) => a + b, 0);
}

async function sweepHost(ctx: Context, namespace: string | undefined, target: LabTarget, since: number) {
  const inspection = await inspectHost(ctx, target, since).result;
  // Read after the inspection: an instance deployed meanwhile had its Exporter cached before its apply began.
  const known = new Set(ctx.caches.exporters.list().map((e) => e.metadata.uid));
  let removed = 0;
  for (const inst of inspection.instances) {
    // another cluster's or provisioner's, or written before identities were: never ours to remove (those of ours are
    // adopted: their next apply writes our identity)
    if (inst.controller !== ctx.identity) continue;
    if (namespace && inst.namespace !== namespace) continue;
    if (inst.uid && known.has(inst.uid)) continue;
    if (!inst.uid || !inst.namespace) {
      ctx.log.warn("not sweeping what does not name its exporter's uid and namespace: it may not be ours", {
        host: target.host,
        instance: inst.name,
      });
      continue;
    }
    // reclaimPolicy Retain: the instance of a deleted set stays, also once a set of that name exists again (a
    // leftover of its own live set is still swept)
    if (
      inst.retain && (!inst.setUid || ctx.caches.sets.get(inst.namespace, inst.set ?? "")?.metadata.uid !== inst.setUid)
    ) {
      continue;
    }
    if (inst.ownerMismatch) {
      ctx.log.warn("not sweeping an instance whose files disagree about their owner", {
        host: target.host,
        instance: inst.name,
      });
      continue;
    }
    ctx.log.info("removing orphaned instance", { host: target.host, instance: inst.name, uid: inst.uid });
    await ctx.hosts.remove(target, inst.name, inst.uid);
    removed++;
  }
  return removed;
}

/** Drops the memory of Exporters that are gone: finalized ones, and those deleted behind our back. */
function forgetGone(ctx: Context): void {
  const known = new Set(ctx.caches.exporters.list().map((e) => e.metadata.uid));
  for (const memory of [ctx.applied, ctx.finalized]) {
    for (const uid of memory.keys()) if (!known.has(uid)) memory.delete(uid);
  }
}
