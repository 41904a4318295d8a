/**
 * Where the instances of a pooled ExporterSet (`parameters.hosts`) run: which host takes each new instance, which
 * instances leave a host that went silent or left the pool, and the per-host rows of the status. Pure: the pool, the
 * instances and what the controller's SSH attempts saw of each host come in, the decisions go out.
 */

/** A host of the pool as placement sees it. `key` names the sshd (hostKey), `slots` undefined is unbounded. */
export interface SlotHost {
  key: string;
  name: string;
  slots?: number;
}

/** What the controller's SSH attempts last saw of a host: since when they fail, and how. */
export interface Reach {
  failingSince?: number;
  lastError?: string;
}

/** A live instance of the set: the host it was placed on (undefined: not placed yet). */
export interface Placed {
  name: string;
  host?: string;
  leased: boolean;
}

/** The key of a host: the sshd it names (DNS names compare case-insensitively, as targets.ts sameHost does). */
export const hostKey = (name: string, port: number) => `${name.toLowerCase()}:${port}`;

const free = (h: SlotHost, count: number) => (h.slots ?? Infinity) - count;

/**
 * The hosts for `n` new instances, one at a time to the host with the most free slots, then the fewest instances
 * (hosts without slots), then the first name; never above a host's slots, never on a host in `avoid`. Fewer than
 * `n` when the pool is full.
 */
export function placeNew(hosts: SlotHost[], counts: ReadonlyMap<string, number>, avoid: Set<string>, n: number) {
  const now = new Map(counts);
  const out: string[] = [];
  for (let i = 0; i < n; i++) {
    const best = hosts.filter((h) => !avoid.has(h.key) && free(h, now.get(h.key) ?? 0) > 0).sort((a, b) => {
      const [ca, cb] = [now.get(a.key) ?? 0, now.get(b.key) ?? 0];
      return free(b, cb) - free(a, ca) || ca - cb || a.name.localeCompare(b.name) || a.key.localeCompare(b.key);
    })[0];
    if (!best) break;
    out.push(best.key);
    now.set(best.key, (now.get(best.key) ?? 0) + 1);
  }
  return out;
}

export interface FailoverInput {
  hosts: SlotHost[];
  instances: Placed[];
  reach: ReadonlyMap<string, Reach>;
  now: number;
  failoverMs: number;
}

export interface Failover {
  /** Idle instances to drain and remove, replaced through the count: their host failed over or left the pool. */
  evict: string[];
  /** Leased instances on such a host: kept where they are until their lease ends, and reported. */
  held: { name: string; host: string; why: string }[];
  /** Hosts given to instances not placed yet (per instance name). */
  assign: Map<string, string>;
  /** Hosts no new instance goes to now: unreachable (for any time), or past the failover timeout. */
  avoid: Set<string>;
  /** Instances per host after the above, for the placement of new ones. */
  counts: Map<string, number>;
  /** When the next host crosses its failover timeout, in ms from now (undefined: none is failing). */
  nextInMs?: number;
}

/**
 * Which instances move. A host failed over (unreachable for failoverMs or longer) or no longer in the pool loses its
 * idle instances, never its leased ones; a host that is back takes new instances through its free slots, and nothing
 * moves back to it.
 */
export function failover(i: FailoverInput): Failover {
  const inPool = new Set(i.hosts.map((h) => h.key));
  const failingFor = (key: string) => {
    const since = i.reach.get(key)?.failingSince;
    return since === undefined ? undefined : i.now - since;
  };
  const failedOver = (key: string) => (failingFor(key) ?? -1) >= i.failoverMs;
  const avoid = new Set(i.hosts.filter((h) => failingFor(h.key) !== undefined).map((h) => h.key));
  const out: Failover = { evict: [], held: [], assign: new Map(), avoid, counts: new Map() };
  const unplaced: Placed[] = [];
  for (const e of i.instances) {
    if (e.host === undefined) {
      unplaced.push(e);
      continue;
    }
    const why = !inPool.has(e.host)
      ? "its host left the pool"
      : failedOver(e.host)
      ? `its host has been unreachable for ${Math.round(failingFor(e.host)! / 1000)}s`
      : undefined;
    if (why && !e.leased) out.evict.push(e.name);
    else {
      if (why) out.held.push({ name: e.name, host: e.host, why: `${why}; it stays while leased` });
      out.counts.set(e.host, (out.counts.get(e.host) ?? 0) + 1);
    }
  }
  const spots = placeNew(i.hosts, out.counts, avoid, unplaced.length);
  unplaced.forEach((e, n) => {
    if (n >= spots.length) return;
    out.assign.set(e.name, spots[n]);
    out.counts.set(spots[n], (out.counts.get(spots[n]) ?? 0) + 1);
  });
  const waits = i.hosts.map((h) => failingFor(h.key)).filter((t) => t !== undefined && t < i.failoverMs)
    .map((t) => i.failoverMs - t!);
  if (waits.length) out.nextInMs = Math.min(...waits);
  return out;
}

/** A row of `status.hosts`. */
export interface HostRow {
  name: string;
  instances: number;
  slots?: number;
  reachable: boolean;
  lastError?: string;
}

/** The status rows: every host of the pool, then hosts that left it while instances remain there. */
export function hostRows(
  hosts: SlotHost[],
  counts: ReadonlyMap<string, number>,
  reach: ReadonlyMap<string, Reach>,
  names: ReadonlyMap<string, string>,
): HostRow[] {
  const row = (key: string, name: string, slots?: number): HostRow => {
    const r = reach.get(key);
    const out: HostRow = { name, instances: counts.get(key) ?? 0, reachable: r?.failingSince === undefined };
    if (slots !== undefined) out.slots = slots;
    if (r?.failingSince !== undefined && r.lastError) out.lastError = r.lastError;
    return out;
  };
  const inPool = new Set(hosts.map((h) => h.key));
  const gone = [...counts.keys()].filter((k) => !inPool.has(k) && (counts.get(k) ?? 0) > 0).sort();
  return [...hosts.map((h) => row(h.key, h.name, h.slots)), ...gone.map((k) => row(k, names.get(k) ?? k, 0))];
}

/** `status.hostSummary`, the printer column: "lab-a 2/2, lab-b 1/4, lab-c 0/2 unreachable". */
export const hostSummary = (rows: HostRow[]) =>
  rows.map((r) => `${r.name} ${r.instances}/${r.slots ?? "-"}${r.reachable ? "" : " unreachable"}`).join(", ");

/** The ScalingLimited message when the pool has no room for `short` more instances, naming each host's fill. */
export function slotsFullMessage(rows: HostRow[], short: number): string {
  const each = rows.map((r) =>
    `${r.name} ${r.instances}/${r.slots ?? "unbounded"}${r.reachable ? "" : " (unreachable)"}`
  ).join(", ");
  return `${short} more exporters wanted, but the pool's hosts have no free slots: ${each}; raise slots or add ` +
    "hosts to parameters.hosts";
}
