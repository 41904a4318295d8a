/** Jumpstarter's word on leases and on exporters being online, read from the cached Leases and Exporters. Pure. */
import type { Exporter, ExporterSet, Lease } from "../api/types.ts";
import { selectorMatches } from "./plan.ts";

export function isLeased(e: Exporter, leases: Lease[]): boolean {
  return leaseHolding(e, leases) !== undefined;
}

/** The name of the lease under way on the Exporter, if any. */
export function leaseHolding(e: Exporter, leases: Lease[]): string | undefined {
  return e.status?.leaseRef?.name ||
    leases.find((l) => !l.status?.ended && l.status?.exporterRef?.name === e.metadata.name)?.metadata.name;
}

/** None names the Exporter, one is under way, or the one it had has ended. */
export function leaseState(e: Exporter, leases: Lease[]): "none" | "active" | "ended" {
  if (isLeased(e, leases)) return "active";
  return leases.some((l) => l.status?.ended && l.status?.exporterRef?.name === e.metadata.name) ? "ended" : "none";
}

/** A set that may serve pending leases, with how many more exporters its maxReplicas lets it add for them. */
export interface DemandTaker {
  set: ExporterSet;
  room: number;
}

/**
 * Pending Leases (not bound to any exporter) that are this set's demand. Each lease, oldest first, counts for exactly
 * one set: the oldest matching set that still has room, so demand spills over to the next set (the seed's "one set
 * per host") instead of piling up on one at maxReplicas. A lease no matching set has room for stays with the oldest
 * match, whose ScalingLimited then says so. Counting a lease for several sets would grow an exporter in each.
 */
export function pendingDemand(set: ExporterSet, takers: DemandTaker[], leases: Lease[]): number {
  const labels = (s: ExporterSet) => s.spec.template?.metadata?.labels ?? {};
  const byAge = <T extends { metadata: { creationTimestamp?: string; name?: string } }>(xs: T[]) =>
    [...xs].sort((a, b) =>
      (a.metadata.creationTimestamp ?? "").localeCompare(b.metadata.creationTimestamp ?? "") ||
      a.metadata.name!.localeCompare(b.metadata.name!)
    );
  const oldestFirst = byAge(takers.map((t) => t.set)).map((s) => takers.find((t) => t.set === s)!);
  const room = new Map(oldestFirst.map((t) => [t.set.metadata.uid, t.room]));
  let mine = 0;
  for (const l of byAge(leases)) {
    if (l.status?.ended || l.status?.exporterRef || l.spec?.exporterRef) continue;
    const matching = oldestFirst.filter((t) => selectorMatches(l.spec?.selector, labels(t.set)));
    const taker = matching.find((t) => room.get(t.set.metadata.uid)! > 0) ?? matching[0];
    if (!taker) continue;
    room.set(taker.set.metadata.uid, room.get(taker.set.metadata.uid)! - 1);
    if (taker.set.metadata.uid === set.metadata.uid) mine++;
  }
  return mine;
}

/** Jumpstarter's view: true = online, false = reported offline, undefined = not reported yet. */
export function onlineReport(e: Exporter): boolean | undefined {
  const online = e.status?.conditions?.find((c) => c.type === "Online");
  return online ? online.status === "True" : undefined;
}
