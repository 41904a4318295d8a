/**
 * Leader election on a coordination.k8s.io Lease, with client-go's timings (15 s lease, 10 s renew deadline, 2 s
 * retry). Only the holder reconciles; on SIGTERM the holder releases the Lease so a standby takes over at once.
 */
import type { KubeObject } from "../api/types.ts";
import { isConflict, isNotFound, type KubeClient } from "./client.ts";
import { COORDINATION_LEASES } from "./resources.ts";
import { abortableSleep } from "./backoff.ts";
import type { Logger } from "../observe/log.ts";

interface CoordinationLease extends KubeObject {
  spec: {
    holderIdentity?: string;
    leaseDurationSeconds?: number;
    acquireTime?: string;
    renewTime?: string;
    leaseTransitions?: number;
  };
}

export interface LeaderOptions {
  namespace: string;
  name: string;
  identity: string;
  leaseDurationMs?: number;
  renewDeadlineMs?: number;
  retryPeriodMs?: number;
  log: Logger;
}

export interface Leadership {
  /** Aborts when leadership is lost (renewals failed past the deadline). */
  lost: AbortSignal;
  /** Stops renewing and hands the Lease back. */
  release(): Promise<void>;
}

/** Waits until this process holds the Lease (or `signal` aborts, then returns undefined). */
export async function acquireLeadership(
  client: KubeClient,
  opts: LeaderOptions,
  signal: AbortSignal,
): Promise<Leadership | undefined> {
  const duration = opts.leaseDurationMs ?? 15_000;
  const retry = opts.retryPeriodMs ?? 2_000;
  let logged = false;
  while (!signal.aborted) {
    try {
      if (await tryAcquireOrRenew(client, opts, duration)) {
        opts.log.info("became leader", { lease: `${opts.namespace}/${opts.name}`, identity: opts.identity });
        return hold(client, opts, duration, retry);
      }
      if (!logged) opts.log.info("waiting for leadership", { lease: `${opts.namespace}/${opts.name}` });
      logged = true;
    } catch (e) {
      opts.log.warn("leader election attempt failed", { error: String(e) });
    }
    await abortableSleep(retry, signal);
  }
  return undefined;
}

function hold(client: KubeClient, opts: LeaderOptions, duration: number, retry: number): Leadership {
  const lost = new AbortController();
  const stop = new AbortController();
  const deadline = opts.renewDeadlineMs ?? 10_000;
  const loop = (async () => {
    let lastRenew = Date.now();
    while (!stop.signal.aborted) {
      await abortableSleep(retry, stop.signal);
      if (stop.signal.aborted) break;
      try {
        if (await tryAcquireOrRenew(client, opts, duration)) lastRenew = Date.now();
      } catch (e) {
        opts.log.warn("lease renewal failed", { error: String(e) });
      }
      if (Date.now() - lastRenew > deadline) {
        opts.log.error("leadership lost: could not renew the lease in time", { lease: opts.name });
        lost.abort();
        return;
      }
    }
  })();
  return {
    lost: lost.signal,
    async release() {
      stop.abort();
      await loop;
      if (lost.signal.aborted) return;
      const lease = await client.find<CoordinationLease>(COORDINATION_LEASES, opts.namespace, opts.name);
      if (lease?.spec.holderIdentity !== opts.identity) return;
      await client.replace(COORDINATION_LEASES, {
        ...lease,
        spec: { ...lease.spec, holderIdentity: "", leaseDurationSeconds: 1 },
      }).catch((e) => opts.log.warn("could not release the lease", { error: String(e) }));
    },
  };
}

async function tryAcquireOrRenew(client: KubeClient, opts: LeaderOptions, durationMs: number): Promise<boolean> {
  const now = new Date();
  const mine = {
    holderIdentity: opts.identity,
    leaseDurationSeconds: Math.round(durationMs / 1000),
    renewTime: micro(now),
  };
  let lease: CoordinationLease | undefined;
  try {
    lease = await client.get<CoordinationLease>(COORDINATION_LEASES, opts.namespace, opts.name);
  } catch (e) {
    if (!isNotFound(e)) throw e;
  }
  try {
    if (!lease) {
      await client.create<CoordinationLease>(COORDINATION_LEASES, {
        metadata: { name: opts.name, namespace: opts.namespace },
        spec: { ...mine, acquireTime: micro(now), leaseTransitions: 0 },
      });
      return true;
    }
    const s = lease.spec;
    const held = s.holderIdentity && s.holderIdentity !== opts.identity;
    const expiresAt = Date.parse(s.renewTime ?? "") + (s.leaseDurationSeconds ?? 0) * 1000;
    if (held && expiresAt > now.getTime()) return false;
    const takeover = s.holderIdentity !== opts.identity;
    await client.replace(COORDINATION_LEASES, {
      ...lease,
      spec: {
        ...s,
        ...mine,
        ...(takeover ? { acquireTime: micro(now), leaseTransitions: (s.leaseTransitions ?? 0) + 1 } : {}),
      },
    });
    return true;
  } catch (e) {
    if (isConflict(e)) return false; // someone else wrote first
    throw e;
  }
}

/** MicroTime as the API server expects it. */
const micro = (d: Date) => d.toISOString().replace(/\.(\d{3})Z$/, ".$1000Z");
