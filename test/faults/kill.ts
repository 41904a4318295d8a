/**
 * The controller process SIGKILLed at random points of its work, then started again: during scale-up, scale-down,
 * deletion of the set, creation of the set, and deletion followed by re-creation of the set under the same name
 * while the controller is down. Then the same re-creation without a kill (deterministic: the host is unreachable
 * while the set is deleted), and the orphan sweep's own cases: an Exporter force-deleted (finalizer stripped) while
 * the controller is down leaves an instance, or what an interrupted removal leaves of one, that only the sweep can
 * remove (the sweep is called once per trial, see FaultWorld.sweep: `run` has no flag for its interval).
 */
import { EXPORTERS } from "../../src/kube/resources.ts";
import { checkInvariants, trial, unsettledNow } from "./invariants.ts";
import { FaultWorld, type Outcome, randomBetween, SEED_HOST, sh, sleep } from "./world.ts";
import { waitFor } from "../env.ts";

type Op = "scale-up" | "scale-down" | "delete" | "create" | "delete+recreate";
/**
 * The rotation; each trial takes the next op that fits where the set is (at 1, at 3-4, or gone), so the first three
 * trials are scale-up, scale-down, delete+recreate, and every op comes round within six.
 */
const ROTATION: Op[] = ["scale-up", "scale-down", "delete+recreate", "scale-up", "delete", "create"];
/**
 * Where the kill lands is measured in the controller's progress, not in seconds (which depend on the machine's
 * load): after a random number of the Exporter events the op causes (creation, credentials, the two annotations per
 * new Exporter; drain, deletion, finalizer removal per removed one), plus up to 800 ms, so it falls inside the SSH
 * work that follows an API write as often as between writes.
 */
const EVENTS_PER_EXPORTER: Record<Op, number> = {
  "scale-up": 4,
  "scale-down": 3,
  "delete": 2,
  "create": 4,
  "delete+recreate": 2,
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
      const o = await trial(w, "kill", `#${i + 1} ${op}`, async () => {
        const before = (await w.exporters()).filter((e) => !e.metadata.deletionTimestamp).length;
        let wanted = "";
        let after = 0;
        if (op === "scale-up") {
          const spec = high();
          after = spec.minAvailableReplicas;
          wanted = `${before}->${after}`;
          await w.patchSpec(spec);
        } else if (op === "scale-down") {
          after = 1;
          wanted = `${before}->1`;
          await w.patchSpec(LOW);
        } else if (op === "delete" || op === "delete+recreate") {
          wanted = `${before}->0`;
          await w.deleteSet();
        } else {
          const spec = high();
          after = spec.minAvailableReplicas;
          wanted = `0->${after}`;
          await w.createSet((s) => Object.assign(s.spec, spec));
        }
        const expected = EVENTS_PER_EXPORTER[op] * Math.max(1, Math.abs(after - before));
        const n = 1 + Math.floor(Math.random() * Math.max(1, expected - 1)); // before the last one
        const t0 = performance.now();
        const seen = await w.afterExporterEvents(n, 20_000);
        await sleep(randomBetween(0, 800));
        const delay = performance.now() - t0;
        await w.controller.kill();
        const pending = await unsettledNow(w).catch((e) => `unknown (${e})`);
        if (op === "delete+recreate") {
          // The same name again while the controller is down: the old Exporters now belong to a set that is gone.
          await w.createSet((s) => Object.assign(s.spec, LOW));
          wanted += ", recreated ->1";
        }
        await sleep(randomBetween(0, 1_000));
        await w.controller.start();
        return {
          fault: `${wanted}, kill after ${seen}/${expected} events @${(delay / 1000).toFixed(1)}s ` +
            (pending ? "mid-work" : "after settle"),
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
      await trial(w, "recreate", "delete + re-create, host unreachable", async (checks) => {
        // The same without any kill, deterministically: the set is deleted while its host cannot be reached (so the
        // teardowns wait), is re-created under its name (GitOps re-applying it), and the host comes back.
        const host = w.hostNamed(SEED_HOST)!;
        const now = await w.set();
        if (!now) await w.createSet((s) => Object.assign(s.spec, high()));
        else if (w.desired(now) < 3) await w.patchSpec(high());
        await checkInvariants(w);
        try {
          await w.inHost(host, "systemctl stop ssh.service; pkill -x sshd-session || true");
          await w.deleteSet();
          await waitFor(async () => {
            const es = await w.exporters();
            return es.length > 0 && es.every((e) => e.metadata.deletionTimestamp);
          }, { what: "the controller to delete the Exporters", timeoutMs: 60_000, intervalMs: 200 });
          await waitFor(async () => (await w.events()).some((e) => e.reason === "TeardownFailed"), {
            what: "a teardown to fail on the unreachable host",
            timeoutMs: 60_000,
            intervalMs: 500,
          }).catch(() => checks.expect(false, "no TeardownFailed event while the host was unreachable"));
          await w.createSet((s) => Object.assign(s.spec, LOW));
        } finally {
          await w.inHost(host, "systemctl start ssh.service");
        }
        return { fault: "set deleted while sshd is down, re-created, sshd back" };
      }),
    );
    if (!results[results.length - 1].ok) await reset(w, "delete+recreate");

    // The sweep's own cases: the Exporter vanishes without its teardown (finalizer stripped while the controller is
    // down), so the instance stays on the host; once whole, once as what an interrupted removal leaves (containers
    // and files gone, the volume still there).
    for (const leftover of ["whole instance", "volume only"] as const) {
      const o = await trial(w, "sweep", `orphan: ${leftover}`, async (checks) => {
        const set = await w.set();
        if (!set) await w.createSet((s) => Object.assign(s.spec, LOW));
        await checkInvariants(w);
        await w.controller.kill();
        const [victim] = (await w.exporters()).filter((e) => !e.metadata.deletionTimestamp);
        checks.expect(victim, "no Exporter to force-delete");
        const name = victim?.metadata.name;
        if (name) {
          await w.client.mergePatch(EXPORTERS, w.ns, name, { metadata: { finalizers: null } });
          await w.client.delete(EXPORTERS, w.ns, name);
          if (leftover === "volume only") {
            await sh(
              w.hostNamed(SEED_HOST)!,
              `systemctl stop ${name}-exporter ${name}-runtime && podman rm -f ${name}-exporter ${name}-runtime && ` +
                `rm -rf /etc/containers/systemd/${name}-*.container /etc/jumpstarter/exporters/${name}.yaml ` +
                `/etc/jumpstarter/exporters/${name}.d && systemctl daemon-reload && ` +
                `podman volume exists jumpstarter-${name}-shared`,
            );
          }
        }
        await w.controller.start();
        return { fault: `${name} force-deleted while the controller was down, ${leftover} left` };
      });
      if (o.ok && !o.swept) {
        o.ok = false;
        o.note = "the sweep did not remove the leftover";
      }
      results.push(o);
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
  await w.purge({ setOnly: true });
  await w.createSet((s) => Object.assign(s.spec, LOW));
  await w.controller.start();
  await checkInvariants(w);
}
