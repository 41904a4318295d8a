/**
 * End to end, a lease is never disrupted: a leased instance keeps its containers through a runtime change and a move
 * of its set to another host; the status says it is outdated and which lease it waits for; once the lease ends, it
 * is restarted (InPlaceReuse) or replaced on the new host (ExitAndReplace).
 */
import assert from "node:assert/strict";
import { waitFor } from "./env.ts";
import {
  applySeed,
  cond,
  containerIdentity,
  createClass,
  createKeySecret,
  createSet,
  exporters,
  getSet,
  hostHas,
  lease,
  SECOND_HOST,
  SET,
  sh,
  waitReady,
  type World,
  world,
} from "./e2e_world.ts";
import { EXPORTER_SETS, EXPORTERS, JUMPSTARTER_LEASES } from "../src/kube/resources.ts";
import type { ExporterSet, Lease } from "../src/api/types.ts";

const opts = { sanitizeOps: false, sanitizeResources: false };

async function endLease(w: World, exporter: string, name: string): Promise<void> {
  await w.client.mergePatch(JUMPSTARTER_LEASES, w.ns, name, { status: { ended: true } }, "status");
  await w.client.mergePatch(EXPORTERS, w.ns, exporter, { status: { leaseRef: null } }, "status");
}

/** The set's status once it says the exporter waits for the lease. */
function waitingFor(w: World, exporter: string, leaseName: string): Promise<ExporterSet> {
  return waitFor(async () => {
    const s = await getSet(w);
    const c = cond(s, "Progressing");
    return c?.reason === "WaitingForLease" && c.message?.includes(exporter) && c.message.includes(leaseName)
      ? s
      : undefined;
  }, { what: `the set to report ${exporter} waiting for lease ${leaseName}`, timeoutMs: 60_000 });
}

Deno.test({
  name: "e2e: a runtime change waits for the lease; the instance is restarted once the lease ends",
  ...opts,
  async fn() {
    const w = await world({ resyncMs: 2_000 });
    try {
      await applySeed(w, (s) => Object.assign(s.spec, { recycleStrategy: "InPlaceReuse", maxReplicas: 1 }));
      const [e] = await waitReady(w, 1);
      const name = e.metadata.name!;
      const before = await containerIdentity(w.host, name);
      const leaseName = await lease(w, name);
      await w.client.mergePatch(EXPORTER_SETS, w.ns, SET, {
        spec: { images: { runtime: { imagePullPolicy: "Never" } } },
      });
      const s = await waitingFor(w, name, leaseName);
      assert.deepEqual([s.status?.replicas, s.status?.updatedReplicas], [1, 0]);
      assert.match(await sh(w.host, `cat /etc/containers/systemd/${name}-runtime.container`), /^Pull=never$/m);
      // a few resyncs later, still the same containers
      await new Promise((r) => setTimeout(r, 6_000));
      assert.equal(await containerIdentity(w.host, name), before, "the leased instance was not restarted");

      await endLease(w, name, leaseName);
      // ready again: the apply queued the restart, and a later inspection found the units up after it
      await waitFor(async () => {
        const s = await getSet(w);
        return s.status?.updatedReplicas === 1 && s.status?.readyReplicas === 1 &&
          cond(s, "Progressing")?.reason !== "WaitingForLease";
      }, { what: "the set up to date and ready after the lease", timeoutMs: 60_000 });
      assert.notEqual(await containerIdentity(w.host, name), before, "restarted once the lease ended");
      await waitReady(w, 1);
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: a host move leaves a leased instance on its host until the lease ends",
  ...opts,
  async fn() {
    const w = await world({ resyncMs: 2_000 });
    try {
      await applySeed(w, (s) => Object.assign(s.spec, { maxReplicas: 1 }));
      const [e] = await waitReady(w, 1);
      const name = e.metadata.name!;
      const before = await containerIdentity(w.host, name);
      const leaseName = await lease(w, name);
      await w.client.mergePatch(EXPORTER_SETS, w.ns, SET, { spec: { parameters: { host: { name: SECOND_HOST } } } });
      const s = await waitingFor(w, name, leaseName);
      assert.equal(s.status?.updatedReplicas, 0);
      await new Promise((r) => setTimeout(r, 6_000));
      assert.equal(await containerIdentity(w.host, name), before, "the leased instance keeps running where it was");
      assert.ok(!(await hostHas(w.host2, name)), "and is not started on the new host");

      await endLease(w, name, leaseName);
      await waitFor(async () => !(await hostHas(w.host, name)), {
        what: `${name} removed from the old host after its lease`,
        timeoutMs: 60_000,
      });
      assert.ok(!(await hostHas(w.host2, name)), "replaced (ExitAndReplace), never moved");
      await waitFor(async () => (await exporters(w)).every((x) => x.metadata.name !== name), {
        what: `${name} replaced`,
        timeoutMs: 60_000,
      });
      const [next] = await waitReady(w, 1);
      assert.ok(await hostHas(w.host2, next.metadata.name!), "the fresh Exporter runs on the new host");
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: WaitForFirstConsumer: pending leases spill over to the next set with room (one set per host)",
  ...opts,
  async fn() {
    // the seed's recipe for more hosts: a second ExporterSet of the same class that overrides parameters.host
    const w = await world();
    try {
      await createKeySecret(w);
      await createClass(w, (c) => c.spec.bindingMode = "WaitForFirstConsumer");
      const perHost = (s: ExporterSet) => Object.assign(s.spec, { minAvailableReplicas: 0, maxReplicas: 1 });
      await createSet(w, perHost);
      const second = `${SET}-02`;
      await createSet(w, (s) => {
        perHost(s);
        s.metadata.name = second;
        s.spec.parameters = { host: { name: SECOND_HOST } };
      });
      for (let i = 0; i < 2; i++) {
        await w.client.create<Lease>(JUMPSTARTER_LEASES, {
          metadata: { generateName: "pending-", namespace: w.ns },
          spec: { selector: { matchLabels: { board: "aarch64-qemu" } } },
        });
      }
      const [a] = await waitReady(w, 1);
      const [b] = await waitReady(w, 1, second);
      assert.ok(await hostHas(w.host, a.metadata.name!), "the first set's exporter runs on its host");
      assert.ok(await hostHas(w.host2, b.metadata.name!), "the second lease is served by the second host");
      assert.equal((await exporters(w)).length, 2, "one exporter per lease, not one per set and lease");
    } finally {
      await w.stop();
    }
  },
});
