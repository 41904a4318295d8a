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
import { silentLogger } from "../observe/log.ts";
import { Metrics } from "../observe/metrics.ts";
import { type Caches, cachesFrom, type Context, newContext } from "./context.ts";
import { FINALIZER, HOST_ANNOTATION, SET_LABEL } from "./marks.ts";
import { reconcile } from "./reconciler.ts";
import { sweep } from "./sweep.ts";
import { TARGET_ANNOTATION } from "./targets.ts";

const NS = "lab";
const SET = "pool";
const HOST = "lab-host-01.example.com";

async function privateKey(): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "reconcile_test" });
  const r = await new Deno.Command("ssh-keygen", {
    args: ["-q", "-t", "ed25519", "-N", "", "-C", "test", "-f", `${dir}/key`],
    stdout: "null",
  }).output();
  assert.ok(r.success, "ssh-keygen");
  const key = await Deno.readTextFile(`${dir}/key`);
  await Deno.remove(dir, { recursive: true });
  return key;
}
const KEY = await privateKey();

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
  assert.ok(w.reasons().includes("Deployed"));
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
  assert.equal(out.requeueAfterMs, 10_000, "a host that is down is retried soon");
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
  await w.reconcile();
  assert.equal(w.exporter(a.metadata.name!), undefined);
  assert.equal(w.hosts.instance(HOST, a.metadata.name!), undefined);
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

Deno.test("reconcile: the Exporters of a deleted set are deleted, torn down, then let go", async () => {
  const w = new World();
  const [a, b] = await w.deployed();
  await w.kube.delete(EXPORTER_SETS, NS, SET);
  const out = await w.reconcile();
  assert.ok(w.exporters().every((e) => e.metadata.deletionTimestamp));
  assert.equal(out.requeueAfterMs, 1_000);
  await w.reconcile();
  assert.deepEqual(w.exporters(), []);
  for (const e of [a, b]) assert.equal(w.hosts.instance(HOST, e.metadata.name!), undefined);
  assert.deepEqual(await w.reconcile(), {}, "nothing left to look at");
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
