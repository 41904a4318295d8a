/**
 * Two clusters, one lab host (issue 18, Why 1): a second real control plane beside the run's, each with its own
 * controller, the seed applied in a namespace of the same name in both, both sets on the same lab host, a lease
 * under way in each, and the orphan sweeps on. Every sweep pass of either leaves the other's instances byte for byte
 * (files, containers, volumes), and still removes an orphan of its own.
 */
import assert from "node:assert/strict";
import { installCrdsAt, waitFor } from "./env.ts";
import { startControlPlane } from "./controlplane/controlplane.ts";
import {
  applySeed,
  exporters,
  hostHas,
  instanceState,
  leaseExporter,
  SET,
  waitReady,
  type World,
  world,
} from "./e2e_world.ts";
import { EXPORTER_SETS, EXPORTERS } from "../src/kube/resources.ts";

const opts = { sanitizeOps: false, sanitizeResources: false };

const lease = (w: World, exporter: string) => leaseExporter(w.client, w.ns, exporter, { board: "aarch64-qemu" });
const hostState = (w: World, names: string[]) => instanceState(w.host, names);
const live = async (w: World) => (await exporters(w)).filter((e) => !e.metadata.deletionTimestamp);

Deno.test({
  name: "e2e two clusters: sweeps on both keep each other's instances, leased ones included, byte for byte",
  ...opts,
  async fn() {
    const dir = await Deno.makeTempDir({ prefix: "qsp-cluster-b-" });
    const cpB = await startControlPlane({ dir: `${dir}/controlplane`, setup: installCrdsAt });
    const ns = `shared-${crypto.randomUUID().slice(0, 8)}`;
    // the same namespace name in both, as with Jumpstarter's default `jumpstarter`
    const both = { namespace: ns, sweepMs: 2_000, resyncMs: 5_000 };
    const a = await world(both);
    const b = await world({ ...both, kubeconfig: cpB.kubeconfigPath });
    try {
      assert.notEqual(a.controller.ctx.identity, b.controller.ctx.identity, "each cluster its own identity");
      const scale = (s: { spec: Record<string, unknown> }) => Object.assign(s.spec, { minAvailableReplicas: 2 });
      await applySeed(a, scale);
      await applySeed(b, scale);
      const [ea, eb] = [await waitReady(a, 2), await waitReady(b, 2)];
      await lease(a, ea[0].metadata.name!);
      await lease(b, eb[0].metadata.name!);
      const namesA = ea.map((e) => e.metadata.name!);
      const namesB = eb.map((e) => e.metadata.name!);
      const all = [...namesA, ...namesB];
      const before = await hostState(a, all);
      // several passes of each sweep, besides those of their 2 s loops
      for (let pass = 0; pass < 3; pass++) {
        assert.equal(await a.controller.sweep(), 0, `pass ${pass} of cluster A's sweep removes nothing`);
        assert.equal(await b.controller.sweep(), 0, `pass ${pass} of cluster B's sweep removes nothing`);
      }
      await new Promise((r) => setTimeout(r, 6_000)); // the loops' passes and a resync of each
      assert.equal(await hostState(a, all), before, "both clusters' instances unchanged");

      // an orphan of B's own (its Exporter gone behind its back) is still B's to sweep; A's stay
      const orphan = namesB[1];
      await b.client.mergePatch(EXPORTERS, ns, orphan, { metadata: { finalizers: null } });
      await b.client.delete(EXPORTERS, ns, orphan);
      await waitFor(async () => !(await hostHas(b.host, orphan)), { what: `B's orphan ${orphan} swept` });
      const ofA = before.split("\n").filter((l) => namesA.some((n) => l.includes(n))).join("\n");
      assert.equal(await hostState(a, namesA), ofA, "A's instances unchanged by B's sweep of its own orphan");
    } finally {
      for (const w of [a, b]) {
        await w.client.delete(EXPORTER_SETS, ns, SET).catch(() => {});
        await waitFor(async () => (await live(w)).length === 0 && (await exporters(w)).length === 0, {
          what: `cluster ${w === a ? "A" : "B"} torn down`,
          timeoutMs: 90_000,
        }).catch((e) => console.error(String(e)));
      }
      await b.stop();
      await a.stop();
      await cpB.stop();
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});
