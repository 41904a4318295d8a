/**
 * The controller process SIGKILLed at random points of its work, then started again: during scale-up, scale-down,
 * deletion of the set, creation of the set, and deletion followed by re-creation of the set under the same name
 * while the controller is down. Plus the orphan sweep's own case: an Exporter force-deleted (finalizer stripped)
 * while the controller is down leaves an instance that only the sweep can remove.
 */
import { EXPORTERS } from "../../src/kube/resources.ts";
import { checkInvariants, trial, unsettledNow } from "./invariants.ts";
import { FaultWorld, type Outcome, randomBetween, sleep } from "./world.ts";
import { waitFor } from "../env.ts";

type Op = "scale-up" | "scale-down" | "delete" | "create" | "delete+recreate";
/**
 * The rotation; each trial takes the next op that fits where the set is (at 1, at 3-4, or gone), so the first three
 * trials are scale-up, scale-down, delete+recreate, and every op comes round within six.
 */
const ROTATION: Op[] = ["scale-up", "scale-down", "delete+recreate", "scale-up", "delete", "create"];
/** How long after the change the kill may land, by op: about the time the work takes here. */
const KILL_WINDOW_MS: Record<Op, [number, number]> = {
  "scale-up": [100, 5_000],
  "scale-down": [100, 4_000],
  "delete": [100, 3_000],
  "create": [100, 5_000],
  "delete+recreate": [100, 3_000],
};

const LOW = FaultWorld.LOW;
const high = FaultWorld.high;

export async function killScenario(trials: number): Promise<Outcome[]> {
  const w = await FaultWorld.create({ prefix: "kill" });
  const results: Outcome[] = [];
  let failed = false;
  try {
    await w.seed((s) => Object.assign(s.spec, LOW));
    await w.controller.start();
    const base = await checkInvariants(w);
    if (!base.ok) throw new Error(`baseline did not hold: ${base.violations.join("; ")}`);

    let next = 0;
    for (let i = 0; i < trials; i++) {
      // the next op of the rotation that fits where the set is now (a reset after a failure puts it back at 1)
      const set = await w.set();
      const state = !set ? "none" : w.desired(set) > 1 ? "high" : "low";
      while (!fits(ROTATION[next % ROTATION.length], state)) next++;
      const op = ROTATION[next++ % ROTATION.length];
      const [lo, hi] = KILL_WINDOW_MS[op];
      const o = await trial(w, "kill", `#${i + 1} ${op}`, async () => {
        let wanted = "";
        if (op === "scale-up") {
          const spec = high();
          wanted = `1->${spec.minAvailableReplicas}`;
          await w.patchSpec(spec);
        } else if (op === "scale-down") {
          wanted = "->1";
          await w.patchSpec(LOW);
        } else if (op === "delete" || op === "delete+recreate") {
          wanted = "->0";
          await w.deleteSet();
        } else {
          const spec = high();
          wanted = `0->${spec.minAvailableReplicas}`;
          await w.createSet((s) => Object.assign(s.spec, spec));
        }
        const delay = randomBetween(lo, hi);
        await sleep(delay);
        await w.controller.kill();
        const pending = await unsettledNow(w).catch((e) => `unknown (${e})`);
        if (op === "delete+recreate") {
          // The same name again while the controller is down: the old Exporters now belong to a set that is gone.
          await w.createSet((s) => Object.assign(s.spec, LOW));
          wanted = "->0, recreated ->1";
        }
        await sleep(randomBetween(0, 1_000));
        await w.controller.start();
        return {
          fault: `${wanted}, kill@${(delay / 1000).toFixed(1)}s ${pending ? "mid-work" : "after settle"}`,
          note: pending ? `at kill: ${pending}` : undefined,
        };
      });
      results.push(o);
      if (!o.ok) {
        failed = true;
        await reset(w, op);
      }
    }

    results.push(
      await trial(w, "kill", "delete + re-create at once (no kill)", async () => {
        // The same race without any kill: the set comes back under its name before its Exporters are torn down.
        const now = await w.set();
        if (!now) await w.createSet((s) => Object.assign(s.spec, high()));
        else if (w.desired(now) < 3) await w.patchSpec(high());
        await checkInvariants(w);
        await w.deleteSet();
        await waitFor(async () => (await w.exporters()).some((e) => e.metadata.deletionTimestamp), {
          what: "the controller to start deleting the Exporters",
          timeoutMs: 30_000,
          intervalMs: 100,
        });
        await w.createSet((s) => Object.assign(s.spec, LOW));
        return { fault: "set deleted, re-created once its Exporters are being deleted" };
      }),
    );
    if (!results[results.length - 1].ok) await reset(w, "delete+recreate");

    results.push(
      await trial(w, "kill", "orphan: Exporter force-deleted while down", async (checks) => {
        // The sweep's own case: the Exporter vanishes without its teardown, the instance stays on the host.
        const set = await w.set();
        if (!set) await w.createSet((s) => Object.assign(s.spec, LOW));
        await checkInvariants(w);
        await w.controller.kill();
        const [victim] = (await w.exporters()).filter((e) => !e.metadata.deletionTimestamp);
        checks.expect(victim, "no Exporter to force-delete");
        if (victim) {
          await w.client.mergePatch(EXPORTERS, w.ns, victim.metadata.name!, { metadata: { finalizers: null } });
          await w.client.delete(EXPORTERS, w.ns, victim.metadata.name!);
        }
        await w.controller.start();
        return { fault: `${victim?.metadata.name} force-deleted, controller down`, note: "sweep must remove it" };
      }),
    );
    const last = results[results.length - 1];
    if (last.ok && !last.swept) {
      last.ok = false;
      last.note = "the force-deleted Exporter's instance was not found by the sweep";
    }
  } finally {
    await w.stop({ keepLogs: failed || results.some((r) => !r.ok) });
  }
  return results;
}

function fits(op: Op, state: "none" | "low" | "high"): boolean {
  if (state === "none") return op === "create";
  if (op === "scale-up") return state === "low";
  if (op === "scale-down") return state === "high";
  return op !== "create";
}

/** After a failed trial: a clean slate (set at 1), so one failure does not cascade into every later trial. */
async function reset(w: FaultWorld, after: Op): Promise<void> {
  console.log(`  [kill] resetting the world after a failed ${after} trial`);
  await w.controller.kill();
  await w.purge();
  await w.createSet((s) => Object.assign(s.spec, LOW));
  await w.controller.start();
  await checkInvariants(w);
}
