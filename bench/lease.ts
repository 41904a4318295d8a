/**
 * `deno task bench:lease [--leases N] [--warm-idle S]`: how long a user waits for a target, on the real chain (the real Jumpstarter
 * controller, the real exporter on a lab host, `jmp shell`) in the sandbox that `deno task demo` leaves running (only
 * one real Jumpstarter controller fits on a machine, and the demo's is it).
 *
 * - cold: a pool with nothing deployed, then demand: the wait covers the controller noticing it, the apply on the
 *   host, the exporter registering and going Online, and the shell. Upstream's cold path is a pending lease on a
 *   WaitForFirstConsumer pool, but v0.7.1 (the only real controller obtainable here) ends a lease whose selector
 *   matches no Exporter at once (Unsatisfiable, NoExporter), before this controller has created one. So the demand
 *   is raising the set's minReplicas from 0 to 1, and `jmp shell` starts once the Exporter object exists. On a quiet
 *   machine its lease comes before the exporter is Online, so v0.7.1 ends that one too (NoExporter, lease_controller.go
 *   207-217), and jmp 0.9.0 creates the next one 5 s later (jumpstarter/client/lease.py 224-235): those 5 s are
 *   upstream's.
 * - warm: an Immediate pool with an exporter Online and idle for `--warm-idle` seconds (10): lease and shell only.
 *
 * Times run from the demand (cold) or the Lease object's appearance (warm, polled every 100 ms) to the exporter
 * Online and to the moment the command given to `jmp shell` runs (it prints the clock); jmp's own start before it
 * creates the Lease is reported apart. A minimal in-cluster comparison is not possible here: this machine has no kubelet to run upstream's pods.
 * Prints p50 and p95, a breakdown of the cold path, and a last line `lease cold-online=…s cold-shell=…s warm-shell=…s`.
 */
import { parseArgs } from "node:util";
import { KubeClient } from "../src/kube/client.ts";
import { EXPORTER_SETS, EXPORTERS, JUMPSTARTER_LEASES, VIRTUAL_TARGET_CLASSES } from "../src/kube/resources.ts";
import type { Exporter, ExporterSet, KubeObject, Lease, VirtualTargetClass } from "../src/api/types.ts";
import { leaseState } from "../src/provision/leases.ts";
import { seedExample, waitFor } from "../test/env.ts";
import type { LabHost } from "../test/labhost/labhost.ts";
import { HostProbe } from "./hosts.ts";
import { percentile } from "./stats.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: { leases: { type: "string", default: "10" }, "warm-idle": { type: "string", default: "10" } },
});
const N = Number(values.leases);
// A warm pool's exporter has sat idle for a while when a user comes; --warm-idle 0 leases it the moment it can be.
const WARM_IDLE_MS = Number(values["warm-idle"]) * 1000;
const ROOT = new URL("../", import.meta.url).pathname;
const SANDBOX = `${ROOT}.sandbox`;
const NS = "jumpstarter";
const POLL_MS = 100;

const env = Object.fromEntries(
  (await Deno.readTextFile(`${SANDBOX}/env`).catch(() => "")).split("\n").map((l) => l.split("=", 2)),
);
if (!env.JMP || !env.JMP_CLIENT_CONFIG) {
  console.error("bench:lease needs the real Jumpstarter sandbox: run `deno task demo` first");
  Deno.exit(2);
}
const client = await KubeClient.load(`${SANDBOX}/kubeconfig`);
const [host]: LabHost[] = JSON.parse(await Deno.readTextFile(`${SANDBOX}/labhosts.json`));
const probe = new HostProbe();

const condition = (e: Exporter, type: string) =>
  e.status?.conditions?.some((c) => c.type === type && c.status === "True");
const online = (e: Exporter) => condition(e, "Online");
const pool = (set: string) =>
  client.list<Exporter>(EXPORTERS, NS).then((l) => l.items.filter((e) => e.metadata.labels?.pool === set));
const now = () => Date.now();

/** A pool of its own, selected by label pool=NAME, from the seed's class (Immediate) and set. */
async function createPool(name: string, minAvailable: number) {
  const cls = await seedExample("virtualtargetclass.yaml", NS) as VirtualTargetClass;
  cls.metadata = { name, namespace: NS };
  const set = await seedExample("exporterset.yaml", NS) as ExporterSet;
  set.metadata = { name, namespace: NS };
  Object.assign(set.spec, {
    virtualTargetClassName: name,
    minAvailableReplicas: minAvailable,
    maxReplicas: 2,
    scaleDownCooldown: "0s",
    selector: { matchLabels: { pool: name } },
  });
  set.spec.template!.metadata!.labels = { ...set.spec.template!.metadata!.labels, pool: name };
  await client.create(VIRTUAL_TARGET_CLASSES, cls as unknown as KubeObject);
  await client.create(EXPORTER_SETS, set as unknown as KubeObject);
}

async function deletePool(name: string) {
  await client.delete(EXPORTER_SETS, NS, name).catch(() => {});
  await waitFor(async () => (await pool(name)).length === 0, { what: `pool ${name} empty`, timeoutMs: 300_000 })
    .catch((e) => console.error(`${e}`));
  await client.delete(VIRTUAL_TARGET_CLASSES, NS, name).catch(() => {});
}

interface Sample {
  jmpStart: number;
  online?: number;
  shell: number;
  steps?: Record<string, number>;
}

/** One `jmp shell -l pool=NAME -- date`, with what the API shows meanwhile, in ms from the Lease's appearance. */
async function lease(name: string, cold: boolean): Promise<Sample> {
  const before = new Set((await client.list<Lease>(JUMPSTARTER_LEASES, NS)).items.map((l) => l.metadata.name));
  const seen: Record<string, number> = {};
  let exporter: string | undefined;
  if (cold) {
    seen.demand = now();
    await client.mergePatch(EXPORTER_SETS, NS, name, { spec: { minReplicas: 1 } });
    const e = await waitFor(async () => (await pool(name))[0], { what: `an Exporter of ${name}`, intervalMs: POLL_MS });
    [seen.exporter, exporter] = [now(), e.metadata.name];
  }
  const t0 = now();
  const child = new Deno.Command(env.JMP, {
    args: ["shell", "--client-config", env.JMP_CLIENT_CONFIG, "-l", `pool=${name}`, "--", "date", "+QSP-SHELL %s%N"],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let done = false;
  const output = child.output().finally(() => done = true);
  while (!done) {
    const t = now();
    if (!seen.lease) {
      const l = (await client.list<Lease>(JUMPSTARTER_LEASES, NS)).items.find((l) => !before.has(l.metadata.name));
      if (l) seen.lease = t;
    }
    if (cold && !seen.online) {
      const [e] = await pool(name);
      if (e?.status?.conditions?.some((c) => c.type === "Registered" && c.status === "True")) seen.registered ??= t;
      if (e && online(e)) seen.online = t;
    }
    await new Promise((r) => setTimeout(r, POLL_MS));
  }
  const out = await output;
  // no more demand: the lease's end replaces the exporter (ExitAndReplace) with none
  if (cold) await client.mergePatch(EXPORTER_SETS, NS, name, { spec: { minReplicas: 0 } });
  const text = new TextDecoder().decode(out.stdout);
  const shellNs = text.match(/QSP-SHELL (\d+)/)?.[1];
  if (!out.success || !shellNs || !seen.lease) {
    throw new Error(`jmp shell -l pool=${name}: exit ${out.code}\n${text}${new TextDecoder().decode(out.stderr)}`);
  }
  const from = cold ? seen.demand : seen.lease;
  const shell = Number(BigInt(shellNs) / 1_000_000n) - from;
  const sample: Sample = { jmpStart: seen.lease - t0, shell };
  if (cold) {
    sample.online = seen.online! - from;
    const units = exporter ? (await probe.readyTimes(host, [exporter])).get(exporter) : undefined;
    sample.steps = {
      "demand -> Exporter created": seen.exporter - from,
      "-> units active on the host": units ? units - seen.exporter : NaN,
      "-> Registered": (seen.registered ?? NaN) - (units ?? seen.exporter),
      "-> Online": seen.online! - (seen.registered ?? seen.exporter),
      "-> shell runs the command": shell - sample.online,
    };
  }
  return sample;
}

/**
 * Waits until the pool is ready for the next lease: cold empty, warm with an idle exporter Jumpstarter can lease
 * (Registered and Online, which is all v0.7.1 asks). One whose lease has ended is not idle but on its way out
 * (ExitAndReplace); taking it for the pool's idle member leased into the gap before its replacement came Online, and
 * v0.7.1 then ended the lease at once (Unsatisfiable, NoExporter) and jmp tried again 5 s later.
 */
async function settled(name: string, cold: boolean) {
  await waitFor(async () => {
    const es = await pool(name);
    if (cold) return es.length === 0;

    const leases = (await client.list<Lease>(JUMPSTARTER_LEASES, NS)).items;
    const since = (e: Exporter) =>
      Date.parse(e.status?.conditions?.find((c) => c.type === "Online")?.lastTransitionTime ?? "");
    return es.some((e) =>
      online(e) && condition(e, "Registered") && leaseState(e, leases) === "none" && e.spec?.enabled !== false &&
      !e.metadata.deletionTimestamp && now() - since(e) >= WARM_IDLE_MS
    );
  }, { what: `pool ${name} ${cold ? "empty" : "with an idle exporter to lease"}`, timeoutMs: 300_000 });
}

const s = (ms: number) => (ms / 1000).toFixed(2);
const stats = (xs: number[]) => `p50 ${s(percentile(xs, 50))} s, p95 ${s(percentile(xs, 95))} s (n=${xs.length})`;

const results: Record<"cold" | "warm", Sample[]> = { cold: [], warm: [] };
for (const [name, cold] of [["bench-cold", true], ["bench-warm", false]] as const) {
  await deletePool(name);
  await createPool(name, cold ? 0 : 1);
  try {
    for (let i = 0; i < N; i++) {
      await settled(name, cold);
      const r = await lease(name, cold);
      results[cold ? "cold" : "warm"].push(r);
      console.log(
        `${name} #${i + 1}: jmp start ${s(r.jmpStart)} s, ${cold ? `online ${s(r.online!)} s, ` : ""}shell ${
          s(r.shell)
        } s`,
      );
    }
  } finally {
    await deletePool(name);
  }
}

console.log(`\njmp start before the Lease: ${stats([...results.cold, ...results.warm].map((r) => r.jmpStart))}`);
console.log(`cold, demand -> exporter Online: ${stats(results.cold.map((r) => r.online!))}`);
console.log(`cold, demand -> shell runs the command: ${stats(results.cold.map((r) => r.shell))}`);
console.log(
  `warm (idle ${WARM_IDLE_MS / 1000} s), lease -> shell runs the command: ${stats(results.warm.map((r) => r.shell))}`,
);
console.log("cold breakdown (p50 of each step):");
for (const step of Object.keys(results.cold[0]?.steps ?? {})) {
  console.log(
    `  ${step.padEnd(32)} ${s(percentile(results.cold.map((r) => r.steps![step]).filter(Number.isFinite), 50))} s`,
  );
}
console.log("in-cluster comparison: not possible here (no kubelet to run upstream's exporter pods)");
await probe.close();
client.close();
console.log(
  `lease cold-online=${s(percentile(results.cold.map((r) => r.online!), 50))}s ` +
    `cold-shell=${s(percentile(results.cold.map((r) => r.shell), 50))}s ` +
    `warm-shell=${s(percentile(results.warm.map((r) => r.shell), 50))}s`,
);
