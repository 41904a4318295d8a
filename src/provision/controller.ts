/**
 * Wiring: informers feed a keyed work queue of ExporterSets; workers run `reconcile`; a periodic sweep removes
 * instances on lab hosts that no Exporter owns any more (left behind by a controller killed mid-way).
 */
import type { ConfigMap, Exporter, ExporterSet, KubeObject, Lease, Secret, VirtualTargetClass } from "../api/types.ts";
import type { KubeClient, Resource } from "../kube/client.ts";
import { Informer } from "../kube/informer.ts";
import { WorkQueue } from "../kube/queue.ts";
import { EventRecorder } from "../kube/events.ts";
import { abortableSleep } from "../kube/backoff.ts";
import {
  CONFIG_MAPS,
  EXPORTER_SETS,
  EXPORTERS,
  JUMPSTARTER_LEASES,
  SECRETS,
  VIRTUAL_TARGET_CLASSES,
} from "../kube/resources.ts";
import type { Logger } from "../observe/log.ts";
import { Metrics } from "../observe/metrics.ts";
import type { HostOps } from "../host/lab.ts";
import { resolveParams } from "./params.ts";
import { type LabTarget, PINNED_HOST_KEYS_SECRET, sshTarget } from "./credentials.ts";
import { type Caches, type Context, deployedTarget, ownerSetName, reconcile, targetString } from "./reconciler.ts";

export interface ControllerOptions {
  client: KubeClient;
  hosts: HostOps;
  log: Logger;
  provisioner: string;
  /** Limit every watch to this namespace (the operator's namespaced Role). */
  namespace?: string;
  concurrency?: number;
  resyncMs?: number;
  sweepMs?: number;
  watchTimeoutSeconds?: number;
  idleTimeoutMs?: number;
  metrics?: Metrics;
}

export class Controller {
  readonly caches: Caches;
  readonly queue: WorkQueue;
  readonly metrics: Metrics;
  readonly recorder: EventRecorder;
  readonly ctx: Context;
  private readonly abort = new AbortController();
  private loops: Promise<void>[] = [];
  private synced = false;

  constructor(private readonly opts: ControllerOptions) {
    const { client, log, namespace } = opts;
    const informer = <T extends KubeObject>(r: Resource) =>
      new Informer<T>(client, r, {
        namespace,
        log,
        watchTimeoutSeconds: opts.watchTimeoutSeconds,
        idleTimeoutMs: opts.idleTimeoutMs,
      });
    this.caches = {
      sets: informer<ExporterSet>(EXPORTER_SETS),
      classes: informer<VirtualTargetClass>(VIRTUAL_TARGET_CLASSES),
      exporters: informer<Exporter>(EXPORTERS),
      leases: informer<Lease>(JUMPSTARTER_LEASES),
      secrets: informer<Secret>(SECRETS),
      configMaps: informer<ConfigMap>(CONFIG_MAPS),
    };
    this.metrics = opts.metrics ?? new Metrics();
    this.recorder = new EventRecorder(client, "qemu-ssh-provisioner", log);
    this.ctx = {
      client,
      caches: this.caches,
      hosts: opts.hosts,
      recorder: this.recorder,
      log,
      metrics: this.metrics,
      provisioner: opts.provisioner,
      now: () => new Date(),
      resyncMs: opts.resyncMs ?? 5 * 60_000,
      applied: new Map(),
      expectations: new Map(),
      statuses: new Map(),
      exporterFailures: new Map(),
    };
    this.queue = new WorkQueue({
      concurrency: opts.concurrency ?? 4,
      process: (key) => reconcile(this.ctx, key),
      onError: (key, e, retryIn) =>
        log.warn("reconcile failed", { exporterSet: key, error: String(e), retryInMs: Math.round(retryIn) }),
      onDone: (_key, ms, ok) => {
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
        const key = `${a.host}\n${a.exited ? "exited" : a.ready ? "ready" : "not-ready"}`;
        counts.set(key, (counts.get(key) ?? 0) + 1);
      }
      return [...counts].map(([k, n]) => {
        const [host, state] = k.split("\n");
        return [{ host, state }, n];
      });
    });
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
    this.loops.push(this.sweepLoop(signal));
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
    c.exporters.on((_t, e) => {
      const owner = ownerSetName(e);
      if (owner) this.queue.add(`${e.metadata.namespace}/${owner}`);
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

  // ---------------------------------------------------------------- orphan sweep

  private async sweepLoop(signal: AbortSignal): Promise<void> {
    const every = this.opts.sweepMs ?? 5 * 60_000;
    while (!signal.aborted) {
      await abortableSleep(every, signal);
      if (signal.aborted) break;
      await this.sweep().catch((e) => this.opts.log.warn("orphan sweep failed", { error: String(e) }));
    }
  }

  /**
   * Removes instances on our hosts whose Exporter no longer exists. Returns how many were removed. Hosts are swept in
   * parallel and each on its own: one that is down neither delays nor stops the sweep of the others.
   */
  async sweep(): Promise<number> {
    const removed = await Promise.all(
      this.hostTargets().map((target) =>
        this.sweepHost(target).catch((e) => {
          this.opts.log.warn("orphan sweep of a host failed", { host: target.host, error: String(e) });
          return 0;
        })
      ),
    );
    this.forgetGone();
    return removed.reduce((a, b) => a + b, 0);
  }

  private async sweepHost(target: LabTarget): Promise<number> {
    const inspection = await this.opts.hosts.inspect(target);
    // Read after the inspection: an instance deployed meanwhile had its Exporter cached before its apply began.
    const known = new Set(this.caches.exporters.list().map((e) => e.metadata.uid));
    let removed = 0;
    for (const inst of inspection.instances) {
      if (this.opts.namespace && inst.namespace !== this.opts.namespace) continue; // not ours to judge
      if (inst.uid && known.has(inst.uid)) continue;
      // reclaimPolicy Retain: the instance of a deleted set stays (a leftover of a live set is still swept)
      if (inst.retain && !this.caches.sets.get(inst.namespace, inst.set ?? "")) continue;
      if (inst.ownerMismatch) {
        this.opts.log.warn("not sweeping an instance whose files disagree about their owner", {
          host: target.host,
          instance: inst.name,
        });
        continue;
      }
      this.opts.log.info("removing orphaned instance", { host: target.host, instance: inst.name, uid: inst.uid });
      await this.opts.hosts.remove(target, inst.name);
      removed++;
    }
    return removed;
  }

  /** Drops the apply memory of Exporters that went without our finalizer running (deleted behind our back). */
  private forgetGone(): void {
    const known = new Set(this.caches.exporters.list().map((e) => e.metadata.uid));
    for (const uid of this.ctx.applied.keys()) if (!known.has(uid)) this.ctx.applied.delete(uid);
  }

  /**
   * Every distinct lab host that some ExporterSet of ours points at, or some Exporter was deployed to (a set that
   * moved or went may have left instances behind), with working credentials.
   */
  private hostTargets(): LabTarget[] {
    const out = new Map<string, LabTarget>();
    for (const e of this.caches.exporters.list()) {
      const target = deployedTarget(this.ctx, e);
      if (target) out.set(targetString(target), target);
    }
    for (const set of this.caches.sets.list()) {
      const ns = set.metadata.namespace;
      const cls = this.caches.classes.get(ns, set.spec.virtualTargetClassName);
      if (!cls || cls.spec.provisioner !== this.opts.provisioner) continue;
      const params = resolveParams(cls, set);
      if (!params.ok) continue;
      const cred = sshTarget(
        cls,
        params.params,
        this.caches.secrets.get(ns, cls.spec.credentialsSecretRef?.name ?? ""),
        this.caches.secrets.get(ns, PINNED_HOST_KEYS_SECRET),
      );
      if (cred.ok) out.set(targetString(cred.target), cred.target);
    }
    return [...out.values()];
  }
}
