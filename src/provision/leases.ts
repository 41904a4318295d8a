/** Jumpstarter's word on leases, read from the cached Leases and Exporters. Pure. */
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

/**
 * Pending Leases (not bound to any exporter) whose selector matches the set's template labels. A lease several sets
 * match is demand of the oldest of them only, else every one of them would grow an exporter for the same lease.
 */
export function pendingDemand(set: ExporterSet, sets: ExporterSet[], leases: Lease[]): number {
  const labels = (s: ExporterSet) => s.spec.template?.metadata?.labels ?? {};
  const oldestFirst = [...sets].sort((a, b) =>
    (a.metadata.creationTimestamp ?? "").localeCompare(b.metadata.creationTimestamp ?? "") ||
    a.metadata.name!.localeCompare(b.metadata.name!)
  );
  return leases.filter((l) =>
    !l.status?.ended && !l.status?.exporterRef && !l.spec?.exporterRef &&
    oldestFirst.find((s) => selectorMatches(l.spec?.selector, labels(s)))?.metadata.uid === set.metadata.uid
  ).length;
}
