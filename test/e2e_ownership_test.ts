/**
 * End to end, only what is ours is changed, with the real garbage collector: Exporters of sets the controller never
 * saw and of another provisioner's sets are left alone, an instance of another namespace under the same name on the
 * same host survives the teardown of ours, and a set deleted in the foreground is torn down without new Exporters.
 */
import assert from "node:assert/strict";
import { waitFor } from "./env.ts";
import {
  applySeed,
  createClass,
  createKeySecret,
  createSet,
  events,
  exporters,
  hostHas,
  SET,
  unitStates,
  waitReady,
  type World,
  world,
} from "./e2e_world.ts";
import { ownersPart } from "./faults/invariants.ts";
import { resourcePath } from "../src/kube/client.ts";
import { Informer } from "../src/kube/informer.ts";
import { EXPORTER_SETS, EXPORTERS } from "../src/kube/resources.ts";
import type { Exporter, ExporterSet, OwnerReference } from "../src/api/types.ts";
import { FINALIZER, SET_LABEL } from "../src/provision/marks.ts";
import { silentLogger } from "../src/observe/log.ts";

const opts = { sanitizeOps: false, sanitizeResources: false };
const IN_CLUSTER = "in-cluster-qemu";

const controllerOf = (set: ExporterSet): OwnerReference => ({
  apiVersion: set.apiVersion!,
  kind: "ExporterSet",
  name: set.metadata.name!,
  uid: set.metadata.uid!,
  controller: true,
  blockOwnerDeletion: true,
});

const createExporter = (w: World, name: string, meta: Partial<Exporter["metadata"]>) =>
  w.client.create<Exporter>(EXPORTERS, { metadata: { name, namespace: w.ns, ...meta }, spec: {} });

/** Deletes a set and waits for its Exporters to be torn down and gone, so that the hosts are left clean. */
async function deleteSet(w: World, name = SET): Promise<void> {
  await w.client.delete(EXPORTER_SETS, w.ns, name);
  await waitFor(async () => (await exporters(w)).every((e) => e.metadata.ownerReferences?.[0]?.name !== name), {
    what: `the Exporters of ${name} gone`,
    timeoutMs: 90_000,
  });
}

Deno.test({
  name: "e2e ownership: Exporters of a set never seen and of the in-cluster qemu provisioner are left alone",
  ...opts,
  async fn() {
    const w = await world({ resyncMs: 2_000 });
    try {
      await applySeed(w);
      await waitReady(w, 1);
      // a set of a kind in another API group: the controller never sees it, the garbage collector cannot resolve it
      await createExporter(w, "unseen-owner", {
        ownerReferences: [{
          apiVersion: "other.example.com/v1",
          kind: "ExporterSet",
          name: "some-other-set",
          uid: crypto.randomUUID(),
          controller: true,
        }],
      });
      await createClass(w, (c) => {
        c.metadata.name = IN_CLUSTER;
        c.spec.provisioner = "qemu.jumpstarter.dev";
      });
      const theirs = await createSet(w, (s) => {
        s.metadata.name = IN_CLUSTER;
        s.spec.virtualTargetClassName = IN_CLUSTER;
      });
      await createExporter(w, `${IN_CLUSTER}-0`, { ownerReferences: [controllerOf(theirs)] });
      const names = ["unseen-owner", `${IN_CLUSTER}-0`];
      const foreign = async () => (await exporters(w)).filter((e) => names.includes(e.metadata.name!));
      // Jumpstarter's credentials on both: each was routed to the controller again, with something to act on
      const issued = await waitFor(async () => {
        const es = await foreign();
        return es.length === 2 && es.every((e) => e.status?.credential) ? es : undefined;
      }, { what: "credentials issued to the foreign Exporters" });
      await new Promise((r) => setTimeout(r, 10_000)); // several resyncs
      assert.deepEqual((await foreign()).map(ownersPart), issued.map(ownersPart), "neither changed");
      for (const n of names) assert.equal(await hostHas(w.host, n), false, `${n} deployed nowhere`);
      const set = await w.client.get<ExporterSet>(EXPORTER_SETS, w.ns, IN_CLUSTER);
      assert.equal(set.status, undefined, "the in-cluster set's status is not ours to write");
      await deleteSet(w);
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e ownership: a same-name instance of another namespace on the host survives the teardown of ours",
  ...opts,
  async fn() {
    const a = await world();
    const b = await world({ startController: false });
    try {
      await applySeed(a);
      const [mine] = await waitReady(a, 1);
      const name = mine.metadata.name!;
      // namespace b gets an Exporter of ours of the same name on the same host: its apply is refused there
      await createKeySecret(b);
      await createClass(b);
      const setB = await createSet(b);
      await createExporter(b, name, {
        labels: { ...setB.spec.template?.metadata?.labels, [SET_LABEL]: SET },
        finalizers: [FINALIZER],
        ownerReferences: [controllerOf(setB)],
      });
      await b.controller.start();
      await waitFor(async () => (await events(b)).some((e) => e.involvedObject.name === name && e.type === "Warning"), {
        what: `the apply of ${b.ns}/${name} refused`,
      });
      await b.client.delete(EXPORTERS, b.ns, name);
      await waitFor(async () => !(await b.client.find(EXPORTERS, b.ns, name)), { what: `${b.ns}/${name} let go` });
      assert.equal(await hostHas(a.host, name), true, `${a.ns}/${name}'s instance stays`);
      assert.match(await unitStates(a.host, name), /^active\s+active/);
      await deleteSet(b);
      await deleteSet(a);
    } finally {
      await b.stop();
      await a.stop();
    }
  },
});

Deno.test({
  name: "e2e ownership: a set deleted in the foreground is torn down, and no Exporter is created meanwhile",
  ...opts,
  async fn() {
    const w = await world();
    const seen = new Set<string>();
    const watch = new Informer<Exporter>(w.client, EXPORTERS, { namespace: w.ns, log: silentLogger });
    watch.on((_t, e) => seen.add(e.metadata.name!));
    const abort = new AbortController();
    const watching = watch.run(abort.signal);
    try {
      await applySeed(w, (s) => Object.assign(s.spec, { minReplicas: 0, minAvailableReplicas: 2, maxReplicas: 2 }));
      const before = (await waitReady(w, 2)).map((e) => e.metadata.name!).sort();
      await w.client.request("DELETE", resourcePath(EXPORTER_SETS, { namespace: w.ns, name: SET }), {
        body: { kind: "DeleteOptions", apiVersion: "v1", propagationPolicy: "Foreground" },
      });
      await waitFor(async () => !(await w.client.find(EXPORTER_SETS, w.ns, SET)), {
        what: "the set deleted in the foreground",
        timeoutMs: 90_000,
      });
      assert.deepEqual([...seen].sort(), before, "no Exporter but the set's two");
      for (const n of before) assert.equal(await hostHas(w.host, n), false, `${n} torn down`);
    } finally {
      abort.abort();
      await watching;
      await w.stop();
    }
  },
});
