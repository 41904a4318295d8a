/** Jumpstarter's word on leases, read from the cached Leases and Exporters. Pure. */
import type { Exporter, ExporterSet, Lease } from "../api/types.ts";
import { selectorMatches } from "./plan.ts";

export function isLeased(e: Exporter, leases: Lease[]): boolean {
  if (e.status?.leaseRef?.name) return true;
  return leases.some((l) => !l.status?.ended && l.status?.exporterRef?.name === e.metadata.name);
}

/** None names the Exporter, one is under way, or the one it had has ended. */
export function leaseState(e: Exporter, leases: Lease[]): "none" | "active" | "ended" {
  if (isLeased(e, leases)) return "active";
  return leases.some((l) => l.status?.ended && l.status?.exporterRef?.name === e.metadata.name) ? "ended" : "none";
}

/** Pending Leases (not bound to any exporter) whose selector matches the set's template labels. */
export function pendingDemand(set: ExporterSet, leases: Lease[]): number {
  const labels = set.spec.template?.metadata?.labels ?? {};
  return leases.filter((l) =>
    !l.status?.ended && !l.status?.exporterRef && !l.spec?.exporterRef && selectorMatches(l.spec?.selector, labels)
  ).length;
}
