/**
 * What every phase of a reconcile shares: the API, the caches, the hosts, the clock, and this process's memory of
 * its own work. The controller builds the real one; the unit tests build one from fakes.
 */
import type {
  ConfigMap,
  Exporter,
  ExporterSet,
  ExporterSetStatus,
  Lease,
  Secret,
  VirtualTargetClass,
} from "../api/types.ts";
import type { KubeApi, Resource } from "../kube/client.ts";
import {
  CONFIG_MAPS,
  EXPORTER_SETS,
  EXPORTERS,
  JUMPSTARTER_LEASES,
  SECRETS,
  VIRTUAL_TARGET_CLASSES,
} from "../kube/resources.ts";
import type { Cache } from "../kube/informer.ts";
import type { Recorder } from "../kube/events.ts";
import type { Logger } from "../observe/log.ts";
import type { Metrics } from "../observe/metrics.ts";
import type { HostOps } from "../host/lab.ts";
import type { HostInspection, HostUnits } from "../host/remote.ts";
import type { HostFacts } from "../host/host_facts.ts";
import type { LabTarget } from "./credentials.ts";
import type { Reach } from "./placement.ts";
import { recordingReach } from "./host_reach.ts";
import type { FirstContacts } from "./first_contact.ts";

/** The kinds reconciling reads from caches, by cache. */
export interface Cached {
  sets: ExporterSet;
  classes: VirtualTargetClass;
  exporters: Exporter;
  leases: Lease;
  secrets: Secret;
  configMaps: ConfigMap;
}

export type Caches = { [K in keyof Cached]: Cache<Cached[K]> };

/** The resource each cache holds. */
const CACHED: Record<keyof Cached, Resource> = {
  sets: EXPORTER_SETS,
  classes: VIRTUAL_TARGET_CLASSES,
  exporters: EXPORTERS,
  leases: JUMPSTARTER_LEASES,
  secrets: SECRETS,
  configMaps: CONFIG_MAPS,
};

/** One cache per cached resource, each made by `make` (informers in the controller, FakeKube caches in tests). */
export function cachesFrom<C>(make: (r: Resource) => C): Record<keyof Cached, C> {
  return Object.fromEntries(Object.entries(CACHED).map(([k, r]) => [k, make(r)])) as Record<keyof Cached, C>;
}

export interface Context {
  client: KubeApi;
  caches: Caches;
  hosts: HostOps;
  recorder: Recorder;
  log: Logger;
  metrics: Metrics;
  provisioner: string;
  /** Written into every instance's ownership line and labels; the sweep removes only instances that carry it. */
  identity: string;
  /**
   * How long an Exporter being deleted may wait for its instance to be torn down; then its finalizer goes anyway,
   * with a Warning event, and its host is remembered for the sweep (teardown.ts).
   */
  teardownGraceMs: number;
  now: () => Date;
  /** Check every instance on its host at least this often, to repair drift there (host_checks.ts). */
  resyncMs: number;
  /** Per-process memory of what was applied, so an unchanged instance is not re-sent on every event. */
  applied: Map<string, AppliedState>;
  /**
   * Exporters created but not yet seen in the cache, per set uid (avoids double creation), each with the target it
   * was placed on (pooled sets), which counts against that host's slots meanwhile.
   */
  expectations: Map<string, { names: Map<string, string | undefined>; until: number }>;
  /** The status last written per set key ("ns/name"), for the set of that uid (see lastStatus). */
  statuses: Map<string, { uid: string; status: ExporterSetStatus }>;
  /** Per Exporter uid: how often its exporter was found down without its lease ending, and when to start it next. */
  exporterFailures: Map<string, ExporterFailures>;
  /**
   * Per Exporter uid, the resourceVersion whose finalizer this process removed: reconciles that run before the cache
   * catches up skip it instead of removing the instance a second time.
   */
  finalized: Map<string, string>;
  /** The latest inspection per lab host and key, shared by the drift checks and the sweep (host_checks.ts). */
  inspections: Map<string, HostLook<HostInspection>>;
  /** The latest units-only inspection per lab host and key, shared by the close looks at units (host_checks.ts). */
  unitLooks: Map<string, HostLook<HostUnits>>;
  /** Per lab host and port (factsKey), the facts its last apply found: instances are rendered for them. */
  hostFacts: Map<string, HostFacts>;
  /** Per lab host and port (factsKey), the first apply under way while its facts are unknown (first_contact.ts). */
  firstContacts: FirstContacts;
  /**
   * The SSH credentials each lab host (user@host:port) was last reached with, newest last, a few per host: teardown
   * tries them after the current ones, so it works after the Secret, the class or the namespace went, or the key was
   * rotated (credentials.ts rememberTarget). In memory only: a restart forgets them.
   */
  knownTargets: Map<string, LabTarget[]>;
  /**
   * Hosts whose instances an Exporter left behind when its finalizer went without a teardown, with every way the
   * teardown had to reach them: the sweep visits them until one pass there succeeds. In memory only.
   */
  leftOn: Map<string, LabTarget[]>;
  /** Per lab host (placement.ts hostKey), since when its SSH commands go unanswered (host_reach.ts). */
  hostReach: Map<string, Reach>;
  /**
   * Each Exporter added or changed in the cache, as the controller routes it: a reconcile waiting on its lab hosts
   * listens, to take in the Exporters that got their credentials meanwhile (deploy.ts deployAll).
   */
  exporterChanges: Listeners<Exporter>;
}

/** Callbacks told of each new value while they listen. */
export class Listeners<T> {
  private readonly all = new Set<(value: T) => void>();

  /** Returns how to stop listening. */
  listen(fn: (value: T) => void): () => void {
    this.all.add(fn);
    return () => this.all.delete(fn);
  }

  tell(value: T): void {
    for (const fn of this.all) fn(value);
  }
}

/**
 * Runs `work` on each of `first` at once and, until those end, on each Exporter that `takes` accepts, told by `changes`
 * or among `cached` (what the cache saw since the reconcile read it), once per uid: a reconcile's host work takes in the
 * Exporters that became ready for it meanwhile (deploy.ts deployAll, teardown.ts finalizeAll). With no `first`, none
 * join. Resolves with every result by uid, those that joined included, and the Exporters that joined.
 */
export async function withJoiners<R>(
  changes: Listeners<Exporter>,
  first: Exporter[],
  cached: () => (Exporter | undefined)[],
  takes: (e: Exporter) => boolean,
  work: (e: Exporter) => Promise<R>,
): Promise<{ results: Map<string, R>; joined: Exporter[] }> {
  const results = new Map<string, R>();
  const joined: Exporter[] = [];
  const run = (e: Exporter) => work(e).then((r) => void results.set(e.metadata.uid!, r));
  const late: Promise<void>[] = [];
  const join = (e: Exporter | undefined) => {
    const uid = e?.metadata.uid;
    const seen = (x: Exporter) => x.metadata.uid === uid;
    if (!e || !uid || joined.some(seen) || first.some(seen) || !takes(e)) return;
    joined.push(e);
    late.push(run(e));
  };
  if (first.length) {
    const stop = changes.listen(join);
    try {
      const now = Promise.all(first.map(run));
      cached().forEach(join);
      await now;
    } finally {
      stop();
    }
  }
  await Promise.all(late);
  return { results, joined };
}

/** A look at a lab host: the whole inspection or its units only. */
export interface HostLook<T> {
  /** When it began: it describes the host no earlier than this. */
  at: number;
  result: Promise<T>;
}

/** A context with empty memory. */
export function newContext(
  deps: Omit<
    Context,
    | "applied"
    | "expectations"
    | "statuses"
    | "exporterFailures"
    | "finalized"
    | "inspections"
    | "unitLooks"
    | "knownTargets"
    | "leftOn"
    | "hostFacts"
    | "firstContacts"
    | "hostReach"
    | "exporterChanges"
  >,
): Context {
  const hostReach = new Map<string, Reach>();
  return {
    ...deps,
    hosts: recordingReach(deps.hosts, hostReach, deps.now),
    hostReach,
    applied: new Map(),
    expectations: new Map(),
    statuses: new Map(),
    exporterFailures: new Map(),
    finalized: new Map(),
    inspections: new Map(),
    unitLooks: new Map(),
    hostFacts: new Map(),
    firstContacts: new Map(),
    knownTargets: new Map(),
    leftOn: new Map(),
    exporterChanges: new Listeners(),
  };
}

export interface ExporterFailures {
  count: number;
  /** When we last started it again. */
  at: number;
  /** Not started again before this (back-off). */
  nextAt: number;
}

export interface AppliedState {
  hash: string;
  at: number;
  host: string;
  /** Both units active, as of the last apply or check. */
  ready: boolean;
  /**
   * Set while the units are on their way up (an apply queues their jobs and does not wait for them): since when (the
   * apply's or inspection's start), checked closely until they are up (deploy.ts).
   */
  startingSince?: number;
  /** Inspections since then that found them still on their way up: each next one waits longer (deploy.ts). */
  startingLooks?: number;
  /** The exporter ended by itself and was left down (waiting for its lease to end, or for the back-off). */
  exited: boolean;
  /** Running units were left on an older definition because of a lease (or to roll one at a time). */
  pending: boolean;
  /** Why the exporter keeps going down, with its last journal lines; undefined while it is healthy. */
  failing?: string;
  /** Jumpstarter's offline report (see offlineMarker) as it stood when this apply ran. */
  offline?: string;
  /** When an apply last started, restarted or reloaded the exporter (deploy.ts checks it closely for a while). */
  startedAt: number;
}
