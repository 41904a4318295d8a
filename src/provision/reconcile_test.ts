/**
 * Reconcile on fakes: FakeKube for the API and the caches, FakeHosts for the lab hosts, a clock the test moves.
 * Each test drives reconcile step by step, as the work queue would, and reads what it did to the API and the hosts.
 */
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import type { Exporter, ExporterSet, ExporterSetSpec, Lease, Secret, VirtualTargetClass } from "../api/types.ts";
import { PROVISIONER } from "../api/types.ts";
import { FakeKube } from "../kube/fake_client.ts";
import type { Outcome } from "../kube/queue.ts";
import { EXPORTER_SETS, EXPORTERS, JUMPSTARTER_LEASES, SECRETS, VIRTUAL_TARGET_CLASSES } from "../kube/resources.ts";
import { FakeHosts } from "../host/fake_hosts.ts";
import { controllerIdentity } from "../host/render.ts";
import { silentLogger } from "../observe/log.ts";
import { Metrics } from "../observe/metrics.ts";
import { type Caches, cachesFrom, type Context, newContext } from "./context.ts";
import { FINALIZER, HOST_ANNOTATION, RECLAIM_ANNOTATION, routedSetName, SET_LABEL } from "./marks.ts";
import { reconcile } from "./reconciler.ts";
import { sweep } from "./sweep.ts";
import { CREDENTIALS_ANNOTATION, TARGET_ANNOTATION } from "./targets.ts";
import { MAX_CREATES } from "./writes.ts";
import { KubeError } from "../kube/client.ts";
import { ed25519Key } from "../../test/fixtures.ts";

const NS = "lab";
const SET = "pool";
const HOST = "lab-host-01.example.com";
const IDENTITY = controllerIdentity("cluster-a", PROVISIONER);
const GRACE_MS = 120_000;

const KEY = await ed25519Key("test");

const b64 = (s: string) => Buffer.from(s).toString("base64");

interface Event {
  object: string;
  reason: string;
  message: string;
}

class World {
  clock = new Date("2026-01-01T00:00:00Z");
  readonly kube = new FakeKube(() => this.clock);
  readonly hosts = new FakeHosts();
  readonly events: Event[] = [];
  readonly ctx: Context;

  constructor(spec: Partial<ExporterSetSpec> = {}) {
    const k = this.kube;
    this.ctx = newContext({
      client: k,
      caches: cachesFrom((r) => k.cache(r)) as Caches,
      hosts: this.hosts,
      recorder: {
        event: (o, _type, reason, message) => this.events.push({ object: o.metadata.name!, reason, message }),
      },
      log: silentLogger,
      metrics: new Metrics(),
      provisioner: PROVISIONER,
      identity: IDENTITY,
      teardownGraceMs: GRACE_MS,
      now: () => this.clock,
      resyncMs: 5 * 60_000,
    });
    k.put<Secret>(SECRETS, { metadata: { name: "lab-ssh-key", namespace: NS }, data: { "ssh-privatekey": b64(KEY) } });
    k.put<VirtualTargetClass>(VIRTUAL_TARGET_CLASSES, {
      metadata: { name: "qemu", namespace: NS },
      spec: {
        provisioner: PROVISIONER,
        credentialsSecretRef: { name: "lab-ssh-key" },
        parameters: { host: { name: HOST }, ssh: { user: "root", port: 22 }, runtime: { kvm: true } },
      },
    });
    k.put<ExporterSet>(EXPORTER_SETS, {
      metadata: { name: SET, namespace: NS, generation: 1 },
      spec: {
        virtualTargetClassName: "qemu",
        minReplicas: 0,
        minAvailableReplicas: 2,
        maxReplicas: 4,
        scaleDownCooldown: "5m",
        recycleStrategy: "ExitAndReplace",
        template: {
          metadata: { labels: { board: "qemu" } },
          spec: { drivers: [{ name: "qemu", type: "jumpstarter_driver_qemu.driver.Qemu" }] },
        },
        ...spec,
      },
    });
  }

  reconcile(): Promise<Outcome> {
    return reconcile(this.ctx, `${NS}/${SET}`);
  }

  advance(ms: number): void {
    this.clock = new Date(this.clock.getTime() + ms);
  }

  get set(): ExporterSet {
    return this.ctx.caches.sets.get(NS, SET)!;
  }

  exporters(): Exporter[] {
    return this.ctx.caches.exporters.list(NS).sort((a, b) => a.metadata.name!.localeCompare(b.metadata.name!));
  }

  exporter(name: string): Exporter | undefined {
    return this.ctx.caches.exporters.get(NS, name);
  }

  /** Jumpstarter's part: a token Secret and the endpoint on the Exporter's status. */
  issueCredentials(e: Exporter, token = `token-of-${e.metadata.name}`): void {
    const secret = `${e.metadata.name}-token`;
    this.kube.put<Secret>(SECRETS, { metadata: { name: secret, namespace: NS }, data: { token: b64(token) } });
    this.patchExporterStatus(e.metadata.name!, { credential: { name: secret }, endpoint: "grpc.example.com:443" });
  }

  patchExporterStatus(name: string, status: Exporter["status"]): void {
    const e = this.exporter(name)!;
    this.kube.put(EXPORTERS, { ...e, status: { ...e.status, ...status } });
  }

  updateSpec(spec: Partial<ExporterSetSpec>): void {
    this.kube.put(EXPORTER_SETS, { ...this.set, spec: { ...this.set.spec, ...spec } });
  }

  lease(name: string, exporter: string, ended: boolean): void {
    this.kube.put<Lease>(JUMPSTARTER_LEASES, {
      metadata: { name, namespace: NS },
      spec: { selector: { matchLabels: { board: "qemu" } } },
      status: { exporterRef: { name: exporter }, ended },
    });
  }

  /** Two Exporters created, both issued credentials and deployed. */
  async deployed(): Promise<Exporter[]> {
    await this.reconcile();
    for (const e of this.exporters()) this.issueCredentials(e);
    await this.reconcile();
    return this.exporters();
  }

  reasons(): string[] {
    return this.events.map((e) => e.reason);
  }

  applies(name: string): number {
    return this.hosts.calls.filter((c) => c === `apply ${HOST} ${name}`).length;
  }
}

const condition = (s: ExporterSet, type: string) => s.status?.conditions?.find((c) => c.type === type);

Deno.test("reconcile: scale up creates Exporters with our label, finalizer and owner, once", async () => {
  const w = new World();
  await w.reconcile();
  const created = w.exporters();
  assert.equal(created.length, 2);
  for (const e of created) {
    assert.equal(e.metadata.labels?.[SET_LABEL], SET);
    assert.equal(e.metadata.labels?.board, "qemu");
    assert.deepEqual(e.metadata.finalizers, [FINALIZER]);
    assert.equal(e.metadata.ownerReferences?.[0].uid, w.set.metadata.uid);
  }
  assert.ok(w.reasons().includes("CreatedExporters"));
  await w.reconcile();
  assert.equal(w.exporters().length, 2, "a second reconcile creates no more");
});

Deno.test("reconcile: an instance is deployed only once its Exporter has credentials", async () => {
  const w = new World();
  await w.reconcile();
  const [a, b] = w.exporters();
  assert.equal(w.hosts.calls.length, 0, "nothing reaches the host before Jumpstarter issues credentials");
  w.issueCredentials(a);
  await w.reconcile();
  assert.equal(w.applies(a.metadata.name!), 1);
  assert.equal(w.applies(b.metadata.name!), 0);
  assert.equal(w.hosts.instance(HOST, a.metadata.name!)?.exporter, "active");
  const annotations = w.exporter(a.metadata.name!)!.metadata.annotations!;
  assert.equal(annotations[TARGET_ANNOTATION], `root@${HOST}:22`);
  assert.equal(annotations[HOST_ANNOTATION], HOST);
  const deployed = w.events.filter((e) => e.reason === "Deployed");
  assert.deepEqual(deployed.map((e) => e.object), [SET], "one event for the set, naming its instances");
  assert.match(deployed[0].message, new RegExp(`deployed ${a.metadata.name} to ${HOST}`));
});

Deno.test("reconcile: an Exporter is created with where it goes and its reclaim policy; its apply writes nothing", async () => {
  const w = new World();
  const cls = w.ctx.caches.classes.get(NS, "qemu")!;
  w.kube.put(VIRTUAL_TARGET_CLASSES, { ...cls, spec: { ...cls.spec, reclaimPolicy: "Retain" } });
  await w.reconcile();
  for (const e of w.exporters()) {
    const a = e.metadata.annotations!;
    assert.deepEqual([a[TARGET_ANNOTATION], a[HOST_ANNOTATION], a[RECLAIM_ANNOTATION]], [
      `root@${HOST}:22`,
      HOST,
      "Retain",
    ]);
    w.issueCredentials(e);
  }
  const before = w.kube.writes.length;
  await w.reconcile();
  assert.equal(w.exporters().filter((e) => w.hosts.instance(HOST, e.metadata.name!)?.exporter === "active").length, 2);
  assert.deepEqual(
    w.kube.writes.slice(before).filter((x) => x.startsWith("patch exporters ")),
    [],
    "no Exporter patch",
  );

  // the class goes back to Delete: recorded before the next apply, in one patch per Exporter
  w.kube.put(VIRTUAL_TARGET_CLASSES, { ...cls, spec: { ...cls.spec, reclaimPolicy: "Delete" } });
  await w.reconcile();
  for (const e of w.exporters()) assert.equal(e.metadata.annotations![RECLAIM_ANNOTATION], undefined);
});

Deno.test("reconcile: after a restart, an instance Jumpstarter has seen counts as unseen while its host is down", async () => {
  const w = new World();
  const [a, b] = await w.deployed();
  w.patchExporterStatus(a.metadata.name!, { lastSeen: "2026-12-04T10:00:00Z" });
  w.ctx.applied.clear(); // a restart: what this process applied is forgotten
  w.hosts.down.add(HOST);
  await w.reconcile();
  const available = condition(w.set, "Available")!;
  assert.equal(available.reason, "InstancesUnseen");
  assert.match(available.message!, new RegExp(`cannot look at ${a.metadata.name} on the host`));
  assert.doesNotMatch(available.message!, new RegExp(b.metadata.name!), "never seen by Jumpstarter: not ready");
});

Deno.test("reconcile: an unchanged instance is not re-sent; a rotated token is re-applied without a restart", async () => {
  const w = new World();
  const [a] = await w.deployed();
  const name = a.metadata.name!;
  await w.reconcile();
  assert.equal(w.applies(name), 1, "nothing changed: no apply");
  w.issueCredentials(w.exporter(name)!, "rotated");
  await w.reconcile();
  assert.equal(w.applies(name), 2);
  const config = w.hosts.instance(HOST, name)!.rendered.files.find((f) => f.path.endsWith(`${name}.yaml`))!;
  assert.match(config.content, /rotated/);
  assert.equal(w.hosts.instance(HOST, name)!.starts, 1, "a config change reloads, it does not restart");
  assert.ok(w.reasons().includes("Updated"));
});

Deno.test("reconcile: each resync, one inspection of the host checks every instance; only drifted ones are applied", async () => {
  const w = new World();
  const [a, b] = await w.deployed();
  const [na, nb] = [a.metadata.name!, b.metadata.name!];
  w.advance(5 * 60_000);
  let seen = w.hosts.calls.length;
  const since = () => w.hosts.calls.slice(seen).sort();
  await w.reconcile();
  await w.reconcile();
  assert.deepEqual(
    since(),
    [`inspect ${HOST}`],
    "in sync: one inspection for both, no apply, none until the next resync",
  );
  // by hand on the host: a's runtime quadlet edited, b's exporter stopped
  const ia = w.hosts.instance(HOST, na)!;
  const edit = (f: (typeof ia.rendered.files)[number]) =>
    f.path.endsWith("-runtime.container") ? { ...f, content: `${f.content}\n# edited` } : f;
  ia.rendered = { ...ia.rendered, files: ia.rendered.files.map(edit) };
  w.hosts.exit(HOST, nb);
  w.advance(5 * 60_000);
  seen = w.hosts.calls.length;
  await w.reconcile();
  assert.deepEqual(since(), [`apply ${HOST} ${na}`, `apply ${HOST} ${nb}`, `inspect ${HOST}`].sort());
  assert.doesNotMatch(w.hosts.instance(HOST, na)!.rendered.files.map((f) => f.content).join(), /# edited/);
  assert.equal(w.hosts.instance(HOST, nb)!.exporter, "active");
  seen = w.hosts.calls.length;
  w.advance(60_000);
  assert.equal(await sweep(w.ctx, undefined, w.clock.getTime() - 2 * 60_000), 0);
  assert.deepEqual(since(), [], "the sweep takes the resync's inspection when it began since the sweep before");
  await sweep(w.ctx, undefined);
  assert.deepEqual(since(), [`inspect ${HOST}`], "asked for a fresh look, it inspects");
});

Deno.test("reconcile: units left starting by the apply are ready once a look at the units finds them up, not re-applied", async () => {
  const w = new World();
  w.hosts.startLooks.set(HOST, 1);
  const [a, b] = await w.deployed();
  const [na, nb] = [a.metadata.name!, b.metadata.name!];
  let s = w.set.status!;
  assert.deepEqual([s.readyReplicas, s.exportersOffline], [0, 0], "starting: not ready, not offline");
  assert.equal(condition(w.set, "Degraded")?.status, "False");
  assert.equal(condition(w.set, "Progressing")?.reason, "ReplicasNotReady");
  let seen = w.hosts.calls.length;
  const since = () => w.hosts.calls.slice(seen);
  const out = await w.reconcile();
  assert.deepEqual(since(), [], "not looked at again within the second");
  assert.ok(out.requeueAfterMs! <= 1_000, `looked at again within a second: ${out.requeueAfterMs}`);
  w.advance(1_000);
  await w.reconcile();
  assert.deepEqual(
    since(),
    [`units ${HOST}`],
    "one look at the units for both (not a whole inspection), still activating, no apply",
  );
  assert.equal(w.set.status?.readyReplicas, 0);
  seen = w.hosts.calls.length;
  w.advance(1_000);
  const later = await w.reconcile();
  assert.deepEqual(since(), [`units ${HOST}`]);
  s = w.set.status!;
  assert.deepEqual([s.readyReplicas, s.availableReplicas], [2, 2], "ready once found active");
  assert.equal(condition(w.set, "Progressing")?.reason, "AllReplicasReady");
  assert.deepEqual([w.applies(na), w.applies(nb)], [1, 1], "applied once each");
  assert.ok(later.requeueAfterMs! >= 5_000 - 1_000, `ready: back to the fast-check cadence: ${later.requeueAfterMs}`);
});

Deno.test("reconcile: an Exporter that gets its credentials while the others apply is deployed by the same reconcile", async () => {
  const w = new World();
  await w.reconcile();
  const [a, b] = w.exporters();
  w.issueCredentials(a);
  const apply = w.hosts.apply.bind(w.hosts);
  w.hosts.apply = async (t, r, opts) => {
    // Jumpstarter's second issue lands while the first apply is on the host; the controller routes its event
    if (r.name === a.metadata.name && !w.exporter(b.metadata.name!)!.status?.credential) {
      w.issueCredentials(b);
      w.ctx.exporterChanges.tell(w.exporter(b.metadata.name!)!);
    }
    return await apply(t, r, opts);
  };
  await w.reconcile();
  assert.deepEqual([w.applies(a.metadata.name!), w.applies(b.metadata.name!)], [1, 1], "both applied by one reconcile");
  assert.equal(w.set.status?.replicas, 2);
  assert.equal(w.set.status?.conditions?.find((c) => c.reason === "WaitingForCredentials"), undefined);
  const seen = w.hosts.calls.length;
  await w.reconcile();
  assert.deepEqual(w.hosts.calls.slice(seen), [], "the next reconcile has nothing to apply");
});

Deno.test("reconcile: Jumpstarter's Online since the start is evidence of ready; an older Online is not", async () => {
  const w = new World();
  w.hosts.startLooks.set(HOST, 1_000);
  const [a, b] = await w.deployed();
  const start = w.clock.toISOString();
  // before the first look at units on their way up (50 ms after the apply): only Jumpstarter's word can tell
  w.advance(30);
  w.patchExporterStatus(a.metadata.name!, {
    conditions: [{ type: "Online", status: "True", reason: "Online", message: "", lastTransitionTime: start }],
  });
  const stale = new Date(w.clock.getTime() - 60_000).toISOString();
  w.patchExporterStatus(b.metadata.name!, {
    conditions: [{ type: "Online", status: "True", reason: "Online", message: "", lastTransitionTime: stale }],
  });
  const seen = w.hosts.calls.length;
  await w.reconcile();
  assert.deepEqual(w.hosts.calls.slice(seen), [], "no look at the host for it");
  assert.equal(w.set.status?.readyReplicas, 1, `only ${a.metadata.name}: ${JSON.stringify(w.set.status)}`);
});

Deno.test("reconcile: units still starting after 20 s are applied again, checked each second until then", async () => {
  const w = new World();
  w.hosts.startLooks.set(HOST, 1_000);
  const [a] = await w.deployed();
  const name = a.metadata.name!;
  const seen = w.hosts.calls.length;
  for (let s = 1; s < 20; s++) {
    w.advance(1_000);
    await w.reconcile();
  }
  assert.equal(w.applies(name), 1, "not applied again while starting");
  assert.deepEqual(new Set(w.hosts.calls.slice(seen)), new Set([`units ${HOST}`]));
  assert.equal(w.hosts.calls.length - seen, 19, "one look at the units a second for both instances");
  w.advance(1_000);
  const out = await w.reconcile();
  assert.equal(w.applies(name), 2, "applied again: its report has systemd's restarts and the journal");
  assert.ok(out.requeueAfterMs! <= 1_000);
  assert.equal(w.hosts.instance(HOST, name)!.starts, 1, "the apply finds it activating and starts nothing");
});

Deno.test("reconcile: a unit found down while starting is applied again, then checked at the crash-loop pace", async () => {
  const w = new World();
  w.hosts.startLooks.set(HOST, 1);
  const [a] = await w.deployed();
  const name = a.metadata.name!;
  w.hosts.exit(HOST, name);
  w.advance(1_000);
  const out = await w.reconcile();
  assert.equal(w.applies(name), 2, "inactive is drift: applied again");
  assert.equal(w.hosts.instance(HOST, name)!.starts, 2);
  assert.equal(w.ctx.exporterFailures.get(a.metadata.uid!)?.count, 1, "counted for the back-off");
  assert.ok(out.requeueAfterMs! <= 1_000, "the other instance is still looked at each second");
  const seen = w.hosts.calls.length;
  w.advance(1_000);
  const next = await w.reconcile();
  assert.equal(w.set.status?.readyReplicas, 1, "the other one came up");
  assert.ok(
    next.requeueAfterMs! >= 3_000,
    `the restarted one is looked at 5 s after its apply: ${next.requeueAfterMs}`,
  );
  w.advance(next.requeueAfterMs!);
  await w.reconcile();
  assert.equal(w.set.status?.readyReplicas, 1, "found activating still");
  w.advance(5_000);
  await w.reconcile();
  assert.equal(w.set.status?.readyReplicas, 2);
  assert.equal(w.hosts.calls.slice(seen).filter((c) => c.startsWith("apply")).length, 0, "never applied meanwhile");
});

Deno.test("reconcile: files are rendered for the host's facts: on first contact one apply learns them, for all", async () => {
  const w = new World();
  w.hosts.facts.set(HOST, { podman: "5.4.2", kvm: { mode: 0o660, gid: 993 } });
  const [a, b] = await w.deployed();
  const [na, nb] = [a.metadata.name!, b.metadata.name!];
  const groupAdd = (name: string) =>
    w.hosts.instance(HOST, name)!.rendered.files.find((f) => f.path.endsWith("-exporter.container"))!.content
      .match(/^PodmanArgs=.*$/m)?.[0];
  // the first apply on the unknown host goes alone, is refused for unknown facts and applied again at once; the
  // other instance waits for the facts it learned and is applied once
  assert.deepEqual([w.applies(na), w.applies(nb)], [2, 1]);
  assert.equal(groupAdd(na), "PodmanArgs=--group-add 993");
  assert.equal(groupAdd(nb), "PodmanArgs=--group-add 993");
  assert.equal(w.set.status?.conditions?.find((c) => c.reason === "DeployFailed"), undefined);
  w.issueCredentials(w.exporter(na)!, "rotated");
  await w.reconcile();
  assert.equal(w.applies(na), 3, "facts known: one apply");

  // the host's kvm group changes (a package re-created it): the resync's inspection sees it, the next apply renders
  // for it in one round trip
  w.hosts.facts.set(HOST, { podman: "5.4.2", kvm: { mode: 0o660, gid: 36 } });
  w.advance(5 * 60_000);
  await w.reconcile();
  assert.deepEqual([w.applies(na), w.applies(nb)], [4, 2]);
  assert.equal(groupAdd(na), "PodmanArgs=--group-add 36");
});

Deno.test("reconcile: scale-down drains after the cooldown, then deletes, then tears down", async () => {
  const w = new World();
  await w.deployed();
  w.updateSpec({ minAvailableReplicas: 1 });
  let out = await w.reconcile();
  assert.ok(w.exporters().every((e) => e.spec?.enabled !== false), "nothing drained during the cooldown");
  assert.ok(w.set.status?.surplusSince);
  assert.ok(out.requeueAfterMs! <= 5 * 60_000);
  w.advance(5 * 60_000);
  await w.reconcile();
  const drained = w.exporters().filter((e) => e.spec?.enabled === false);
  assert.equal(drained.length, 1);
  const name = drained[0].metadata.name!;
  assert.ok(w.reasons().includes("DrainingExporter"));
  await w.reconcile();
  assert.ok(w.exporter(name)?.metadata.deletionTimestamp, "a drained idle Exporter is deleted");
  out = await w.reconcile();
  assert.equal(w.exporter(name), undefined, "the finalizer let it go");
  assert.equal(w.hosts.instance(HOST, name), undefined, "after its instance was removed");
  assert.equal(w.exporters().length, 1);
  assert.equal(w.set.status?.replicas, 1);
  assert.equal(out.requeueAfterMs, 5 * 60_000);
});

Deno.test("reconcile: an Exporter leased between plan and write is neither drained nor deleted (M11)", async () => {
  const w = new World();
  await w.deployed();
  w.updateSpec({ minAvailableReplicas: 1, scaleDownCooldown: "0s" });
  // Jumpstarter assigns a lease just after the plan read the cache: the write carries what the plan saw.
  const leaseNow = (name: string) => w.patchExporterStatus(name, { leaseRef: { name: "just-now" } });
  const patch = w.kube.mergePatch.bind(w.kube);
  w.kube.mergePatch = ((r, ns, n, p, sub) => {
    if ((p as { spec?: { enabled?: boolean } }).spec?.enabled === false) leaseNow(n);
    return patch(r, ns, n, p, sub);
  }) as typeof patch;
  await assert.rejects(w.reconcile(), /changed since they were planned to drain or delete \(409 Conflict/);
  assert.ok(w.exporters().every((e) => e.spec?.enabled !== false), "the leased one was not drained");
  w.kube.mergePatch = patch;
  for (const e of w.exporters()) w.patchExporterStatus(e.metadata.name!, { leaseRef: undefined });
  await w.reconcile();
  const [drained] = w.exporters().filter((e) => e.spec?.enabled === false);
  assert.ok(drained, "drained once idle");
  const del = w.kube.delete.bind(w.kube);
  w.kube.delete = ((r, ns, n, pre) => {
    leaseNow(n);
    return del(r, ns, n, pre);
  }) as typeof del;
  await assert.rejects(w.reconcile(), /changed since they were planned/);
  assert.ok(!w.exporter(drained.metadata.name!)?.metadata.deletionTimestamp, "the just-leased one was not deleted");
  assert.ok(w.hosts.instance(HOST, drained.metadata.name!), "its instance runs on");
});

Deno.test("reconcile: creates go in slow-start batches, stop at a failure, bounded, and keep what succeeded (M11)", async () => {
  const w = new World({ minAvailableReplicas: 500, maxReplicas: 0 });
  const create = w.kube.create.bind(w.kube);
  let calls = 0;
  w.kube.create = ((r, obj) => {
    if (++calls === 3) return Promise.reject(new KubeError(500, "InternalError", "etcd is busy"));
    return create(r, obj);
  }) as typeof create;
  await assert.rejects(w.reconcile(), /etcd is busy/);
  assert.equal(calls, 3, "batch of 1, then a batch of 2 with the failure: no further batch");
  assert.equal(w.exporters().length, 2);
  const expected = w.ctx.expectations.get(w.set.metadata.uid!)?.names;
  assert.deepEqual(
    [...expected?.keys() ?? []].sort(),
    w.exporters().map((e) => e.metadata.name).sort(),
    "both expected",
  );
  assert.ok(w.reasons().includes("CreatedExporters"));
  await w.reconcile();
  assert.equal(w.exporters().length, 2 + MAX_CREATES, "at most MAX_CREATES a reconcile");
});

Deno.test("reconcile: a deleted Exporter's instance is removed before its finalizer; a host down keeps both", async () => {
  const w = new World();
  const [a] = await w.deployed();
  const name = a.metadata.name!;
  w.hosts.down.add(HOST);
  await w.kube.delete(EXPORTERS, NS, name);
  const out = await w.reconcile();
  assert.deepEqual(w.exporter(name)?.metadata.finalizers, [FINALIZER], "the finalizer stays while the host is down");
  assert.ok(w.hosts.instance(HOST, name));
  assert.equal(condition(w.set, "Degraded")?.reason, "TeardownFailed");
  // (sooner still while the other exporter, not yet reported Online, is in its window of close checks)
  assert.ok(out.requeueAfterMs! <= 10_000, "a host that is down is retried soon");
  w.hosts.down.delete(HOST);
  await w.reconcile();
  assert.equal(w.hosts.instance(HOST, name), undefined);
  assert.equal(w.exporter(name), undefined);
  assert.ok(w.events.some((e) => e.reason === "TornDown" && e.message.includes(name)));
});

Deno.test("reconcile: ExitAndReplace replaces an instance once a Lease naming it has ended", async () => {
  const w = new World();
  const [a, b] = await w.deployed();
  w.lease("l1", a.metadata.name!, false);
  await w.reconcile();
  assert.equal(w.set.status?.leasedReplicas, 1);
  assert.equal(w.exporters().length, 3, "one leased: a third keeps two idle");
  assert.ok(!w.exporter(a.metadata.name!)?.metadata.deletionTimestamp, "a running lease is left alone");
  w.hosts.exit(HOST, a.metadata.name!);
  w.lease("l1", a.metadata.name!, true);
  await w.reconcile();
  assert.ok(w.exporter(a.metadata.name!)?.metadata.deletionTimestamp, "replaced once the lease ended");
  assert.ok(!w.exporter(b.metadata.name!)?.metadata.deletionTimestamp);
  // a user's next lease cannot have it: not available from the reconcile that recycles it on (b is; the third is
  // still on its way up)
  assert.deepEqual([w.set.status?.availableReplicas, w.set.status?.exportersDisabled], [1, 1]);
  await w.reconcile();
  assert.equal(w.exporter(a.metadata.name!), undefined);
  assert.equal(w.hosts.instance(HOST, a.metadata.name!), undefined);
});

Deno.test("reconcile: ExitAndReplace disables before it deletes, and keeps one that took a new lease (#935)", async () => {
  const w = new World();
  const [a] = await w.deployed();
  const name = a.metadata.name!;
  w.lease("l1", name, true);
  // Jumpstarter hands the exporter the next lease just as the set disables it
  const patch = w.kube.mergePatch.bind(w.kube);
  w.kube.mergePatch = async <T>(...args: Parameters<typeof patch>) => {
    const out = await patch<T>(...args);
    if (args[2] === name && JSON.stringify(args[3]) === '{"spec":{"enabled":false}}') {
      w.patchExporterStatus(name, { leaseRef: { name: "l2" } });
    }
    return out;
  };
  await w.reconcile();
  const own = (s: string) => s.endsWith(`/${name}`);
  assert.deepEqual(w.kube.writes.filter(own).slice(-1), [`patch exporters ${NS}/${name}`], "disabled, not deleted");
  assert.equal(w.exporter(name)?.spec?.enabled, false);
  assert.ok(!w.exporter(name)?.metadata.deletionTimestamp, "the new lease keeps it");
  assert.ok(w.events.some((e) => e.reason === "RecycleDeferred" && e.message.includes("lease l2")));
  // the second lease ends too: now it is replaced, without another disable
  w.kube.mergePatch = patch;
  w.patchExporterStatus(name, { leaseRef: undefined });
  w.lease("l2", name, true);
  const writes = w.kube.writes.length;
  await w.reconcile();
  assert.deepEqual(w.kube.writes.slice(writes).filter(own), [`delete exporters ${NS}/${name}`]);
  assert.ok(w.exporter(name)?.metadata.deletionTimestamp, "replaced once unleased");
});

Deno.test("reconcile: an exporter down without its lease ending is started with back-off, Degraded after 3", async () => {
  const w = new World();
  const [a] = await w.deployed();
  const name = a.metadata.name!;
  // Jumpstarter reports it offline (a new report each time), which is what prompts a re-apply
  const exitAndReport = () => {
    w.hosts.exit(HOST, name);
    w.patchExporterStatus(name, {
      conditions: [{
        type: "Online",
        status: "False",
        reason: "Offline",
        message: "",
        lastTransitionTime: w.clock.toISOString(),
      }],
    });
  };
  for (let start = 1; start <= 3; start++) {
    w.advance(60_000);
    exitAndReport();
    await w.reconcile();
    assert.equal(w.hosts.instance(HOST, name)!.starts, 1 + start, `started again (${start})`);
    assert.equal(w.ctx.exporterFailures.get(a.metadata.uid!)?.count, start);
  }
  assert.equal(condition(w.set, "Degraded")?.reason, "ExporterFailing");
  assert.match(condition(w.set, "Degraded")?.message ?? "", /went down 3 times without its lease ending/);
  // within the back-off (40 s after the third start) it is left down, and the set is looked at when it ends
  w.advance(1_000);
  exitAndReport();
  const out = await w.reconcile();
  assert.equal(w.hosts.instance(HOST, name)!.exporter, "exited");
  assert.ok(out.requeueAfterMs! <= 40_000 - 1_000);
  w.advance(40_000);
  exitAndReport();
  await w.reconcile();
  assert.equal(w.hosts.instance(HOST, name)!.exporter, "active", "started again once the back-off ended");
});

Deno.test("reconcile: an exporter that exits before it was ever Online is started again within seconds", async () => {
  // Why 6 of issue 18: `jmp run` gave up on a controller that was not ready yet and exited 0; Jumpstarter never saw
  // it online, so no report prompts a re-apply, and Restart=on-failure leaves it down
  const w = new World();
  const [a] = await w.deployed();
  const name = a.metadata.name!;
  const out = await w.reconcile();
  assert.ok(out.requeueAfterMs! <= 5_000, `looked at again within seconds, not at the resync: ${out.requeueAfterMs}`);
  w.advance(50_000);
  w.hosts.exit(HOST, name);
  const seen = w.hosts.calls.length;
  await w.reconcile();
  assert.deepEqual(w.hosts.calls.slice(seen), [`units ${HOST}`, `apply ${HOST} ${name}`], "the units asked, not all");
  assert.equal(w.hosts.instance(HOST, name)!.exporter, "active", "started again at the next check");
  assert.equal(w.hosts.instance(HOST, name)!.starts, 2);
  assert.equal(w.ctx.exporterFailures.get(a.metadata.uid!)?.count, 1, "counted for the back-off");
  // once Jumpstarter reports it Online, the resync is enough
  for (const e of w.exporters()) {
    w.patchExporterStatus(e.metadata.name!, { conditions: [{ type: "Online", status: "True" }] });
  }
  w.advance(5_000);
  assert.equal((await w.reconcile()).requeueAfterMs, w.ctx.resyncMs);
});

Deno.test("reconcile: a close look at the units takes a whole inspection begun since instead of asking again", async () => {
  const w = new World();
  await w.deployed();
  w.advance(5_000);
  await sweep(w.ctx, undefined);
  const seen = w.hosts.calls.length;
  await w.reconcile();
  assert.deepEqual(w.hosts.calls.slice(seen), [], "the sweep's inspection answered the fast check");
  w.advance(5_000);
  await w.reconcile();
  assert.deepEqual(w.hosts.calls.slice(seen), [`units ${HOST}`], "none since: the units are asked");
});

Deno.test("reconcile: status counts ready, idle, leased and disabled exporters", async () => {
  const w = new World();
  await w.reconcile();
  assert.equal(w.set.status?.replicas, 0, "counted once the cache shows them");
  await w.reconcile();
  assert.equal(w.set.status?.replicas, 2);
  assert.equal(w.set.status?.readyReplicas, 0, "waiting for credentials");
  assert.equal(condition(w.set, "Progressing")?.status, "True");
  const [a] = await w.deployed();
  let s = w.set.status!;
  assert.deepEqual(
    [s.replicas, s.readyReplicas, s.availableReplicas, s.leasedReplicas, s.exportersDisabled],
    [2, 2, 2, 0, 0],
  );
  assert.equal(condition(w.set, "Available")?.status, "True");
  w.patchExporterStatus(a.metadata.name!, { leaseRef: { name: "l1" } });
  await w.reconcile();
  s = w.set.status!;
  assert.deepEqual([s.replicas, s.readyReplicas, s.availableReplicas, s.leasedReplicas], [2, 2, 1, 1]);
  await w.reconcile();
  s = w.set.status!;
  assert.deepEqual([s.replicas, s.readyReplicas, s.availableReplicas, s.leasedReplicas], [3, 2, 1, 1], "one more");
  assert.equal(s.observedGeneration, 1);
});

Deno.test("reconcile: a deleted set's Exporters are deleted once the API confirms it is gone, then torn down", async () => {
  const w = new World();
  const [a, b] = await w.deployed();
  const caches = w.ctx.caches;
  // the sets' cache lags: the set is still there
  w.ctx.caches = { ...caches, sets: { get: () => undefined, list: () => [] } };
  const writes = w.kube.writes.length;
  assert.deepEqual(await w.reconcile(), {});
  assert.equal(w.kube.writes.length, writes, "the API still has the set: nothing deleted");
  w.ctx.caches = caches;
  await w.kube.delete(EXPORTER_SETS, NS, SET);
  await w.reconcile();
  assert.deepEqual(w.kube.writes.slice(writes).filter((x) => x.startsWith("delete exporters ")).sort(), [
    `delete exporters ${NS}/${a.metadata.name}`,
    `delete exporters ${NS}/${b.metadata.name}`,
  ], "not left to the garbage collector's pace");
  await w.reconcile(); // on the watch event of their deletion
  assert.deepEqual(w.exporters(), []);
  for (const e of [a, b]) assert.equal(w.hosts.instance(HOST, e.metadata.name!), undefined);
  assert.deepEqual(await w.reconcile(), {}, "nothing left to look at");
});

Deno.test("reconcile: an Exporter deleted while another's teardown runs is torn down by the same reconcile", async () => {
  const w = new World();
  const [a, b] = await w.deployed();
  const applies = w.hosts.calls.filter((c) => c.startsWith("apply")).length;
  await w.kube.delete(EXPORTERS, NS, a.metadata.name!);
  const remove = w.hosts.remove.bind(w.hosts);
  w.hosts.remove = async (t, name, uid) => {
    // the second deletion reaches the cache while the first remove is on the host; the controller routes its event
    if (name === a.metadata.name && !w.exporter(b.metadata.name!)!.metadata.deletionTimestamp) {
      await w.kube.delete(EXPORTERS, NS, b.metadata.name!);
      w.ctx.exporterChanges.tell(w.exporter(b.metadata.name!)!);
    }
    return await remove(t, name, uid);
  };
  await w.reconcile();
  assert.deepEqual(
    w.hosts.calls.filter((c) => c.startsWith("remove")).sort(),
    [`remove ${HOST} ${a.metadata.name}`, `remove ${HOST} ${b.metadata.name}`],
    "both removed by one reconcile",
  );
  assert.deepEqual([w.exporter(a.metadata.name!), w.exporter(b.metadata.name!)], [undefined, undefined], "both let go");
  assert.equal(
    w.hosts.calls.filter((c) => c.startsWith("apply")).length,
    applies,
    "the one that joined is not applied",
  );
});

Deno.test("reconcile: an Exporter torn down is not torn down again while the cache still shows its finalizer", async () => {
  const w = new World();
  const [a] = await w.deployed();
  await w.kube.delete(EXPORTERS, NS, a.metadata.name!);
  const lagging = w.exporters(); // as the cache holds them until the finalizer's removal reaches it
  await w.reconcile();
  const removes = () => w.hosts.calls.filter((c) => c.startsWith("remove")).length;
  assert.equal(removes(), 1);
  const caches = w.ctx.caches;
  w.ctx.caches = { ...caches, exporters: { get: () => undefined, list: () => lagging } };
  const torn = w.reasons().filter((r) => r === "TornDown").length;
  await w.reconcile();
  w.ctx.caches = caches;
  assert.equal(removes(), 1, "not removed a second time");
  assert.equal(w.reasons().filter((r) => r === "TornDown").length, torn, "nor told twice");
});

Deno.test("reconcile: Exporters orphaned by kubectl delete --cascade=orphan are not deleted, even seen late", async () => {
  const w = new World();
  const seen = await w.deployed();
  // the garbage collector drops the owner references before the set goes; the Exporters' cache has not caught up
  for (const e of seen) w.kube.put(EXPORTERS, { ...e, metadata: { ...e.metadata, ownerReferences: [] } });
  await w.kube.delete(EXPORTER_SETS, NS, SET);
  const caches = w.ctx.caches;
  w.ctx.caches = { ...caches, exporters: { get: () => undefined, list: () => seen } };
  const writes = w.kube.writes.length;
  await w.reconcile();
  assert.deepEqual(w.kube.writes.slice(writes), [], "the deletes' preconditions fail: the Exporters changed");
  w.ctx.caches = caches;
  assert.equal(w.exporters().filter((e) => !e.metadata.deletionTimestamp).length, 2);
});

Deno.test("reconcile: an Exporter that is not ours is never changed, whatever set it names", async () => {
  const w = new World();
  const foreign = (name: string, owner: string, extra: Partial<Exporter["metadata"]> = {}) =>
    w.kube.put<Exporter>(EXPORTERS, {
      metadata: {
        name,
        namespace: NS,
        ownerReferences: [{
          apiVersion: "v1",
          kind: "ExporterSet",
          name: owner,
          uid: `uid-${owner}`,
          controller: true,
        }],
        ...extra,
      },
    });
  const unseen = foreign("stranger", "some-other-set");
  // our label but another's finalizer, being deleted: its teardown is someone else's
  const deleting = foreign("half-ours", "gone-set", {
    labels: { [SET_LABEL]: "gone-set" },
    finalizers: ["example.com/other"],
    deletionTimestamp: w.clock.toISOString(),
  });
  // our finalizer without our label: not ours to tear down, and stuck unless someone is told
  const stuck = foreign("unlabelled", "gone-set", {
    finalizers: [FINALIZER],
    deletionTimestamp: w.clock.toISOString(),
  });
  const writes = w.kube.writes.length;
  for (const set of ["some-other-set", "gone-set"]) await reconcile(w.ctx, `${NS}/${set}`);
  assert.equal(w.kube.writes.length, writes);
  assert.deepEqual(w.exporter("stranger"), unseen);
  assert.deepEqual(w.exporter("half-ours"), deleting);
  assert.deepEqual(w.exporter("unlabelled"), stuck);
  assert.deepEqual(w.events.map((e) => [e.object, e.reason]), [["unlabelled", "NotOurs"]]);
});

Deno.test("reconcile: teardown names the Exporter's uid: a same-name instance of another namespace stays", async () => {
  const w = new World();
  const [a] = await w.deployed();
  const name = a.metadata.name!;
  // the host's files under this name belong to another namespace's Exporter (our apply was refused there)
  const inst = w.hosts.instance(HOST, name)!;
  inst.rendered = { ...inst.rendered, namespace: "elsewhere", uid: "uid-of-elsewhere" };
  await w.kube.delete(EXPORTERS, NS, name);
  await w.reconcile();
  assert.equal(w.hosts.instance(HOST, name)?.rendered.uid, "uid-of-elsewhere", "not removed");
  assert.equal(w.exporter(name), undefined, "nothing of ours there: the finalizer is let go");
  assert.ok(w.events.some((e) => e.reason === "OwnerConflict" && e.object === name));
  assert.ok(!w.events.some((e) => e.reason === "TornDown" && e.message.includes(name)), "nothing was removed");
});

Deno.test("reconcile: under foreground deletion no Exporter is created; Retain keeps the instances", async () => {
  const w = new World();
  w.kube.put<VirtualTargetClass>(VIRTUAL_TARGET_CLASSES, {
    ...w.ctx.caches.classes.get(NS, "qemu")!,
    spec: { ...w.ctx.caches.classes.get(NS, "qemu")!.spec, reclaimPolicy: "Retain" },
  });
  const [a, b] = await w.deployed();
  w.kube.put(EXPORTER_SETS, { ...w.set, metadata: { ...w.set.metadata, finalizers: ["foregroundDeletion"] } });
  await w.kube.delete(EXPORTER_SETS, NS, SET);
  await w.kube.delete(EXPORTERS, NS, a.metadata.name!); // the garbage collector, one dependent at a time
  await w.reconcile();
  await w.reconcile();
  assert.deepEqual(w.exporters().map((e) => e.metadata.name), [b.metadata.name], "a went, none came");
  assert.ok(w.hosts.instance(HOST, a.metadata.name!), "Retain: the instance stays on the host");
  assert.ok(w.reasons().includes("Retained"));
});

Deno.test("reconcile: teardown of a deleted set's Exporter uses the key its host accepts", async () => {
  const w = new World();
  const [a] = await w.deployed();
  const name = a.metadata.name!;
  // a class listed before ours, with another key that parses and another host
  const other = await ed25519Key("test");
  w.kube.put<Secret>(SECRETS, { metadata: { name: "a-key", namespace: NS }, data: { "ssh-privatekey": b64(other) } });
  w.kube.put<VirtualTargetClass>(VIRTUAL_TARGET_CLASSES, {
    metadata: { name: "a-first", namespace: NS },
    spec: { provisioner: PROVISIONER, credentialsSecretRef: { name: "a-key" }, parameters: { host: { name: "b" } } },
  });
  const ours = w.ctx.caches.classes.get(NS, "qemu")!;
  await w.kube.delete(VIRTUAL_TARGET_CLASSES, NS, "qemu");
  w.kube.put(VIRTUAL_TARGET_CLASSES, ours); // now listed after the other
  w.hosts.keys.set(HOST, KEY);
  await w.kube.delete(EXPORTER_SETS, NS, SET);
  await w.kube.delete(EXPORTERS, NS, name);
  await w.reconcile();
  assert.equal(w.exporter(name), undefined);
  assert.equal(w.hosts.instance(HOST, name), undefined);
});

Deno.test("reconcile: with the class deleted first and the process restarted, teardown uses the Secret the Exporter recorded", async () => {
  const w = new World();
  const [a] = await w.deployed();
  const name = a.metadata.name!;
  assert.equal(w.exporter(name)!.metadata.annotations?.[CREDENTIALS_ANNOTATION], "lab-ssh-key");
  w.hosts.keys.set(HOST, KEY);
  await w.kube.delete(VIRTUAL_TARGET_CLASSES, NS, "qemu");
  await w.reconcile();
  w.ctx.knownTargets.clear(); // a restart: the keys the hosts took are remembered by the process only
  await w.kube.delete(EXPORTER_SETS, NS, SET);
  await w.kube.delete(EXPORTERS, NS, name);
  await w.reconcile();
  assert.equal(w.exporter(name), undefined);
  assert.equal(w.hosts.instance(HOST, name), undefined, "torn down, not abandoned");
  assert.ok(!w.reasons().includes("TeardownAbandoned"));
});

Deno.test("reconcile: teardown with no key the host accepts is reported, not retried as if the host were down", async () => {
  const w = new World();
  const [c] = await w.deployed();
  w.hosts.keys.set(HOST, "a key no class has");
  await w.kube.delete(EXPORTER_SETS, NS, SET);
  await w.kube.delete(EXPORTERS, NS, c.metadata.name!);
  const out = await w.reconcile();
  assert.ok(w.exporter(c.metadata.name!), "kept until the instance can be removed");
  assert.ok(w.events.some((e) => e.reason === "TeardownNoKey" && e.object === c.metadata.name));
  assert.ok(out.requeueAfterMs! >= 30_000, "not retried as if the host were just down");
});

Deno.test("sweep: removes instances whose Exporter is gone, keeps live and retained ones", async () => {
  const w = new World();
  const [a, b] = await w.deployed();
  // b's Exporter goes behind our back (no finalizer run): its instance is an orphan
  const gone = w.exporter(b.metadata.name!)!;
  w.kube.put(EXPORTERS, { ...gone, metadata: { ...gone.metadata, finalizers: [] } });
  await w.kube.delete(EXPORTERS, NS, b.metadata.name!);
  assert.equal(await sweep(w.ctx, NS), 1);
  assert.ok(w.hosts.instance(HOST, a.metadata.name!));
  assert.equal(w.hosts.instance(HOST, b.metadata.name!), undefined);
  assert.ok(!w.ctx.applied.has(b.metadata.uid!), "its apply memory is dropped");
  assert.equal(await sweep(w.ctx, "elsewhere"), 0, "namespaced: other namespaces' instances are not judged");
});

Deno.test("sweep: what it cannot prove ours stays, cluster-wide too: an unlabelled volume, an uid-less leftover", async () => {
  const w = new World();
  await w.deployed();
  const bare = { files: [], ownerMismatch: false, containers: [], volume: true, diskVolume: true };
  w.hosts.strays.set(HOST, [
    { ...bare, name: "unlabelled" },
    { ...bare, name: "no-namespace", uid: "uid-gone" },
  ]);
  assert.equal(await sweep(w.ctx, undefined), 0);
  assert.ok(!w.hosts.calls.some((c) => c.startsWith("remove")));
});

/** The extra Exporter a lease makes the set create is issued its credentials and deployed too. */
async function credentialsForAll(w: World): Promise<void> {
  await w.reconcile();
  for (const e of w.exporters()) if (!e.status?.credential) w.issueCredentials(e);
  await w.reconcile();
}

Deno.test("reconcile: a runtime change waits for the lease, then rolls; status counts the outdated", async () => {
  const w = new World({ recycleStrategy: "InPlaceReuse" });
  const [a, b] = await w.deployed();
  const [leased, idle] = [a.metadata.name!, b.metadata.name!];
  w.lease("l1", leased, false);
  await credentialsForAll(w);
  w.updateSpec({ images: { runtime: { imagePullPolicy: "Always" } } });
  await w.reconcile();
  assert.equal(w.hosts.instance(HOST, leased)!.starts, 1, "the leased instance keeps running");
  assert.match(w.hosts.instance(HOST, leased)!.rendered.files.map((f) => f.content).join(), /Pull=always/i);
  assert.equal(w.hosts.instance(HOST, idle)!.starts, 2, "an idle one is restarted at once");
  assert.equal(w.set.status?.replicas, 3);
  assert.equal(w.set.status?.updatedReplicas, 2);
  const waiting = condition(w.set, "Progressing");
  assert.equal(waiting?.reason, "WaitingForLease");
  assert.match(waiting?.message ?? "", new RegExp(`${leased}.*lease l1`));
  w.advance(10 * 60_000);
  await w.reconcile();
  assert.equal(w.hosts.instance(HOST, leased)!.starts, 1, "not on a resync either");
  w.issueCredentials(w.exporter(leased)!, "rotated-under-lease");
  await w.reconcile();
  const files = w.hosts.instance(HOST, leased)!.rendered.files.map((f) => f.content).join();
  assert.match(files, /rotated-under-lease/, "a rotated token reaches it at once");
  assert.equal(w.hosts.instance(HOST, leased)!.starts, 1, "by a reload, not a restart");
  w.lease("l1", leased, true);
  await w.reconcile();
  assert.equal(w.hosts.instance(HOST, leased)!.starts, 2, "restarted once its lease ended");
  assert.equal(w.set.status?.updatedReplicas, w.set.status?.replicas);
  assert.notEqual(condition(w.set, "Progressing")?.reason, "WaitingForLease");
});

/** Two instances, both leased when a runtime change comes: each owes a restart for after its lease. */
async function twoLeasedOweRestarts() {
  const w = new World({ recycleStrategy: "InPlaceReuse" });
  const [a, b] = await w.deployed();
  for (const e of [a, b]) w.patchExporterStatus(e.metadata.name!, { leaseRef: { name: `l-${e.metadata.name}` } });
  await w.reconcile();
  w.updateSpec({ images: { runtime: { imagePullPolicy: "Always" } } });
  await w.reconcile();
  return { w, a, b };
}

Deno.test("reconcile: pending restarts roll one instance at a time once their leases end", async () => {
  const { w, a, b } = await twoLeasedOweRestarts();
  for (const e of [a, b]) w.patchExporterStatus(e.metadata.name!, { leaseRef: undefined });
  const out = await w.reconcile();
  const starts = () => [a, b].map((e) => w.hosts.instance(HOST, e.metadata.name!)!.starts);
  assert.deepEqual(starts().sort(), [1, 2], "one restarted, the other still waits");
  assert.ok(out.requeueAfterMs! <= 10_000, "and is looked at again soon");
  await w.reconcile();
  assert.deepEqual(starts(), [2, 2]);
  assert.equal(w.set.status?.updatedReplicas, w.set.status?.replicas);
});

Deno.test("reconcile: the next pending restart rolls only once the one before is up", async () => {
  const { w, a, b } = await twoLeasedOweRestarts();
  w.hosts.startLooks.set(HOST, 1);
  for (const e of [a, b]) w.patchExporterStatus(e.metadata.name!, { leaseRef: undefined });
  await w.reconcile();
  const starts = () => [a, b].map((e) => w.hosts.instance(HOST, e.metadata.name!)!.starts).sort();
  assert.deepEqual(starts(), [1, 2], "one restarted");
  w.advance(1_000);
  await w.reconcile();
  assert.deepEqual(starts(), [1, 2], "its units still activating: the other waits");
  w.advance(1_000);
  await w.reconcile();
  assert.deepEqual(starts(), [1, 2], "found up in this reconcile: the other rolls at the next");
  await w.reconcile();
  assert.deepEqual(starts(), [2, 2]);
});

Deno.test("reconcile: a new host-key pin in the namespace re-applies no instance (M7)", async () => {
  const w = new World();
  const [a, b] = await w.deployed();
  const before = [a, b].map((e) => w.applies(e.metadata.name!));
  w.kube.put<Secret>(SECRETS, {
    metadata: { name: "qemu-ssh-known-hosts", namespace: NS },
    data: { known_hosts: b64("lab-host-02.example.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE0000\n") },
  });
  await w.reconcile();
  assert.deepEqual([a, b].map((e) => w.applies(e.metadata.name!)), before, "trust changed, not what runs");
});

Deno.test("reconcile: a host name's case or a new user is no move: re-applied in place (M12)", async () => {
  const w = new World({ recycleStrategy: "InPlaceReuse" });
  const [a, b] = await w.deployed();
  const names = [a, b].map((e) => e.metadata.name!);
  const spelled = "LAB-HOST-01.Example.COM";
  // the user is the class's to give away (spec.setOverrides)
  const cls = w.ctx.caches.classes.get(NS, "qemu")!;
  w.kube.put(VIRTUAL_TARGET_CLASSES, { ...cls, spec: { ...cls.spec, setOverrides: { user: true } } });
  w.updateSpec({ parameters: { host: { name: spelled } } });
  await w.reconcile();
  w.updateSpec({ parameters: { host: { name: spelled }, ssh: { user: "ops" } } });
  await w.reconcile();
  assert.deepEqual(w.hosts.calls.filter((c) => c.startsWith("remove")), [], "nothing removed");
  for (const name of names) {
    assert.equal(w.hosts.instance(HOST, name)?.starts, 1, `${name} kept running: not re-created`);
    assert.equal(w.exporter(name)?.metadata.annotations?.[TARGET_ANNOTATION], `ops@${spelled}:22`);
  }
  assert.ok(!w.reasons().includes("Moved"));
  w.updateSpec({ parameters: { host: { name: "lab-host-02.example.com" } } });
  await w.reconcile();
  assert.ok(w.reasons().includes("Moved"), "another host is still a move");
});

Deno.test("reconcile: a host move leaves a leased instance on the old host until its lease ends", async () => {
  const other = "lab-host-02.example.com";
  const w = new World();
  const [a, b] = await w.deployed();
  const [leased, idle] = [a.metadata.name!, b.metadata.name!];
  w.lease("l1", leased, false);
  await credentialsForAll(w);
  w.updateSpec({ parameters: { host: { name: other } } });
  await w.reconcile();
  assert.ok(w.hosts.instance(HOST, leased), "the leased instance stays where it is");
  assert.equal(w.hosts.instance(other, leased), undefined);
  assert.equal(w.hosts.instance(HOST, idle), undefined, "an idle one moves");
  assert.ok(w.hosts.instance(other, idle));
  assert.equal(w.exporter(leased)?.metadata.annotations?.[HOST_ANNOTATION], HOST);
  assert.equal(condition(w.set, "Progressing")?.reason, "WaitingForLease");
  assert.ok((w.set.status?.updatedReplicas ?? 0) < (w.set.status?.replicas ?? 0));
  w.lease("l1", leased, true);
  await w.reconcile();
  assert.equal(w.hosts.instance(other, leased), undefined, "replaced (ExitAndReplace), not moved");
  await w.reconcile();
  assert.equal(w.hosts.instance(HOST, leased), undefined, "removed from the old host once the lease ended");
});

Deno.test("reconcile: instances it cannot see are counted as last seen, and the status says unknown", async () => {
  const w = new World();
  const [a, b] = await w.deployed();
  assert.equal(w.set.status?.readyReplicas, 2);
  w.hosts.down.add(HOST);
  w.advance(10 * 60_000);
  await w.reconcile();
  assert.equal(w.set.status?.readyReplicas, 2, "not 0: they keep running as far as anyone knows");
  let available = condition(w.set, "Available");
  assert.equal(available?.status, "Unknown");
  assert.match(available?.message ?? "", new RegExp(`${a.metadata.name}.*${b.metadata.name}`));
  // a restarted controller has no memory of its applies: Jumpstarter's Online report is the last word
  w.ctx.applied.clear();
  for (const e of [a, b]) {
    w.patchExporterStatus(e.metadata.name!, {
      conditions: [{ type: "Online", status: "True", reason: "Online", message: "", lastTransitionTime: "" }],
    });
  }
  await w.reconcile();
  assert.equal(w.set.status?.readyReplicas, 2);
  w.hosts.down.delete(HOST);
  await w.reconcile();
  available = condition(w.set, "Available");
  assert.equal(available?.status, "True");
  assert.equal(w.set.status?.readyReplicas, 2);
  // the host is up but no longer takes our key
  w.hosts.keys.set(HOST, "another key");
  w.advance(10 * 60_000);
  await w.reconcile();
  assert.equal(w.set.status?.readyReplicas, 2);
  assert.equal(condition(w.set, "Available")?.status, "Unknown");
  assert.equal(condition(w.set, "Degraded")?.reason, "AuthenticationFailed");
});

Deno.test("reconcile: a pending lease matching two sets with room is demand of the oldest only", async () => {
  const w = new World();
  const cls = w.ctx.caches.classes.get(NS, "qemu")!;
  w.kube.put(VIRTUAL_TARGET_CLASSES, { ...cls, spec: { ...cls.spec, bindingMode: "WaitForFirstConsumer" } });
  w.advance(1_000);
  w.kube.put<ExporterSet>(EXPORTER_SETS, { ...w.set, metadata: { name: "pool-b", namespace: NS, generation: 1 } });
  w.kube.put<Lease>(JUMPSTARTER_LEASES, {
    metadata: { name: "waiting", namespace: NS },
    spec: { selector: { matchLabels: { board: "qemu" } } },
    status: { ended: false },
  });
  // the younger set first: the order of reconciles must not decide whose demand it is
  await reconcile(w.ctx, `${NS}/pool-b`);
  await w.reconcile();
  const of = (set: string) => w.exporters().filter((e) => e.metadata.labels?.[SET_LABEL] === set).length;
  assert.equal(of(SET), 3, "the oldest matching set counts the lease");
  assert.equal(of("pool-b"), 2, "the other set does not count it again");
});

Deno.test("reconcile: pending demand spills over to the next matching set with room, one set per lease", async () => {
  // the seed's multi-host recipe: one set per host, each at maxReplicas 1, two leases waiting
  const w = new World({ minAvailableReplicas: 0, maxReplicas: 1 });
  const cls = w.ctx.caches.classes.get(NS, "qemu")!;
  w.kube.put(VIRTUAL_TARGET_CLASSES, { ...cls, spec: { ...cls.spec, bindingMode: "WaitForFirstConsumer" } });
  w.advance(1_000);
  w.kube.put<ExporterSet>(EXPORTER_SETS, { ...w.set, metadata: { name: "pool-b", namespace: NS, generation: 1 } });
  for (const name of ["waiting-1", "waiting-2"]) {
    w.kube.put<Lease>(JUMPSTARTER_LEASES, {
      metadata: { name, namespace: NS },
      spec: { selector: { matchLabels: { board: "qemu" } } },
      status: { ended: false },
    });
    w.advance(1_000);
  }
  await reconcile(w.ctx, `${NS}/pool-b`);
  await w.reconcile();
  const of = (set: string) => w.exporters().filter((e) => e.metadata.labels?.[SET_LABEL] === set).length;
  assert.deepEqual([of(SET), of("pool-b")], [1, 1], "each lease is served by one set");
  // a third lease finds no room: it stays with the oldest set, whose status says it is capped
  w.kube.put<Lease>(JUMPSTARTER_LEASES, {
    metadata: { name: "waiting-3", namespace: NS },
    spec: { selector: { matchLabels: { board: "qemu" } } },
    status: { ended: false },
  });
  await reconcile(w.ctx, `${NS}/pool-b`);
  await w.reconcile();
  assert.deepEqual([of(SET), of("pool-b")], [1, 1]);
  assert.equal(condition(w.set, "ScalingLimited")?.reason, "AtMaxReplicas");
});

Deno.test("reconcile: a set overriding what its class keeps deploys nothing and says which class rule", async () => {
  const w = new World({ parameters: { runtime: { devices: ["/dev/sda"] } } });
  await w.reconcile();
  await w.reconcile();
  assert.equal(w.hosts.calls.filter((c) => c.startsWith("apply")).length, 0, "nothing reaches the host");
  const degraded = condition(w.set, "Degraded");
  assert.equal(degraded?.reason, "InvalidParameters");
  assert.match(
    degraded?.message ?? "",
    /ExporterSet pool: spec\.parameters\.runtime\.devices\[0\]: \/dev\/sda is not a device VirtualTargetClass qemu .*spec\.setOverrides\.devices/,
  );
  // the lab admin allows it on the class: deployed
  const cls = w.ctx.caches.classes.get(NS, "qemu")!;
  w.kube.put(VIRTUAL_TARGET_CLASSES, { ...cls, spec: { ...cls.spec, setOverrides: { devices: ["/dev/sd?"] } } });
  await w.deployed();
  assert.equal(condition(w.set, "Degraded")?.status, "False");
  assert.deepEqual(
    w.hosts.instance(HOST, w.exporters()[0].metadata.name!)?.rendered.name,
    w.exporters()[0].metadata.name,
  );
});

Deno.test("reconcile: status.selector selects only this set's Exporters", async () => {
  const w = new World();
  await w.reconcile();
  await w.reconcile();
  assert.equal(w.set.status?.selector, `board=qemu,${SET_LABEL}=${SET}`);
});

Deno.test("reconcile: problems are retried within --resync when it is shorter than the retry interval", async () => {
  const w = new World();
  const [a] = await w.deployed();
  w.ctx.resyncMs = 4_000;
  w.hosts.down.add(HOST);
  await w.kube.delete(EXPORTERS, NS, a.metadata.name!);
  assert.equal((await w.reconcile()).requeueAfterMs, 4_000, "a transient problem");
  w.hosts.down.delete(HOST);
  const cls = w.ctx.caches.classes.get(NS, "qemu")!;
  w.kube.put(VIRTUAL_TARGET_CLASSES, { ...cls, spec: { ...cls.spec, parameters: { host: {} } } });
  assert.equal((await w.reconcile()).requeueAfterMs, 4_000, "a problem waiting for a person");
});

/**
 * What another controller (or an older version of this one) left on HOST under `name`: a copy of `like`'s files whose
 * ownership lines name `uid` and `controller` (none: written before identities were recorded).
 */
function foreignCopy(w: World, like: string, name: string, uid: string, controller?: string): void {
  const from = w.hosts.instance(HOST, like)!;
  const label = `Label=${PROVISIONER}/controller=`;
  const owner = (c: string) =>
    c.replace(/ controller=\S+/, controller ? ` controller=${controller}` : "").replace(/ uid=\S+$/m, ` uid=${uid}`)
      .replace(new RegExp(`^${label}.*$`, "m"), controller ? `${label}${controller}` : "# no label");
  w.hosts.hosts.get(HOST)!.set(name, {
    ...from,
    rendered: {
      ...from.rendered,
      name,
      uid,
      controller,
      files: from.rendered.files.map((f) => ({ ...f, content: owner(f.content) })),
    },
  });
}

const snapshot = (w: World, name: string) => JSON.stringify(w.hosts.instance(HOST, name)?.rendered.files);

Deno.test("sweep: removes only instances with this controller's identity; another cluster's and older ones stay", async () => {
  const w = new World();
  const [a, b] = await w.deployed();
  assert.match(snapshot(w, a.metadata.name!), new RegExp(`controller=${IDENTITY} uid=${a.metadata.uid}`));
  foreignCopy(w, a.metadata.name!, "theirs", "uid-of-cluster-b", controllerIdentity("cluster-b", PROVISIONER));
  foreignCopy(w, a.metadata.name!, "other-provisioner", "uid-x", controllerIdentity("cluster-a", "other.example"));
  foreignCopy(w, a.metadata.name!, "older", "uid-before-identities");
  const before = ["theirs", "other-provisioner", "older"].map((n) => snapshot(w, n));
  // b's Exporter goes behind our back: its instance, ours, is an orphan
  const gone = w.exporter(b.metadata.name!)!;
  w.kube.put(EXPORTERS, { ...gone, metadata: { ...gone.metadata, finalizers: [] } });
  await w.kube.delete(EXPORTERS, NS, b.metadata.name!);
  for (let pass = 0; pass < 3; pass++) assert.equal(await sweep(w.ctx, undefined), pass === 0 ? 1 : 0);
  assert.equal(w.hosts.instance(HOST, b.metadata.name!), undefined);
  assert.deepEqual(["theirs", "other-provisioner", "older"].map((n) => snapshot(w, n)), before, "byte for byte");
});

Deno.test("reconcile: an instance written before identities is adopted by its next apply", async () => {
  const w = new World();
  const [a] = await w.deployed();
  const name = a.metadata.name!;
  foreignCopy(w, name, name, a.metadata.uid!); // the same instance, as the version before wrote it
  assert.doesNotMatch(snapshot(w, name), /controller=/);
  assert.match(snapshot(w, name), new RegExp(`exporter=${name} uid=${a.metadata.uid}`));
  w.advance(5 * 60_000);
  await w.reconcile();
  assert.match(snapshot(w, name), new RegExp(`controller=${IDENTITY} uid=${a.metadata.uid}`));
});

Deno.test("sweep: a retained instance stays when a set of the same name is created again (M3)", async () => {
  const w = new World();
  const cls = w.ctx.caches.classes.get(NS, "qemu")!;
  w.kube.put(VIRTUAL_TARGET_CLASSES, { ...cls, spec: { ...cls.spec, reclaimPolicy: "Retain" } });
  const [a, b] = await w.deployed();
  const set = w.set;
  await w.kube.delete(EXPORTER_SETS, NS, SET);
  await w.reconcile();
  await w.reconcile();
  assert.deepEqual(w.exporters(), [], "torn down behind the finalizer: Retain keeps the instances");
  // the usual recovery: the same manifest applied again (a new uid)
  w.kube.put<ExporterSet>(EXPORTER_SETS, { ...set, metadata: { ...set.metadata, uid: undefined } });
  assert.notEqual(w.set.metadata.uid, set.metadata.uid);
  assert.equal(await sweep(w.ctx, undefined), 0);
  for (const e of [a, b]) assert.ok(w.hosts.instance(HOST, e.metadata.name!), "kept");
});

/** Deletes the Exporters as the garbage collector does after their set went (in the background). */
async function deleteAll(w: World, what: ("secret" | "class" | "set")[]): Promise<void> {
  for (const x of what) {
    if (x === "secret") await w.kube.delete(SECRETS, NS, "lab-ssh-key");
    if (x === "class") await w.kube.delete(VIRTUAL_TARGET_CLASSES, NS, "qemu");
    if (x === "set") await w.kube.delete(EXPORTER_SETS, NS, SET);
  }
  for (const e of w.exporters()) await w.kube.delete(EXPORTERS, NS, e.metadata.name!);
}

for (
  const [order, steps] of [
    ["kubectl delete -f of the seed (Secret, class, set)", ["secret", "class", "set"]],
    ["the class first", ["class", "set"]],
    ["the Secret first", ["secret", "set"]],
  ] as const
) {
  Deno.test(`reconcile: deletion with ${order} tears every instance down with the key remembered`, async () => {
    const w = new World();
    const deployed = await w.deployed();
    w.hosts.keys.set(HOST, KEY);
    await deleteAll(w, [...steps]);
    await w.reconcile();
    await w.reconcile();
    assert.deepEqual(w.exporters(), [], "no Exporter left");
    for (const e of deployed) assert.equal(w.hosts.instance(HOST, e.metadata.name!), undefined, "host clean");
    assert.ok(!w.reasons().includes("TeardownAbandoned"));
  });
}

Deno.test("reconcile: the class gone, a set's deleted Exporter is still torn down", async () => {
  const w = new World();
  const [a, b] = await w.deployed();
  await w.kube.delete(VIRTUAL_TARGET_CLASSES, NS, "qemu");
  await w.kube.delete(EXPORTERS, NS, a.metadata.name!);
  await w.reconcile();
  assert.equal(w.exporter(a.metadata.name!), undefined);
  assert.equal(w.hosts.instance(HOST, a.metadata.name!), undefined);
  assert.ok(w.hosts.instance(HOST, b.metadata.name!), "the live one stays");
  assert.equal(condition(w.set, "Degraded")?.reason, "VirtualTargetClassNotFound");
});

Deno.test("reconcile: with the Secret's key rotated, teardown tries the key the host took before (M13)", async () => {
  const w = new World();
  const [a] = await w.deployed();
  w.hosts.keys.set(HOST, KEY);
  const rotated = await ed25519Key("test"); // not on the host yet
  w.kube.put<Secret>(SECRETS, {
    metadata: { name: "lab-ssh-key", namespace: NS },
    data: { "ssh-privatekey": b64(rotated) },
  });
  await w.kube.delete(EXPORTERS, NS, a.metadata.name!);
  await w.reconcile();
  assert.equal(w.exporter(a.metadata.name!), undefined);
  assert.equal(w.hosts.instance(HOST, a.metadata.name!), undefined);
});

Deno.test("reconcile: past --teardown-grace the finalizer goes with a Warning; the sweep cleans the host later", async () => {
  const w = new World();
  const [a] = await w.deployed();
  const name = a.metadata.name!;
  w.hosts.down.add(HOST);
  await deleteAll(w, ["secret", "class", "set"]);
  const first = await w.reconcile();
  assert.ok(w.exporter(name), "kept while the grace lasts");
  assert.ok(first.requeueAfterMs! <= GRACE_MS);
  w.advance(GRACE_MS);
  await w.reconcile();
  assert.deepEqual(w.exporters(), [], "no finalizer stuck past the grace");
  const warning = w.events.find((e) => e.reason === "TeardownAbandoned" && e.object === name)!;
  assert.match(warning.message, new RegExp(`${name} on root@${HOST}:22`));
  assert.ok(w.hosts.instance(HOST, name), "still on the host, which is down");
  // nothing names the host any more but the memory of the abandoned teardown
  assert.equal(await sweep(w.ctx, undefined), 0, "the host is still down");
  w.hosts.down.delete(HOST);
  assert.ok(await sweep(w.ctx, undefined) >= 1);
  assert.equal(w.hosts.instance(HOST, name), undefined, "host clean");
  assert.equal(w.ctx.leftOn.size, 0, "forgotten once swept");
});

Deno.test("reconcile: a teardown given up with the Secret's key rotated: the sweep gets in with the key the host took before", async () => {
  const w = new World();
  const names = (await w.deployed()).map((e) => e.metadata.name!);
  w.hosts.keys.set(HOST, KEY);
  const rotated = await ed25519Key("test"); // not on the host yet
  w.kube.put<Secret>(SECRETS, {
    metadata: { name: "lab-ssh-key", namespace: NS },
    data: { "ssh-privatekey": b64(rotated) },
  });
  w.hosts.down.add(HOST);
  await deleteAll(w, ["set"]);
  await w.reconcile();
  w.advance(GRACE_MS);
  await w.reconcile();
  assert.deepEqual(w.exporters(), [], "no finalizer stuck past the grace");
  assert.ok(names.every((n) => w.hosts.instance(HOST, n)), "still on the host, which was down");
  w.hosts.down.delete(HOST);
  // the class and its Secret (with the rotated key) still name the host: that key is refused, the one before is not
  assert.equal(await sweep(w.ctx, undefined), names.length);
  assert.ok(names.every((n) => !w.hosts.instance(HOST, n)), "host clean");
  assert.equal(w.ctx.leftOn.size, 0, "forgotten once swept");
});

Deno.test("reconcile: Exporters orphaned with --cascade=orphan are torn down when deleted later (M4)", async () => {
  const w = new World();
  const [a] = await w.deployed();
  for (const e of w.exporters()) w.kube.put(EXPORTERS, { ...e, metadata: { ...e.metadata, ownerReferences: [] } });
  await w.kube.delete(EXPORTER_SETS, NS, SET);
  await w.reconcile();
  assert.equal(w.exporters().length, 2, "orphaned, they stay");
  await w.kube.delete(EXPORTERS, NS, a.metadata.name!);
  assert.equal(routedSetName(w.exporter(a.metadata.name!)!), SET, "its events reach the set's key");
  await w.reconcile();
  assert.equal(w.exporter(a.metadata.name!), undefined);
  assert.equal(w.hosts.instance(HOST, a.metadata.name!), undefined);
});

Deno.test("reconcile: our own keys in the set's template are left out of the Exporters (M2)", async () => {
  const w = new World({
    template: {
      metadata: {
        labels: { board: "qemu", [`${PROVISIONER}/exporter-set`]: "forged" },
        annotations: { [TARGET_ANNOTATION]: "root@10.9.9.9:22", note: "kept" },
      },
      spec: { drivers: [{ name: "qemu", type: "jumpstarter_driver_qemu.driver.Qemu" }] },
    },
  });
  const [a] = await w.deployed();
  const e = w.exporter(a.metadata.name!)!;
  assert.equal(e.metadata.labels?.[SET_LABEL], SET);
  assert.equal(e.metadata.annotations?.note, "kept");
  assert.equal(e.metadata.annotations?.[TARGET_ANNOTATION], `root@${HOST}:22`, "where it really is");
  assert.ok(!w.reasons().includes("Moved") && !w.reasons().includes("MoveBlocked"));
  assert.ok(w.reasons().includes("ReservedKeysIgnored"));
});

// ---------------------------------------------------------------- a pool of hosts

/** A set over a pool of three hosts with slots 2, 2 and 4 and a 20 s hostFailureTimeout. */
function poolWorld(spec: Partial<ExporterSetSpec> = {}): World {
  const w = new World({ minAvailableReplicas: 6, maxReplicas: 8, ...spec });
  const cls = w.ctx.caches.classes.get(NS, "qemu")!;
  w.kube.put<VirtualTargetClass>(VIRTUAL_TARGET_CLASSES, {
    ...cls,
    spec: {
      ...cls.spec,
      parameters: {
        hosts: [{ name: "pa", slots: 2 }, { name: "pb", slots: 2 }, { name: "pc", slots: 4 }],
        hostFailureTimeout: "20s",
        runtime: { kvm: true },
      },
    },
  });
  return w;
}

const onHost = (w: World) => {
  const per: Record<string, number> = {};
  for (const e of w.exporters().filter((x) => !x.metadata.deletionTimestamp)) {
    const h = /@(.+):/.exec(e.metadata.annotations?.[TARGET_ANNOTATION] ?? "")?.[1] ?? "none";
    per[h] = (per[h] ?? 0) + 1;
  }
  return per;
};

Deno.test("reconcile, pool: new Exporters go to the host with the most free slots, recorded at creation", async () => {
  const w = poolWorld();
  await w.reconcile();
  assert.deepEqual(onHost(w), { pa: 2, pb: 1, pc: 3 });
  for (const e of w.exporters()) w.issueCredentials(e);
  await w.reconcile();
  for (const e of w.exporters()) {
    const h = /@(.+):/.exec(e.metadata.annotations![TARGET_ANNOTATION])![1];
    assert.equal(w.hosts.instance(h, e.metadata.name!)?.exporter, "active", `${e.metadata.name} runs on ${h}`);
  }
  const s = w.set.status!;
  assert.deepEqual(s.hosts!.map((h) => [h.name, h.instances, h.slots, h.reachable]), [
    ["pa", 2, 2, true],
    ["pb", 1, 2, true],
    ["pc", 3, 4, true],
  ]);
  assert.equal(s.hostSummary, "pa 2/2, pb 1/2, pc 3/4");
});

Deno.test("reconcile, pool: a host's first contact renders for the facts the hosts met have; one unlike them, twice", async () => {
  const w = poolWorld();
  const debian = { podman: "5.4.2", kvm: { mode: 0o660, gid: 993 } };
  w.hosts.facts.set("pa", debian);
  w.hosts.facts.set("pb", debian);
  w.hosts.facts.set("pc", { podman: "5.4.2", kvm: { mode: 0o666, gid: 0 } });
  await w.reconcile();
  const hostOf = (e: Exporter) => /@(.+):/.exec(e.metadata.annotations![TARGET_ANNOTATION])![1];
  const applies = (host: string) =>
    w.exporters().filter((e) => hostOf(e) === host).map((e) =>
      w.hosts.calls.filter((c) => c === `apply ${host} ${e.metadata.name}`).length
    ).sort();
  for (const e of w.exporters().filter((x) => hostOf(x) === "pa")) w.issueCredentials(e);
  await w.reconcile();
  assert.deepEqual(applies("pa"), [1, 2], "the first host met: refused once, for no facts");
  for (const e of w.exporters().filter((x) => hostOf(x) !== "pa")) w.issueCredentials(e);
  await w.reconcile();
  assert.deepEqual(applies("pb"), [1], "like pa: one apply");
  assert.deepEqual(applies("pc"), [1, 1, 2], "unlike: its first apply refused, the others wait for its facts");
  for (const e of w.exporters()) assert.equal(w.hosts.instance(hostOf(e), e.metadata.name!)?.exporter, "active");
});

Deno.test("reconcile, pool: slots full is ScalingLimited naming the hosts", async () => {
  const w = poolWorld({ minAvailableReplicas: 10, maxReplicas: 12 });
  await w.reconcile();
  assert.equal(w.exporters().length, 8, "never above the hosts' slots");
  const c = condition(w.set, "ScalingLimited")!;
  assert.equal(c.reason, "HostSlotsFull");
  assert.match(c.message ?? "", /2 more exporters wanted.*pa 2\/2, pb 2\/2, pc 4\/4/);
});

Deno.test("reconcile, pool: a host silent past hostFailureTimeout loses its idle instances, not its leased one", async () => {
  const w = poolWorld();
  await w.deployed();
  const onPa = w.exporters().filter((e) => e.metadata.annotations![TARGET_ANNOTATION].includes("@pa:"));
  const [leased, idle] = onPa.map((e) => e.metadata.name!);
  w.patchExporterStatus(leased, { leaseRef: { name: "l1" } });
  w.hosts.down.add("pa");
  // an inspection is due once per resync
  w.advance(w.ctx.resyncMs);
  await w.reconcile();
  assert.ok(w.ctx.hostReach.has("pa:22"), "pa is seen failing");
  assert.equal(w.set.status!.hosts![0].reachable, false);
  w.advance(19_000);
  await w.reconcile();
  assert.equal(w.exporter(idle)!.spec!.enabled, true, "not before the timeout");
  w.advance(1_000);
  const out = await w.reconcile();
  assert.equal(w.exporter(idle)!.spec!.enabled, false, "drained at the timeout");
  assert.equal(w.exporter(leased)!.spec!.enabled, true, "the leased one stays");
  assert.ok(out.requeueAfterMs !== undefined);
  await w.reconcile();
  assert.ok(!w.exporter(idle) || w.exporter(idle)!.metadata.deletionTimestamp, "then deleted");
  const per = onHost(w);
  assert.equal(per.pa, 1, "only the leased one is left on pa");
  assert.equal((per.pb ?? 0) + (per.pc ?? 0), 6, "its replacement went to a host with room");
  for (const e of w.exporters().filter((x) => !x.status?.credential)) w.issueCredentials(e);
  await w.reconcile();
  assert.match(condition(w.set, "Progressing")!.message ?? "", new RegExp(`${leased}: stays on pa`));
  // pa back: nothing moves back
  w.hosts.down.delete("pa");
  w.advance(w.ctx.resyncMs);
  await w.reconcile();
  await w.reconcile();
  assert.ok(!w.ctx.hostReach.has("pa:22"), "pa answers again");
  assert.equal(onHost(w).pa, 1, "nothing moved back");
});

Deno.test("reconcile, pool: a host taken out of the list loses its idle instances at once; a leased one waits", async () => {
  const w = poolWorld();
  await w.deployed();
  const onPc = w.exporters().filter((e) => e.metadata.annotations![TARGET_ANNOTATION].includes("@pc:"));
  const leased = onPc[0].metadata.name!;
  w.patchExporterStatus(leased, { leaseRef: { name: "l1" } });
  const cls = w.ctx.caches.classes.get(NS, "qemu")!;
  w.kube.put<VirtualTargetClass>(VIRTUAL_TARGET_CLASSES, {
    ...cls,
    spec: { ...cls.spec, parameters: { ...cls.spec.parameters, hosts: [{ name: "pa" }, { name: "pb" }] } },
  });
  await w.reconcile();
  for (const e of onPc.slice(1)) assert.equal(w.exporter(e.metadata.name!)!.spec!.enabled, false, "drained");
  await w.reconcile();
  assert.deepEqual(onHost(w), { pa: 3, pb: 3, pc: 1 }, "the idle ones replaced on the pool's hosts");
  assert.equal(w.set.status!.hosts!.find((h) => h.name === "pc")?.instances, 1, "the host left is still shown");
  w.patchExporterStatus(leased, { leaseRef: undefined });
  await w.reconcile();
  await w.reconcile();
  assert.equal(onHost(w).pc, undefined, "once its lease is over, the last one leaves too");
});
