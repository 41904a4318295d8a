/**
 * Two clusters, one lab host (issue 18): a second real control plane beside the run's, each with its controller (a
 * subprocess, its own cluster identity, the orphan sweep every 2 s), a namespace of the same name in both, and both
 * sets on the seed's host. Cluster B's set has two instances, one of them leased; cluster A's takes random changes and
 * faults: scale up or down, the controller SIGKILLed mid-work or restarted, the set deleted and re-created, an
 * Exporter force-deleted while the controller is down (an orphan its sweep must remove: always the first trial). After every trial A's
 * invariants hold and B's instances are file for file, unit for unit, container for container and volume for volume
 * as before the first trial (invariant 7: 0 foreign changes). The reverse, A's instances untouched by B's sweeps, is
 * invariants 1 and 6 of each trial (A's files all there, its leased instance never restarted) while B's sweep runs.
 */
import { startControlPlane } from "../controlplane/controlplane.ts";
import { installCrdsAt } from "../env.ts";
import { leaseExporter } from "../e2e_world.ts";
import { EXPORTERS } from "../../src/kube/resources.ts";
import { checkInvariants, clusterSnapshot, foreignClusterChanges, trial } from "./invariants.ts";
import { FaultWorld, type Outcome, randomBetween, sleep } from "./world.ts";

/** Sweeps on, and often: a sweep that took the other cluster's instances for its own would act within a trial. */
const SWEEP_SECONDS = 2;
const B_REPLICAS = 2;

type Change = "scale" | "kill mid-work" | "restart" | "delete+recreate" | "orphan";
const CHANGES: Change[] = ["scale", "kill mid-work", "restart", "delete+recreate", "orphan"];

export async function twoClustersScenario(trials: number): Promise<Outcome[]> {
  const dir = await Deno.makeTempDir({ prefix: "qsp-faults-two-" });
  const cpB = await startControlPlane({ dir: `${dir}/controlplane`, setup: installCrdsAt });
  const results: Outcome[] = [];
  let a: FaultWorld | undefined;
  let b: FaultWorld | undefined;
  let failed = false;
  try {
    a = await FaultWorld.create({ prefix: "two", sweepSeconds: SWEEP_SECONDS });
    // the same namespace name in cluster B, as with Jumpstarter's default `jumpstarter`: only the identity tells
    b = await FaultWorld.create({ kubeconfig: cpB.kubeconfigPath, namespace: a.ns, sweepSeconds: SWEEP_SECONDS });
    if (a.identity === b.identity) throw new Error(`both clusters have the identity ${a.identity}`);
    // B first: its instances are on the host before A's controller starts (and sweeps at once)
    // capped at its count, so that the lease does not make it scale up for one more available
    await b.seed((s) =>
      Object.assign(s.spec, { minReplicas: 0, minAvailableReplicas: B_REPLICAS, maxReplicas: B_REPLICAS })
    );
    await b.controller.start();
    const baseB = await checkInvariants(b);
    if (!baseB.ok) throw new Error(`cluster B's baseline did not hold: ${baseB.violations.join("; ")}`);
    const [leased] = await b.exporters();
    await leaseExporter(b.client, b.ns, leased.metadata.name!, { lease: "cluster-b" });
    const before = await clusterSnapshot(b);
    const wb = b;
    const count = [...(await b.inspectAll()).values()].flatMap((h) => h.instances).filter((i) => wb.owns(i)).length;
    if (count !== B_REPLICAS) throw new Error(`cluster B has ${count} instances on the hosts, want ${B_REPLICAS}`);
    await a.seed((s) => Object.assign(s.spec, FaultWorld.LOW));
    await a.controller.start();
    const baseA = await checkInvariants(a);
    if (!baseA.ok) throw new Error(`cluster A's baseline did not hold: ${baseA.violations.join("; ")}`);
    const wa = a;

    for (let i = 1; i <= trials; i++) {
      // first an orphan of A's, so that even one trial has A's sweep remove something next to B's instances
      const change = i === 1 ? "orphan" : CHANGES[Math.floor(Math.random() * CHANGES.length)];
      results.push(
        await trial(wa, "two-clusters", `#${i} ${change}`, async (checks) => {
          const fault = await applyChange(wa, change);
          return {
            fault,
            after: async () => {
              const changed = await foreignClusterChanges(wb, before);
              checks.expect(changed.length === 0, `foreign changes: ${changed.join("; ")}`);
              return `cluster B: ${count} instances (1 leased), ${changed.length} changed`;
            },
          };
        }),
      );
    }
    // and B still holds its own invariants after all of A's trials, its sweep having run all along
    const endB = await checkInvariants(b);
    if (!endB.ok) {
      results.push({
        scenario: "two-clusters",
        trial: "cluster B at the end",
        fault: "(none: B only watched)",
        ok: false,
        seconds: endB.settleSeconds,
        note: endB.violations.join("; "),
      });
    }
  } catch (e) {
    failed = true;
    throw e;
  } finally {
    const keepLogs = failed || results.some((r) => !r.ok);
    await b?.stop({ keepLogs }).catch((e) => console.error(`  stopping cluster B's world: ${e}`));
    await a?.stop({ keepLogs }).catch((e) => console.error(`  stopping cluster A's world: ${e}`));
    await cpB.stop();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
  return results;
}

/** One random change of cluster A; returns what it was for the table. */
async function applyChange(w: FaultWorld, change: Change): Promise<string> {
  if (change === "scale") return await w.toggleScale();
  if (change === "kill mid-work") {
    const scale = await w.toggleScale();
    // where the kill lands is counted in the controller's progress (Exporter events), as in kill.ts
    const seen = await w.afterExporterEvents(1 + Math.floor(Math.random() * 6), 20_000);
    await sleep(randomBetween(0, 800));
    await w.controller.kill();
    await sleep(randomBetween(0, 1_000));
    await w.controller.start();
    return `${scale}, SIGKILL after ${seen} events, started again`;
  }
  if (change === "restart") {
    const scale = await w.toggleScale();
    const delay = randomBetween(200, 3_000);
    await sleep(delay);
    await w.controller.stop();
    await w.controller.start();
    return `${scale}, SIGTERM @${(delay / 1000).toFixed(1)}s, started again`;
  }
  if (change === "delete+recreate") {
    await w.deleteSet();
    await sleep(randomBetween(0, 2_000));
    await w.createSet((s) => Object.assign(s.spec, FaultWorld.LOW));
    return "set deleted and re-created under its name";
  }
  // an orphan of A's own, for A's sweep to remove next to B's instances of the same namespace and set name
  await w.controller.kill();
  const [victim] = (await w.exporters()).filter((e) => !e.metadata.deletionTimestamp);
  if (!victim) throw new Error("no live Exporter of cluster A to force-delete");
  const name = victim.metadata.name!;
  await w.client.mergePatch(EXPORTERS, w.ns, name, { metadata: { finalizers: null } });
  await w.client.delete(EXPORTERS, w.ns, name);
  await w.controller.start();
  return `${name} force-deleted while the controller was down (its instance left for the sweep)`;
}
