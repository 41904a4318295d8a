/**
 * Leader election on a coordination.k8s.io Lease, with client-go's timings (15 s lease, 10 s renew deadline, 2 s
 * retry). Only the holder reconciles; on SIGTERM the holder releases the Lease so a standby takes over at once.
 *
 * As in client-go, a standby judges expiry by how long it has itself seen the Lease unchanged, never by the holder's
 * renewTime: that is another machine's clock, and a skewed one would make a live leader look expired. Every request
 * is bounded so that a leader whose connection went half-dead still notices, within the renew deadline, that it can no
 * longer renew, and stops before a standby (waiting a full lease duration) can take over.
 */
import type { KubeObject } from "../api/types.ts";
import { isConflict, type KubeApi, type KubeClient } from "./client.ts";
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
  /**
   * Aborts when leadership is lost: at the renew deadline if renewals failed until then, or when another holder took
   * the Lease. Its reason says which. Fence host commands and API writes on it.
   */
  lost: AbortSignal;
  /** Stops renewing and hands the Lease back. */
  release(): Promise<void>;
}

interface Timings {
  duration: number;
  deadline: number;
  retry: number;
}

/** Waits until this process holds the Lease (or `signal` aborts, then returns undefined). */
export async function acquireLeadership(
  client: KubeClient,
  opts: LeaderOptions,
  signal: AbortSignal,
): Promise<Leadership | undefined> {
  const t: Timings = {
    duration: opts.leaseDurationMs ?? 15_000,
    deadline: opts.renewDeadlineMs ?? 10_000,
    retry: opts.retryPeriodMs ?? 2_000,
  };
  if (!(t.duration > t.deadline && t.deadline > t.retry)) {
    throw new Error(`leader election needs lease duration > renew deadline > retry period, got ${JSON.stringify(t)}`);
  }
  const elector = new Elector(client, opts, t.duration);
  let logged = false;
  while (!signal.aborted) {
    try {
      if (await elector.tryAcquireOrRenew(bounded(signal, t.deadline))) {
        opts.log.info("became leader", { lease: `${opts.namespace}/${opts.name}`, identity: opts.identity });
        return hold(elector, opts, t);
      }
      if (!logged) {
        opts.log.info("waiting for leadership", { lease: `${opts.namespace}/${opts.name}`, holder: elector.holder });
      }
      logged = true;
    } catch (e) {
      if (signal.aborted) break;
      opts.log.warn("leader election attempt failed", { error: String(e) });
    }
    await abortableSleep(t.retry, signal);
  }
  return undefined;
}

function hold(elector: Elector, opts: LeaderOptions, t: Timings): Leadership {
  const lost = new AbortController();
  const stop = new AbortController();
  const ended = AbortSignal.any([stop.signal, lost.signal]);
  // Fencing: leadership ends the moment the renew deadline passes without a renewal, not at the loop's next turn, so
  // whatever is fenced on `lost` has stopped well before a standby, waiting a full lease duration, can take over.
  let deadline: ReturnType<typeof setTimeout> | undefined;
  const renewed = () => {
    clearTimeout(deadline);
    if (ended.aborted) return;
    deadline = setTimeout(() => {
      opts.log.error("leadership lost: could not renew the lease in time", { lease: opts.name });
      lost.abort(new Error(`leadership lost: lease ${opts.namespace}/${opts.name} not renewed in time`));
    }, elector.renewedAt + t.deadline - performance.now());
  };
  renewed();
  const loop = (async () => {
    while (!ended.aborted) {
      await abortableSleep(t.retry, ended);
      if (ended.aborted) return;
      try {
        // An attempt may run only until the deadline: a request hanging past it would keep us leading unknowingly.
        const left = elector.renewedAt + t.deadline - performance.now();
        if (await elector.tryAcquireOrRenew(bounded(ended, left))) renewed();
        else if (elector.holder && elector.holder !== opts.identity) {
          opts.log.error("leadership lost: another holder took the lease", {
            lease: opts.name,
            holder: elector.holder,
          });
          clearTimeout(deadline);
          lost.abort(new Error(`leadership lost: ${elector.holder} holds lease ${opts.namespace}/${opts.name}`));
          return;
        }
      } catch (e) {
        if (ended.aborted) return;
        opts.log.warn("lease renewal failed", { error: String(e) });
      }
    }
  })();
  return {
    lost: lost.signal,
    async release() {
      stop.abort();
      clearTimeout(deadline);
      await loop;
      if (lost.signal.aborted) return;
      await elector.release(AbortSignal.timeout(t.deadline))
        .catch((e) => opts.log.warn("could not release the lease", { error: String(e) }));
    },
  };
}

/**
 * `api` with its writes refused once `fence` aborts (leadership lost): a replica that no longer leads must not write
 * as a leader. Reads go on.
 */
export function fencedApi(api: KubeApi, fence: AbortSignal): KubeApi {
  const guard = <T>(write: () => Promise<T>) => fence.aborted ? Promise.reject(fence.reason) : write();
  return {
    find: (r, namespace, name) => api.find(r, namespace, name),
    create: (r, obj) => guard(() => api.create(r, obj)),
    mergePatch: (r, namespace, name, patch, subresource) =>
      guard(() => api.mergePatch(r, namespace, name, patch, subresource)),
    delete: (r, namespace, name, preconditions) => guard(() => api.delete(r, namespace, name, preconditions)),
  };
}

/** One contender's view of the Lease. */
class Elector {
  /** The holder seen on the last read ("" when released, undefined before the first read). */
  holder: string | undefined;
  /** When (performance.now()) the request behind our latest successful write was sent. */
  renewedAt = 0;
  private observed: { version: string; at: number } | undefined;

  constructor(
    private readonly client: KubeClient,
    private readonly opts: LeaderOptions,
    private readonly durationMs: number,
  ) {}

  async tryAcquireOrRenew(signal: AbortSignal): Promise<boolean> {
    const { client, opts } = this;
    const sent = performance.now();
    const now = new Date();
    const mine = {
      holderIdentity: opts.identity,
      leaseDurationSeconds: Math.ceil(this.durationMs / 1000),
      renewTime: micro(now),
    };
    const lease = await client.find<CoordinationLease>(COORDINATION_LEASES, opts.namespace, opts.name, signal);
    try {
      if (!lease) {
        this.observe(
          await client.create<CoordinationLease>(COORDINATION_LEASES, {
            metadata: { name: opts.name, namespace: opts.namespace },
            spec: { ...mine, acquireTime: micro(now), leaseTransitions: 0 },
          }, signal),
        );
        this.renewedAt = sent;
        return true;
      }
      this.observe(lease);
      const s = lease.spec;
      if (s.holderIdentity && s.holderIdentity !== opts.identity) {
        const unchangedFor = performance.now() - this.observed!.at;
        if (unchangedFor < (s.leaseDurationSeconds ?? 0) * 1000) return false;
      }
      const takeover = s.holderIdentity !== opts.identity;
      this.observe(
        await client.replace<CoordinationLease>(
          COORDINATION_LEASES,
          {
            ...lease,
            spec: {
              ...s,
              ...mine,
              ...(takeover ? { acquireTime: micro(now), leaseTransitions: (s.leaseTransitions ?? 0) + 1 } : {}),
            },
          },
          undefined,
          signal,
        ),
      );
      this.renewedAt = sent;
      return true;
    } catch (e) {
      if (isConflict(e)) return false; // someone else wrote first; the next read shows who
      throw e;
    }
  }

  async release(signal: AbortSignal): Promise<void> {
    const { client, opts } = this;
    const lease = await client.find<CoordinationLease>(COORDINATION_LEASES, opts.namespace, opts.name, signal);
    if (lease?.spec.holderIdentity !== opts.identity) return;
    await client.replace(
      COORDINATION_LEASES,
      {
        ...lease,
        spec: { ...lease.spec, holderIdentity: "", leaseDurationSeconds: 1 },
      },
      undefined,
      signal,
    );
  }

  private observe(lease: CoordinationLease): void {
    this.holder = lease.spec.holderIdentity ?? "";
    const version = lease.metadata.resourceVersion ?? "";
    if (this.observed?.version !== version) this.observed = { version, at: performance.now() };
  }
}

function bounded(signal: AbortSignal, ms: number): AbortSignal {
  return AbortSignal.any([signal, AbortSignal.timeout(Math.max(0, ms))]);
}

/** MicroTime as the API server expects it. */
const micro = (d: Date) => d.toISOString().replace(/\.(\d{3})Z$/, ".$1000Z");
