/**
 * ExporterSet status from what the reconciler saw: counts and the four upstream conditions, each with a message a
 * person can act on. Pure; `lastTransitionTime` moves only when a condition's status flips.
 */
import type { Condition, ExporterSetStatus } from "../api/types.ts";
import { type HostRow, hostSummary, slotsFullMessage } from "./placement.ts";

export interface ExporterState {
  name: string;
  enabled: boolean;
  leased: boolean;
  /** Both units active on the host, as of the last apply or inspect. */
  ready: boolean;
  /** Not ready yet, nothing down: its units are on their way up (not offline, not a problem). */
  starting?: boolean;
  /** Jumpstarter's own view: true = online, false = reported offline, undefined = not reported yet. */
  online?: boolean;
  /** Its host could not be looked at now: `ready` is as last seen. */
  unseen?: boolean;
  /** It runs an older definition (or on the set's old host) until this happens. */
  waitsFor?: Waits;
}

/** What an outdated instance waits for: the lease it serves (none: its turn to restart), in words. */
export interface Waits {
  lease?: string;
  what: string;
}

/** Something that keeps the set from being healthy, shown in Degraded (first one) and in events. */
export interface Problem {
  reason: string;
  message: string;
}

export interface StatusInput {
  generation?: number;
  old?: ExporterSetStatus;
  now: Date;
  selector: string;
  minReplicas: number;
  minAvailableReplicas: number;
  /** Undefined when the class is missing (nothing could be planned). */
  desired?: number;
  /** The count wanted before the maxReplicas cap. */
  wanted?: number;
  maxReplicas: number;
  exporters: ExporterState[];
  /** Exporters still waiting for Jumpstarter to issue their credentials. */
  waitingForCredentials: string[];
  problems: Problem[];
  classMissing?: string;
  surplusSince?: string;
  /** A pooled set's hosts (parameters.hosts), and how many wanted instances found no free slot. */
  hosts?: HostRow[];
  slotsShort?: number;
}

export function computeStatus(i: StatusInput): ExporterSetStatus {
  const ex = i.exporters;
  // ready means it can take a lease: units up, and not reported offline by Jumpstarter, whose word wins where it
  // has one (an exporter that gave up on its controller keeps its units up until it exits)
  const ready = ex.filter((e) => e.ready && e.online !== false);
  const leased = ex.filter((e) => e.leased);
  const available = ready.filter((e) => e.enabled && !e.leased);
  const offline = ex.filter((e) =>
    e.online === false || (!e.ready && !e.starting && !i.waitingForCredentials.includes(e.name))
  );
  const outdated = ex.filter((e) => e.waitsFor);
  const unseen = ex.filter((e) => e.unseen);
  const status: ExporterSetStatus = {
    observedGeneration: i.generation,
    replicas: ex.length,
    readyReplicas: ready.length,
    availableReplicas: available.length,
    unavailableReplicas: ex.length - ready.length,
    leasedReplicas: leased.length,
    updatedReplicas: ex.length - outdated.length,
    exportersActive: leased.length,
    exportersIdle: available.length,
    exportersDisabled: ex.filter((e) => !e.enabled).length,
    exportersOffline: offline.length,
    selector: i.selector,
    ...(i.surplusSince ? { surplusSince: i.surplusSince } : {}),
    ...(i.hosts ? { hosts: i.hosts, hostSummary: hostSummary(i.hosts) } : {}),
  };
  const conds: Omit<Condition, "lastTransitionTime">[] = [];
  const c = (type: string, ok: boolean | "Unknown", reason: string, message: string) =>
    conds.push({
      type,
      status: ok === "Unknown" ? ok : ok ? "True" : "False",
      reason,
      message,
      observedGeneration: i.generation,
    });

  if (i.classMissing !== undefined) {
    const msg = `VirtualTargetClass "${i.classMissing}" not found in this namespace: create it or fix ` +
      `spec.virtualTargetClassName`;
    c("Available", false, "VirtualTargetClassNotFound", msg);
    c("Progressing", false, "VirtualTargetClassNotFound", msg);
    c("Degraded", true, "VirtualTargetClassNotFound", msg);
    c("ScalingLimited", false, "WithinLimits", "nothing to scale without a class");
    return { ...status, conditions: merge(i.old?.conditions, conds, i.now) };
  }

  const desired = i.desired ?? 0;
  if (unseen.length) {
    c(
      "Available",
      "Unknown",
      "InstancesUnseen",
      `cannot look at ${unseen.map((e) => e.name).join(", ")} on the host now (see Degraded); counting them as last ` +
        `seen: ${available.length} idle of ${ready.length} ready exporters`,
    );
  } else if (desired === 0 && ex.length === 0) {
    c(
      "Available",
      true,
      "NoReplicasRequired",
      "no exporters are required (minReplicas and minAvailableReplicas are 0)",
    );
  } else if (desired > 0 && ready.length === 0 && ex.length > 0) {
    // minimums of 0 are met by nothing, but a set that runs exporters none of which can take a lease is not available
    c(
      "Available",
      false,
      "MinimumReplicasUnavailable",
      `none of ${ex.length} exporters can take a lease` +
        (offline.length ? ` (offline: ${offline.map((e) => e.name).join(", ")})` : ""),
    );
  } else if (available.length >= i.minAvailableReplicas && ready.length >= i.minReplicas) {
    c("Available", true, "MinimumReplicasAvailable", `${available.length} idle of ${ready.length} ready exporters`);
  } else {
    c(
      "Available",
      false,
      "MinimumReplicasUnavailable",
      `${available.length} idle exporters, ${i.minAvailableReplicas} wanted; ${ready.length} ready, ` +
        `${i.minReplicas} minimum`,
    );
  }

  if (i.waitingForCredentials.length) {
    c(
      "Progressing",
      true,
      "WaitingForCredentials",
      `waiting for Jumpstarter to issue credentials to ${i.waitingForCredentials.join(", ")} ` +
        "(status.credential and status.endpoint)",
    );
  } else if (outdated.length) {
    const waits = outdated.map((e) => `${e.name}: ${e.waitsFor!.what}`).join("; ");
    c(
      "Progressing",
      true,
      outdated.some((e) => e.waitsFor!.lease) ? "WaitingForLease" : "RollingUpdate",
      `${outdated.length} of ${ex.length} exporters run an older definition; ${waits}`,
    );
  } else if (ready.length < desired || ex.length !== desired) {
    c("Progressing", true, "ReplicasNotReady", `${ready.length} of ${desired} exporters ready (${ex.length} exist)`);
  } else {
    c("Progressing", false, "AllReplicasReady", `all ${desired} exporters are ready`);
  }

  if (i.problems.length) {
    const [first, ...rest] = i.problems;
    c("Degraded", true, first.reason, first.message + (rest.length ? ` (and ${rest.length} more problems)` : ""));
  } else if (offline.length) {
    c("Degraded", true, "ExportersOffline", `offline: ${offline.map((e) => e.name).join(", ")}`);
  } else {
    c("Degraded", false, "AllReplicasHealthy", "all exporters are healthy");
  }

  const capped = i.maxReplicas !== 0 && (i.wanted ?? 0) > i.maxReplicas;
  if (capped) {
    c(
      "ScalingLimited",
      true,
      "AtMaxReplicas",
      `${i.wanted} exporters wanted, capped at maxReplicas ${i.maxReplicas}: raise maxReplicas or add an ` +
        "ExporterSet for another host",
    );
  } else if (i.hosts && i.slotsShort) {
    c("ScalingLimited", true, "HostSlotsFull", slotsFullMessage(i.hosts, i.slotsShort));
  } else {
    c(
      "ScalingLimited",
      false,
      "WithinLimits",
      `within maxReplicas ${i.maxReplicas === 0 ? "(unbounded)" : i.maxReplicas}`,
    );
  }
  return { ...status, conditions: merge(i.old?.conditions, conds, i.now) };
}

function merge(
  old: Condition[] | undefined,
  fresh: Omit<Condition, "lastTransitionTime">[],
  now: Date,
): Condition[] {
  return fresh.map((c) => {
    const prev = old?.find((o) => o.type === c.type);
    const lastTransitionTime = prev && prev.status === c.status && prev.lastTransitionTime
      ? prev.lastTransitionTime
      : now.toISOString();
    return { ...c, lastTransitionTime };
  });
}

/** Whether writing `next` would change what the API server holds (ignores key order). */
export function statusChanged(old: ExporterSetStatus | undefined, next: ExporterSetStatus): boolean {
  return canonical(old ?? {}) !== canonical(next);
}

function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(",")}]`;
  if (v && typeof v === "object") {
    return `{${
      Object.entries(v).filter(([, x]) => x !== undefined).sort(([a], [b]) => a.localeCompare(b))
        .map(([k, x]) => `${JSON.stringify(k)}:${canonical(x)}`).join(",")
    }}`;
  }
  return JSON.stringify(v);
}
