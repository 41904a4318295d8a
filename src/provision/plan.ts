/**
 * Scaling decisions for one ExporterSet, as upstream defines them. Pure: the world comes in as data (time too), the
 * actions go out as data, and the reconciler carries them out.
 */
import { DEFAULTS, type ExporterSetSpec, type LabelSelector } from "../api/types.ts";

/** What the reconciler knows about one Exporter of the set. */
export interface ExporterView {
  name: string;
  /** `spec.enabled`; false while draining before removal. */
  enabled: boolean;
  leased: boolean;
  deleting: boolean;
  /**
   * Jumpstarter says its lease ended (a Lease naming it has status.ended). ExitAndReplace gives every lease a fresh
   * instance, whether or not the exporter process exited by itself: an exit alone is no evidence (`jmp run` also exits
   * 0 after failing to reach the controller), and released exporters may ignore exitOnLeaseEnd.
   */
  leaseEnded: boolean;
  createdAt: string;
}

export interface PlanInput {
  spec: ExporterSetSpec;
  exporters: ExporterView[];
  /** Pending leases whose selector matches the template (counted only for WaitForFirstConsumer). */
  pendingDemand: number;
  waitForFirstConsumer: boolean;
  /** From status: since when more exporters than needed have been running. */
  surplusSince?: string;
  now: Date;
}

export interface Plan {
  desired: number;
  /** The desired count before the maxReplicas cap. */
  wanted: number;
  create: number;
  /** Re-enable these drained exporters instead of creating new ones. */
  enable: string[];
  /** Disable these idle exporters (first step of scale-down). */
  drain: string[];
  /** Delete these Exporters; the finalizer tears down their host instance. */
  delete: string[];
  /** ExitAndReplace: delete these Exporters whose lease ended, once disabled and still unleased (upstream #935). */
  recycle: string[];
  surplusSince?: string;
  /** When to look again even if nothing changes (cooldown end). */
  requeueAfterMs?: number;
}

export function withDefaults(spec: ExporterSetSpec) {
  return {
    minReplicas: spec.minReplicas ?? DEFAULTS.minReplicas,
    maxReplicas: spec.maxReplicas ?? DEFAULTS.maxReplicas,
    minAvailableReplicas: spec.minAvailableReplicas ?? DEFAULTS.minAvailableReplicas,
    scaleDownCooldown: spec.scaleDownCooldown ?? DEFAULTS.scaleDownCooldown,
    recycleStrategy: spec.recycleStrategy ?? DEFAULTS.recycleStrategy,
  };
}

/** Parses a Go duration ("5m", "1h30m", "90s", "1.5h") into milliseconds. */
export function parseDuration(s: string): number {
  const unit: Record<string, number> = { ns: 1e-6, us: 1e-3, "µs": 1e-3, ms: 1, s: 1e3, m: 60e3, h: 3600e3 };
  const re = /([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s|m|h)/gy;
  let total = 0;
  let matched = 0;
  for (let m = re.exec(s); m; m = re.exec(s)) {
    total += parseFloat(m[1]) * unit[m[2]];
    matched = re.lastIndex;
  }
  if (s === "" || matched !== s.length) throw new Error(`invalid duration "${s}" (use e.g. 90s, 5m, 1h30m)`);
  return total;
}

export function desiredCount(
  spec: ExporterSetSpec,
  leased: number,
  pendingDemand: number,
): { desired: number; wanted: number } {
  const s = withDefaults(spec);
  const wanted = Math.max(s.minReplicas, leased + s.minAvailableReplicas + pendingDemand);
  const desired = s.maxReplicas === 0 ? wanted : Math.min(wanted, s.maxReplicas);
  return { desired, wanted };
}

/** How many pending leases can still raise the set's count before maxReplicas caps it. */
export function demandRoom(spec: ExporterSetSpec, leased: number): number {
  const s = withDefaults(spec);
  return s.maxReplicas === 0 ? Infinity : Math.max(0, s.maxReplicas - leased - s.minAvailableReplicas);
}

export function plan(input: PlanInput): Plan {
  const s = withDefaults(input.spec);
  const live = input.exporters.filter((e) => !e.deleting);
  const leased = live.filter((e) => e.leased).length;
  const demand = input.waitForFirstConsumer ? input.pendingDemand : 0;
  const { desired, wanted } = desiredCount(input.spec, leased, demand);

  // ExitAndReplace: an instance whose lease ended is removed and replaced by a fresh one.
  const recycled = s.recycleStrategy === "ExitAndReplace" ? live.filter((e) => e.leaseEnded && !e.leased) : [];
  const recycledNames = new Set(recycled.map((e) => e.name));
  const candidates = live.filter((e) => !recycledNames.has(e.name));
  const enabled = candidates.filter((e) => e.enabled);
  const draining = candidates.filter((e) => !e.enabled);

  const out: Plan = { desired, wanted, create: 0, enable: [], drain: [], delete: [], recycle: [...recycledNames] };

  if (enabled.length < desired) {
    const missing = desired - enabled.length;
    out.enable = oldestFirst(draining).slice(0, missing).map((e) => e.name);
    out.create = missing - out.enable.length;
    const reenabled = new Set(out.enable);
    out.delete.push(...draining.filter((e) => !reenabled.has(e.name) && !e.leased).map((e) => e.name));
    return out;
  }

  // Drained exporters that are no longer leased are finished: delete them (the finalizer tears down the host).
  out.delete.push(...draining.filter((e) => !e.leased).map((e) => e.name));

  const surplus = enabled.length - desired;
  if (surplus === 0) return out;
  const since = input.surplusSince ? new Date(input.surplusSince) : input.now;
  out.surplusSince = since.toISOString();
  const waited = input.now.getTime() - since.getTime();
  const cooldown = parseDuration(s.scaleDownCooldown);
  if (waited < cooldown) {
    out.requeueAfterMs = cooldown - waited;
    return out;
  }
  // Leased exporters are never touched; drain the newest idle ones first (the oldest are the warmest).
  const idle = enabled.filter((e) => !e.leased);
  out.drain = newestFirst(idle).slice(0, surplus).map((e) => e.name);
  out.surplusSince = undefined;
  return out;
}

const oldestFirst = (xs: ExporterView[]) => [...xs].sort((a, b) => a.createdAt.localeCompare(b.createdAt));
const newestFirst = (xs: ExporterView[]) => oldestFirst(xs).reverse();

/** Whether a label selector matches a set of labels (an absent selector matches nothing). */
export function selectorMatches(selector: LabelSelector | undefined, labels: Record<string, string>): boolean {
  if (!selector) return false;
  for (const [k, v] of Object.entries(selector.matchLabels ?? {})) if (labels[k] !== v) return false;
  for (const e of selector.matchExpressions ?? []) {
    const has = e.key in labels;
    const inValues = has && (e.values ?? []).includes(labels[e.key]);
    if (e.operator === "In" && !inValues) return false;
    if (e.operator === "NotIn" && inValues) return false;
    if (e.operator === "Exists" && !has) return false;
    if (e.operator === "DoesNotExist" && has) return false;
  }
  return true;
}

/** The string form of a selector for `status.selector` (the scale subresource's labelSelectorPath). */
export function selectorString(labels: Record<string, string>): string {
  return Object.entries(labels).sort(([a], [b]) => a.localeCompare(b)).map(([k, v]) => `${k}=${v}`).join(",");
}
