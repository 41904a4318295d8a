/**
 * The set under test changes while everything else stays: scale up, its runtime image changed (pull policy) while
 * several of its instances share a host (concurrent applies), scale down, its host moved to the other lab host
 * (`spec.parameters.host`), its runtime image changed again, and the set deleted and re-created under its name. No fault is injected: the change itself is the trial, and the invariants (with the foreign objects and the
 * leased set of ours next to it, whose runtime also changes every trial) must hold after each one.
 *
 * One namespace: every fault world starts the controller with `--namespace`; a second namespace would need it
 * cluster-wide, where it would also take up the sets that earlier worlds leave in their namespaces of the same control
 * plane. (The foreign instance on each host already belongs to another namespace.)
 */
import { HOST_ANNOTATION } from "../../src/provision/marks.ts";
import { type Checks, settledWorld, trial } from "./invariants.ts";
import { FaultWorld, type Outcome, SECOND_HOST, SEED_HOST, sh } from "./world.ts";

const HIGH = { ...FaultWorld.LOW, minAvailableReplicas: 3 };

export async function changeScenario(reps: number): Promise<Outcome[]> {
  const w = await settledWorld("change");
  const results: Outcome[] = [];
  try {
    for (let rep = 1; rep <= reps; rep++) {
      results.push(
        await trial(w, "change", `scale up #${rep}`, async () => {
          await w.patchSpec(HIGH);
          return { fault: `1->${HIGH.minAvailableReplicas}` };
        }),
      );
      // at the high count: several applies of one change run at once on one host
      results.push(
        await trial(w, "change", `image change, concurrent applies #${rep}`, async (checks) => {
          const was = (await w.set())?.spec.images?.runtime?.imagePullPolicy;
          const pull = was === "Never" ? "IfNotPresent" : "Never";
          const since = Date.now();
          await w.patchSpec({ images: { runtime: { imagePullPolicy: pull } } });
          return {
            fault: `runtime pull policy ${was ?? "(default)"} -> ${pull} on ${HIGH.minAvailableReplicas} at once`,
            after: () => pulls(w, checks, pull, since),
          };
        }),
      );
      results.push(
        await trial(w, "change", `scale down #${rep}`, async () => {
          await w.patchSpec(FaultWorld.LOW);
          return { fault: `${HIGH.minAvailableReplicas}->1` };
        }),
      );
      results.push(
        await trial(w, "change", `host move #${rep}`, async (checks) => {
          const [e] = (await w.exporters()).filter((x) => !x.metadata.deletionTimestamp);
          const from = e?.metadata.annotations?.[HOST_ANNOTATION] ?? SEED_HOST;
          const to = from === SEED_HOST ? SECOND_HOST : SEED_HOST;
          await w.patchSpec({ parameters: { host: { name: to } } });
          return { fault: `${from} -> ${to}`, after: () => allOn(w, checks, to) };
        }),
      );
      results.push(
        await trial(w, "change", `image change #${rep}`, async (checks) => {
          const was = (await w.set())?.spec.images?.runtime?.imagePullPolicy;
          const pull = was === "Never" ? "IfNotPresent" : "Never";
          const since = Date.now();
          await w.patchSpec({ images: { runtime: { imagePullPolicy: pull } } });
          return {
            fault: `runtime pull policy ${was ?? "(default)"} -> ${pull}`,
            after: () => pulls(w, checks, pull, since),
          };
        }),
      );
      results.push(
        await trial(w, "change", `delete + re-create #${rep}`, async () => {
          await w.deleteSet();
          await w.createSet((s) => Object.assign(s.spec, FaultWorld.LOW));
          return { fault: "set deleted and re-created under its name (host and image back to the example's)" };
        }),
      );
    }
  } finally {
    await w.stop({ keepLogs: results.some((r) => !r.ok) });
  }
  return results;
}

/** After a host move: every live Exporter is annotated with, and runs on, the new host. */
async function allOn(w: FaultWorld, checks: Checks, host: string): Promise<string> {
  const live = (await w.exporters()).filter((e) => !e.metadata.deletionTimestamp);
  const elsewhere = live.filter((e) => e.metadata.annotations?.[HOST_ANNOTATION] !== host);
  checks.expect(
    elsewhere.length === 0,
    `not moved to ${host}: ${elsewhere.map((e) => `${e.metadata.name}@${e.metadata.annotations?.[HOST_ANNOTATION]}`)}`,
  );
  return `${live.length} on ${host}`;
}

/**
 * After an image change: every live Exporter's runtime quadlet carries the new pull policy, and its runtime container
 * started after the change (0 lost restarts: an overlapping apply's daemon-reload must not make one skip its restart).
 */
async function pulls(w: FaultWorld, checks: Checks, policy: string, since: number): Promise<string> {
  const want = policy === "Never" ? "Pull=never" : "Pull=missing"; // how host/render.ts writes the two used here
  const live = (await w.exporters()).filter((e) => !e.metadata.deletionTimestamp);
  const lost: string[] = [];
  for (const e of live) {
    const name = e.metadata.name!;
    const host = w.hostNamed(e.metadata.annotations?.[HOST_ANNOTATION] ?? "");
    const quadlet = host ? await sh(host, `cat /etc/containers/systemd/${name}-runtime.container`) : "";
    checks.expect(quadlet.split("\n").includes(want), `${name}'s runtime quadlet has no ${want}`);
    const started = host ? Number(await sh(host, `podman inspect -f '{{.State.StartedAt.Unix}}' ${name}-runtime`)) : 0;
    if (started < Math.floor(since / 1000)) lost.push(name);
  }
  checks.expect(lost.length === 0, `lost restarts: ${lost.join(", ")} still run the runtime started before the change`);
  return `${live.length} rolled to ${want}, ${lost.length} lost restarts`;
}
