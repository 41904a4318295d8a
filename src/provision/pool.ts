/**
 * A pooled set's reconcile in terms of placement.ts: its Exporters and their target annotations in, where each is
 * deployed, which leave their host, where new ones go and the status rows out. Pure.
 */
import type { Exporter } from "../api/types.ts";
import type { Placement } from "./params.ts";
import { type Failover, failover, hostKey, type HostRow, hostRows, placeNew, type Reach } from "./placement.ts";
import { annotatedTarget, type HostTarget, targetString } from "./targets.ts";
import type { Waits } from "./status.ts";

export interface PoolInput {
  hosts: HostTarget[];
  placement: Placement;
  live: Exporter[];
  leased: (e: Exporter) => string | undefined;
  /** Exporters created by this process and not in the cache yet, with the target each was placed on. */
  pending: { name: string; where?: string }[];
  reach: ReadonlyMap<string, Reach>;
  now: number;
}

export interface PoolPlan {
  failover: Failover;
  /** Where an Exporter is deployed now; undefined: it is leaving its host (evicted, or held outside the pool). */
  placeOf: (e: Exporter) => HostTarget | undefined;
  /** Leased instances held on a host they would leave, as the status tells it. */
  held: ({ name: string } & Waits)[];
  /** Targets (annotation form) for up to `n` new instances; fewer when the pool is full. */
  placeNew: (n: number) => string[];
  rows: (placedNew: string[]) => HostRow[];
  /** Pool hosts that do not answer now, as problems (they also make the set look again soon). */
  unreachable: { reason: string; message: string }[];
}

const keyOf = (t: { host: string; port: number }) => hostKey(t.host, t.port);

export function poolPlan(i: PoolInput): PoolPlan {
  const byKey = new Map(i.hosts.map((h) => [h.key, h]));
  const slotHosts = i.hosts.map((h) => ({ key: h.key, name: h.host.name, slots: h.host.slots }));
  const names = new Map<string, string>();
  const hostOf = (e: Exporter) => {
    const t = annotatedTarget(e);
    if (t) names.set(keyOf(t), t.host);
    return t && keyOf(t);
  };
  const pendingHost = (where?: string) => {
    const m = where ? /@(.+):(\d+)$/.exec(where) : null;
    return m ? hostKey(m[1], Number(m[2])) : undefined;
  };
  const fo = failover({
    hosts: slotHosts,
    instances: [
      ...i.live.map((e) => ({ name: e.metadata.name!, host: hostOf(e), leased: i.leased(e) !== undefined })),
      ...i.pending.map((p) => ({ name: p.name, host: pendingHost(p.where), leased: false })),
    ],
    reach: i.reach,
    now: i.now,
    failoverMs: i.placement.failoverMs,
  });
  const evicted = new Set(fo.evict);
  const heldBy = new Map(fo.held.map((h) => [h.name, h]));
  const held = i.live.flatMap((e) => {
    const h = heldBy.get(e.metadata.name!);
    return h ? [{ name: h.name, lease: i.leased(e), what: `stays on ${names.get(h.host) ?? h.host}: ${h.why}` }] : [];
  });
  const placeOf = (e: Exporter) => {
    if (evicted.has(e.metadata.name!)) return undefined;
    const key = fo.assign.get(e.metadata.name!) ?? hostOf(e);
    return key === undefined ? undefined : byKey.get(key);
  };
  const unreachable = i.hosts.flatMap((h) => {
    const since = i.reach.get(h.key)?.failingSince;
    if (since === undefined) return [];
    const secs = Math.round((i.now - since) / 1000);
    const fails = Math.round(i.placement.failoverMs / 1000);
    return [{
      reason: "HostUnreachable",
      message: `pool host ${h.host.name} has not answered for ${secs}s (${i.reach.get(h.key)?.lastError}); its idle ` +
        `instances move to other hosts after ${fails}s (parameters.hostFailureTimeout)`,
    }];
  });
  return {
    failover: fo,
    placeOf,
    held,
    placeNew: (n) => placeNew(slotHosts, fo.counts, fo.avoid, n).map((k) => targetString(byKey.get(k)!.target)),
    rows: (placedNew) => {
      const counts = new Map(fo.counts);
      for (const w of placedNew) {
        const k = pendingHost(w)!;
        counts.set(k, (counts.get(k) ?? 0) + 1);
      }
      return hostRows(slotHosts, counts, i.reach, names);
    },
    unreachable,
  };
}
