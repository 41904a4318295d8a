/**
 * Two real controller processes with --leader-elect against the real API server: only the leader reconciles; when it
 * is killed (SIGKILL, no release) the other takes over after the lease expires and carries on; a SIGTERM'd leader hands
 * the Lease back on its way out.
 */
import assert from "node:assert/strict";
import { testEnv, waitFor } from "./env.ts";
import { applySeed, exporters, getSet, SEED_HOST, SET, type World, world } from "./e2e_world.ts";
import { COORDINATION_LEASES, EXPORTER_SETS, EXPORTERS } from "../src/kube/resources.ts";
import type { KubeObject } from "../src/api/types.ts";

const MAIN = new URL("../main.ts", import.meta.url).pathname;
const LEASE = "exporterset-qemu-ssh-jumpstarter-dev";

interface Replica {
  child: Deno.ChildProcess;
  log: string[];
}

function replica(kubeconfig: string, ns: string, hostAddress: string): Replica {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      MAIN,
      "--kubeconfig",
      kubeconfig,
      `--namespace=${ns}`,
      "--leader-elect",
      "--health-probe-bind-address=127.0.0.1:0",
      `--host-alias=${SEED_HOST}=${hostAddress}`,
    ],
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const log: string[] = [];
  (async () => {
    for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) log.push(...chunk.split("\n"));
  })();
  return { child, log };
}

const leads = (r: Replica) => r.log.some((l) => l.includes("became leader"));
const holder = async (w: World) =>
  (await w.client.find<KubeObject & { spec: { holderIdentity?: string } }>(COORDINATION_LEASES, w.ns, LEASE))?.spec
    .holderIdentity;

Deno.test({
  name: "leader election: two processes, one leads; SIGKILL hands over after the lease; SIGTERM releases it",
  sanitizeOps: false,
  sanitizeResources: false,
  async fn() {
    // The in-process controller of the e2e world is not used here: only the two replicas reconcile.
    const w = await world({ startController: false });
    const env = await testEnv();
    const replicas = [0, 1].map(() => replica(env.kubeconfig, w.ns, w.host.address));
    try {
      await applySeed(w);
      await waitFor(async () => (await getSet(w)).status?.readyReplicas === 1, {
        what: "the seed's set ready, reconciled by the leader",
        timeoutMs: 90_000,
      });
      const leader = await waitFor(() => replicas.find(leads), { what: "a leader", timeoutMs: 30_000 });
      const standby = replicas.find((r) => r !== leader)!;
      assert.ok(!leads(standby), "only one replica leads");

      const t0 = Date.now();
      leader.child.kill("SIGKILL");
      await leader.child.status;
      const [first] = await exporters(w);
      await w.client.mergePatch(
        EXPORTERS,
        w.ns,
        first.metadata.name!,
        { status: { leaseRef: { name: "l" } } },
        "status",
      );
      await waitFor(() => leads(standby), { what: "the standby to take over", timeoutMs: 45_000 });
      const takeover = Date.now() - t0;
      await waitFor(async () => (await getSet(w)).status?.readyReplicas === 2, {
        what: "the new leader to add a warm exporter next to the leased one",
        timeoutMs: 60_000,
      });
      console.log(`  standby took over ${takeover} ms after the leader was killed`);
      assert.ok(takeover >= 10_000, "not before the killed leader's lease expired");

      const holderBefore = await holder(w);
      assert.ok(holderBefore);
      standby.child.kill("SIGTERM");
      assert.equal((await standby.child.status).code, 0);
      assert.equal(await holder(w), "", "a SIGTERM'd leader releases the Lease");
    } finally {
      for (const r of replicas) {
        try {
          r.child.kill("SIGKILL");
        } catch {
          // already gone
        }
        await r.child.status;
      }
      // this process's controller tears the instances down, so the shared lab host is left clean
      await w.controller.start();
      await w.client.delete(EXPORTER_SETS, w.ns, SET);
      await waitFor(async () => (await exporters(w)).length === 0, { what: "teardown", timeoutMs: 60_000 })
        .catch((e) => console.error(e));
      await w.stop();
    }
  },
});
