/**
 * The feature description's examples, end to end: real API server, real lab host, the real controller (in this
 * process), the FakeJumpstarterController issuing credentials. Every step of "How it works" is checked where it
 * lands: in the API and on the host.
 */
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { freshNamespace, seedExample, testEnv, waitFor } from "./env.ts";
import { startFakeJumpstarter } from "./fake_jumpstarter.ts";
import { hostExec, type LabHost } from "./labhost/labhost.ts";
import { KubeClient } from "../src/kube/client.ts";
import { EXPORTER_SETS, EXPORTERS, SECRETS, VIRTUAL_TARGET_CLASSES } from "../src/kube/resources.ts";
import type { Exporter, ExporterSet, KubeObject, Secret } from "../src/api/types.ts";
import { SshPool } from "../src/host/ssh.ts";
import { LabHosts } from "../src/host/lab.ts";
import { Controller } from "../src/provision/controller.ts";
import { FINALIZER, HOST_ANNOTATION, pinHostKey } from "../src/provision/reconciler.ts";
import type { LabTarget } from "../src/provision/credentials.ts";
import { createLogger } from "../src/observe/log.ts";

const SEED_HOST = "lab-host-01.example.com";
const SET = "aarch64-ssh-pool";

interface World {
  client: KubeClient;
  ns: string;
  host: LabHost;
  controller: Controller;
  hosts: LabHosts;
  stop(): Promise<void>;
}

async function world(opts: { resyncMs?: number } = {}): Promise<World> {
  const env = await testEnv();
  const client = await KubeClient.load(env.kubeconfig);
  const ns = await freshNamespace(client, "e2e");
  const host = env.labhosts[0];
  const fake = startFakeJumpstarter(client, ns);
  const pool = new SshPool({ onHostKeyAccepted: (t, line) => pinHostKey(client, t as LabTarget, line) });
  const hosts = new LabHosts(pool, { hostAliases: { [SEED_HOST]: host.address } });
  const controller = new Controller({
    client,
    hosts,
    log: createLogger({ level: Deno.env.get("QSP_TEST_LOG") ? "debug" : "error" }),
    provisioner: "qemu-ssh.jumpstarter.dev",
    namespace: ns,
    resyncMs: opts.resyncMs ?? 60_000,
    sweepMs: 3_600_000,
  });
  await controller.start();
  return {
    client,
    ns,
    host,
    controller,
    hosts,
    async stop() {
      await controller.stop();
      await fake.stop();
      await pool.close();
      client.close();
    },
  };
}

async function applySeed(w: World, setOverride: (s: ExporterSet) => void = () => {}) {
  const key = await Deno.readTextFile(w.host.privateKeyPath);
  // What step 2's `kubectl create secret generic lab-ssh-key --from-file=ssh-privatekey=...` creates.
  await w.client.create<Secret>(SECRETS, {
    metadata: { name: "lab-ssh-key", namespace: w.ns },
    type: "Opaque",
    data: { "ssh-privatekey": Buffer.from(key).toString("base64") },
  });
  await w.client.create(VIRTUAL_TARGET_CLASSES, await seedExample("virtualtargetclass.yaml", w.ns));
  const set = await seedExample("exporterset.yaml", w.ns) as ExporterSet;
  setOverride(set);
  await w.client.create(EXPORTER_SETS, set as KubeObject);
}

const exporters = async (w: World) => (await w.client.list<Exporter>(EXPORTERS, w.ns)).items;
const getSet = (w: World) => w.client.get<ExporterSet>(EXPORTER_SETS, w.ns, SET);
const cond = (s: ExporterSet, type: string) => s.status?.conditions?.find((c) => c.type === type);

async function onHost(w: World, name: string) {
  const r = await hostExec(
    w.host,
    `systemctl is-active ${name}-runtime.service ${name}-exporter.service; ` +
      `ls /etc/containers/systemd/${name}-runtime.container /etc/containers/systemd/${name}-exporter.container ` +
      `/etc/jumpstarter/exporters/${name}.yaml 2>&1; podman volume exists jumpstarter-${name}-shared && echo volume; ` +
      `journalctl -o cat --no-pager -u ${name}-exporter.service | grep 'standin-exporter: name=' | tail -n 1`,
  );
  return r.stdout;
}

async function hostIsClean(w: World, name: string) {
  const r = await hostExec(
    w.host,
    `ls /etc/containers/systemd/ /etc/jumpstarter/exporters/ 2>/dev/null | grep -c ${name} || true; ` +
      `podman ps -a --format '{{.Names}}' | grep -c ${name} || true; ` +
      `podman volume ls -q | grep -c ${name} || true; ` +
      `systemctl list-units --all --no-legend '${name}-*' | grep -c . || true`,
  );
  return r.stdout.trim().split("\n").every((n) => n.trim() === "0");
}

Deno.test({
  name: "e2e: the seed's ExporterSet deploys one warm exporter on the lab host, and deletion leaves nothing",
  sanitizeOps: false,
  sanitizeResources: false,
  async fn() {
    const w = await world();
    try {
      const t0 = performance.now();
      await applySeed(w);
      const set = await waitFor(async () => {
        const s = await getSet(w);
        return cond(s, "Available")?.status === "True" && s.status?.readyReplicas === 1 ? s : undefined;
      }, { what: "ExporterSet Available with 1 ready exporter", timeoutMs: 90_000 });
      console.log(`  seed set Available after ${((performance.now() - t0) / 1000).toFixed(1)}s`);
      assert.equal(set.status?.replicas, 1);
      assert.equal(set.status?.selector, "arch=aarch64,board=aarch64-qemu,virtual=true");
      assert.equal(cond(set, "Degraded")?.status, "False");

      const [e] = await exporters(w);
      assert.match(e.metadata.name!, /^aarch64-ssh-pool-/);
      assert.deepEqual(
        { board: e.metadata.labels?.board, virtual: e.metadata.labels?.virtual, arch: e.metadata.labels?.arch },
        { board: "aarch64-qemu", virtual: "true", arch: "aarch64" },
      );
      assert.equal(e.spec?.enabled, true);
      assert.ok(e.metadata.finalizers?.includes(FINALIZER));
      assert.equal(e.metadata.annotations?.[HOST_ANNOTATION], SEED_HOST);
      assert.equal(e.metadata.ownerReferences?.[0].name, SET);

      const name = e.metadata.name!;
      const seen = await waitFor(async () => {
        const out = await onHost(w, name);
        return /launcher=ok tcp=ok kvm=present/.test(out) ? out : undefined;
      }, { what: "the exporter stand-in to reach its runtime", timeoutMs: 60_000 });
      assert.match(seen, /^active\nactive\n/);
      assert.match(seen, /volume/);
      assert.match(seen, /exitOnLeaseEnd=true/);
      assert.match(seen, /token=<set>/);

      // TOFU: the seed's Secret has no known_hosts, so the host key was pinned.
      const pinned = await w.client.get<Secret>(SECRETS, w.ns, "qemu-ssh-known-hosts");
      assert.match(Buffer.from(pinned.data!.known_hosts, "base64").toString(), new RegExp(`^${SEED_HOST} ssh-`, "m"));

      await w.client.delete(EXPORTER_SETS, w.ns, SET);
      await waitFor(async () => (await exporters(w)).length === 0, { what: "exporters gone", timeoutMs: 60_000 });
      assert.ok(await hostIsClean(w, name), "no unit, container, volume or file left on the host");
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: a lease asks for another warm exporter; after the lease the surplus drains after the cooldown",
  sanitizeOps: false,
  sanitizeResources: false,
  async fn() {
    const w = await world();
    try {
      await applySeed(w, (s) => s.spec.scaleDownCooldown = "2s");
      const [first] = await waitFor(async () => {
        const es = await exporters(w);
        return es.length === 1 && es[0].metadata.annotations?.[HOST_ANNOTATION] ? es : undefined;
      }, { what: "first exporter deployed", timeoutMs: 90_000 });
      // Jumpstarter marks a leased exporter in its status.
      await w.client.mergePatch(
        EXPORTERS,
        w.ns,
        first.metadata.name!,
        { status: { leaseRef: { name: "lease-1" } } },
        "status",
      );
      await waitFor(async () => {
        const s = await getSet(w);
        return s.status?.replicas === 2 && s.status?.leasedReplicas === 1 && s.status?.readyReplicas === 2;
      }, { what: "a second, ready exporter next to the leased one", timeoutMs: 90_000 });

      await w.client.mergePatch(EXPORTERS, w.ns, first.metadata.name!, { status: { leaseRef: null } }, "status");
      const left = await waitFor(async () => {
        const es = await exporters(w);
        return es.length === 1 ? es : undefined;
      }, { what: "scale down to one exporter after the cooldown", timeoutMs: 90_000 });
      assert.equal(left[0].metadata.name, first.metadata.name, "the older, warm exporter stays");
    } finally {
      await w.stop();
    }
  },
});
