/**
 * Wiring: informers feed a keyed work queue of ExporterSets; workers run `reconcile`; a periodic sweep (sweep.ts)
 * removes instances on lab hosts that no Exporter owns any more.
 */
import type { ExporterSet, KubeObject } from "../api/types.ts";
import type { KubeClient, Resource } from "../kube/client.ts";
import { Informer } from "../kube/informer.ts";
import { fencedApi } from "../kube/leader.ts";
import { WorkQueue } from "../kube/queue.ts";
import { EventRecorder } from "../kube/events.ts";
import type { Logger } from "../observe/log.ts";
import { Metrics, type Sample } from "../observe/metrics.ts";
import type { HostOps } from "../host/lab.ts";
import { controllerIdentity } from "../host/render.ts";
import { PINNED_HOST_KEYS_SECRET } from "./credentials.ts";
import { type Cached, cachesFrom, type Context, newContext } from "./context.ts";
import { ownerSetName, routedSetName } from "./marks.ts";
import { reconcile } from "./reconciler.ts";
import { sweep, sweepLoop } from "./sweep.ts";

/** The controller's caches: what reconciling reads (Caches), plus the watches that keep them and route events. */
export type Informers = { [K in keyof Cached]: Informer<Cached[K]> };

/**
 * A reconcile spends nearly all its time waiting for SSH; with 4 at once, 500 sets applied together queued for minutes
 * while the hosts and the CPU idled (bench/results/scale-findings.md). Each set stays one reconcile at a time.
 */
export const DEFAULT_CONCURRENCY = 32;

/** Long enough for a lab host's reboot; short enough that an uninstall does not look hung. */
export const DEFAULT_TEARDOWN_GRACE_MS = 120_000;

export interface ControllerOptions {
  client: KubeClient;
  hosts: HostOps;
  log: Logger;
  provisioner: string;
  /** Limit every watch to this namespace (the operator's namespaced Role). */
  namespace?: string;
  /** ExporterSets reconciled at once (--max-concurrent-reconciles); each is mostly waiting on its lab host. */
  concurrency?: number;
  /** Names this cluster in the ownership of our instances (run.ts readClusterId). */
  clusterId: string;
  resyncMs?: number;
  sweepMs?: number;
  /** How long a deleted Exporter waits for its teardown (--teardown-grace, default DEFAULT_TEARDOWN_GRACE_MS). */
  teardownGraceMs?: number;
  watchTimeoutSeconds?: number;
  idleTimeoutMs?: number;
  metrics?: Metrics;
  /** Once aborted (leadership lost), reconciles and events may no longer write to the API (see fencedApi). */
  fence?: AbortSignal;
}

export class Controller {
  readonly caches: Informers;
  readonly queue: WorkQueue;
  readonly metrics: Metrics;
  readonly recorder: EventRecorder;
  readonly ctx: Context;
  private readonly abort = new AbortController();
  private loops: Promise<void>[] = [];
  private synced = false;

  constructor(private readonly opts: ControllerOptions) {
    const { client, log, namespace } = opts;
    const informer = (r: Resource) =>
      new Informer<KubeObject>(client, r, {
        namespace,
        log,
        watchTimeoutSeconds: opts.watchTimeoutSeconds,
        idleTimeoutMs: opts.idleTimeoutMs,
      });
    // CACHED pairs each cache with its resource, so each informer holds the kind Cached names
    this.caches = cachesFrom(informer) as unknown as Informers;
    this.metrics = opts.metrics ?? new Metrics();
    const api = opts.fence ? fencedApi(client, opts.fence) : client;
    this.recorder = new EventRecorder(api, "qemu-ssh-provisioner", log);
    this.ctx = newContext({
      client: api,
      caches: this.caches,
      hosts: opts.hosts,
      recorder: this.recorder,
      log,
      metrics: this.metrics,
      provisioner: opts.provisioner,
      identity: controllerIdentity(opts.clusterId, opts.provisioner),
      teardownGraceMs: opts.teardownGraceMs ?? DEFAULT_TEARDOWN_GRACE_MS,
      now: () => new Date(),
      resyncMs: opts.resyncMs ?? 5 * 60_000,
    });
    this.queue = new WorkQueue({
      concurrency: opts.concurrency ?? DEFAULT_CONCURRENCY,
      process: (key) => reconcile(this.ctx, key),
      onError: (key, e, retryIn) =>
        log.warn("reconcile failed", { exporterSet: key, error: String(e), retryInMs: Math.round(retryIn) }),
      onDone: (key, ms, ok) => {
        log.debug("reconciled", { exporterSet: key, ms: Math.round(ms), ok });
        this.metrics.reconcileTotal.inc({ controller: "exporterset", result: ok ? "success" : "error" });
        if (!ok) this.metrics.reconcileErrors.inc({ controller: "exporterset" });
        this.metrics.reconcileSeconds.observe({ controller: "exporterset" }, ms / 1000);
      },
    });
    this.metrics.gauge(
      "workqueue_depth",
      "Keys waiting in the work queue.",
      () => [[{ name: "exporterset" }, this.queue.depth()]],
    );
    this.metrics.gauge("qemu_ssh_instances", "Instances per lab host and state, as last applied.", () => {
      const counts = new Map<string, number>();
      for (const a of this.ctx.applied.values()) {
        const state = a.exited
          ? "exited"
          : a.ready
          ? "ready"
          : a.startingSince !== undefined
          ? "starting"
          : "not-ready";
        const key = `${a.host}\n${state}`;
        counts.set(key, (counts.get(key) ?? 0) + 1);
      }
      return [...counts].map(([k, n]) => {
        const [host, state] = k.split("\n");
        return [{ host, state }, n];
      });
    });
    // Per set, from the status this process last wrote: what the Degraded and ExporterFailing alerts read.
    this.metrics.gauge(
      "qemu_ssh_exporterset_condition",
      "1 for each condition type and status of an ExporterSet, as last written by this controller.",
      () =>
        [...this.ctx.statuses].flatMap(([key, { status }]) => {
          const [namespace, exporterset] = key.split("/");
          return (status.conditions ?? []).map((c): Sample => [
            { namespace, exporterset, type: c.type, status: c.status, reason: c.reason ?? "" },
            1,
          ]);
        }),
    );
    this.metrics.gauge(
      "qemu_ssh_exporterset_replicas",
      "An ExporterSet's replica counts (replicas, ready), as last written by this controller.",
      () =>
        [...this.ctx.statuses].flatMap(([key, { status }]) => {
          const [namespace, exporterset] = key.split("/");
          return [
            [{ namespace, exporterset, kind: "replicas" }, status.replicas ?? 0],
            [{ namespace, exporterset, kind: "ready" }, status.readyReplicas ?? 0],
          ] satisfies Sample[];
        }),
    );
    this.route();
  }

  /** Ready once every cache has listed once. */
  get ready(): boolean {
    return this.synced;
  }

  async start(): Promise<void> {
    const signal = this.abort.signal;
    const all: { run(signal: AbortSignal): Promise<void>; synced: Promise<void> }[] = Object.values(this.caches);
    this.loops = all.map((i) => i.run(signal));
    await Promise.race([
      Promise.all(all.map((i) => i.synced)),
      new Promise((r) => signal.addEventListener("abort", r)),
    ]);
    if (signal.aborted) return;
    this.synced = true;
    this.opts.log.info("caches synced, reconciling", { namespace: this.opts.namespace ?? "(all)" });
    this.queue.start();
    for (const s of this.caches.sets.list()) this.enqueue(s);
    this.loops.push(sweepLoop(this.ctx, this.opts.namespace, this.opts.sweepMs ?? 5 * 60_000, signal));
  }

  /** Stops watching, lets in-flight reconciles finish, flushes events. */
  async stop(): Promise<void> {
    this.abort.abort();
    await this.queue.shutdown();
    await Promise.all(this.loops);
    await this.recorder.flush();
  }

  private enqueue(s: ExporterSet): void {
    this.queue.add(`${s.metadata.namespace}/${s.metadata.name}`);
  }

  private setsIn(ns: string | undefined, pred: (s: ExporterSet) => boolean = () => true): void {
    for (const s of this.caches.sets.list(ns)) if (pred(s)) this.enqueue(s);
  }

  /** Which ExporterSets an event on each kind of object concerns. */
  private route(): void {
    const c = this.caches;
    c.sets.on((_t, s) => this.enqueue(s));
    c.classes.on((_t, cls) =>
      this.setsIn(cls.metadata.namespace, (s) => s.spec.virtualTargetClassName === cls.metadata.name)
    );
    c.exporters.on((type, e) => {
      const owner = routedSetName(e);
      if (owner) this.queue.add(`${e.metadata.namespace}/${owner}`);
      if (type !== "DELETED") this.ctx.exporterChanges.tell(e);
    });
    c.leases.on((_t, l) => this.setsIn(l.metadata.namespace));
    c.secrets.on((_t, sec) => {
      const ns = sec.metadata.namespace;
      const name = sec.metadata.name;
      if (name === PINNED_HOST_KEYS_SECRET) return this.setsIn(ns);
      const classes = new Set(
        c.classes.list(ns).filter((k) => k.spec.credentialsSecretRef?.name === name).map((k) => k.metadata.name),
      );
      const owners = new Set(
        c.exporters.list(ns).filter((e) => e.status?.credential?.name === name).map((e) => ownerSetName(e)),
      );
      this.setsIn(ns, (s) => classes.has(s.spec.virtualTargetClassName) || owners.has(s.metadata.name));
    });
    c.configMaps.on((_t, cm) => this.setsIn(cm.metadata.namespace));
  }

  /** One orphan sweep now (see sweep.ts); returns how many instances it removed. */
  sweep(): Promise<number> {
    return sweep(this.ctx, this.opts.namespace);
  }
}
