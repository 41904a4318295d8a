/**
 * `deno task bench [--quick]`: the provisioner against the alternative (Ansible), a naive deployer and the bare host
 * work (bare.ts, the floor), on real lab
 * hosts (own network qsplab8 / 10.84.0.0/24) and a private control plane, plus the controller's cost at three fleet
 * sizes and a linear scale model. Progress goes to stderr; results to bench/results/<quick|full>.{json,md}; the last
 * line on stdout is `ratio-vs-ansible deploy=<ours/theirs> teardown=<ours/theirs>`.
 *
 * quick: 2 hosts; fleets 1x1, 2x1, 2x2 (compared at 2x2); 1 min steady state.
 * full:  8 hosts; fleets 2x2, 4x2, 8 hosts x 2..4 (24 instances), all compared; 10 min steady state.
 */
import { parseArgs } from "node:util";
import { join } from "node:path";
import { Ansible, ensureAnsible } from "./ansible.ts";
import { startCluster } from "./cluster.ts";
import { measure } from "./deployer.ts";
import { type Fleet, fleetLabel, instanceCount, labFacts, renderFleet, seedFor, startLab, stopLab } from "./fleet.ts";
import { HostProbe } from "./hosts.ts";
import { hostSideDeployer } from "./hostside.ts";
import { naiveDeployer } from "./naive.ts";
import { bareDeployer } from "./bare.ts";
import { type ControllerRun, runController } from "./ours.ts";
import {
  asDeployerResult,
  type Comparison,
  markdown,
  ratio,
  ratioLine,
  type Results,
  scaleModel,
  writeResults,
} from "./report.ts";

interface Plan {
  hosts: number;
  sizes: { fleet: Fleet; compare: boolean }[];
  steadyMinutes: number;
}

const PLANS: Record<Results["mode"], Plan> = {
  quick: {
    hosts: 2,
    sizes: [{ fleet: [1], compare: false }, { fleet: [1, 1], compare: false }, { fleet: [2, 2], compare: true }],
    steadyMinutes: 1,
  },
  full: {
    hosts: 8,
    sizes: [
      { fleet: [2, 2], compare: true },
      { fleet: [2, 2, 2, 2], compare: true },
      { fleet: [2, 3, 4, 3, 2, 3, 4, 3], compare: true },
    ],
    steadyMinutes: 10,
  },
};

const { values } = parseArgs({ args: Deno.args, options: { quick: { type: "boolean", default: false } } });
const mode: Results["mode"] = values.quick ? "quick" : "full";
const plan = PLANS[mode];
const t0 = performance.now();
const log = (msg: string) => console.error(`[bench ${((performance.now() - t0) / 1000).toFixed(0)}s] ${msg}`);

async function git(...args: string[]): Promise<string> {
  const out = await new Deno.Command("git", { args, stdout: "piped", stderr: "null" }).output();
  return new TextDecoder().decode(out.stdout).trim();
}

const startedAt = new Date().toISOString();
const loadAverage = async () => (await Deno.readTextFile("/proc/loadavg")).split(" ").slice(0, 3).join(" ");
const loadavg = await loadAverage();
const ansibleVersion = await ensureAnsible();
const dir = await Deno.makeTempDir({ prefix: "qsp-bench-" });
log(`${mode} run; work dir ${dir} (kept if the run fails)`);

/** Everything between starting the world and stopping it; `cleanup` collects how to stop what was started. */
async function bench(cleanup: (() => Promise<void>)[]): Promise<Results> {
  await stopLab(); // leftovers of an interrupted run would not be clean hosts
  const cluster = await startCluster(join(dir, "controlplane"));
  cleanup.push(() => cluster.stop());
  log(`control plane ready at ${cluster.cp.server}`);
  cleanup.push(stopLab);
  const lab = await startLab(plan.hosts);
  log(`${lab.length} lab hosts up: ${lab.map((h) => h.address).join(" ")}`);
  const probe = new HostProbe();
  cleanup.push(() => probe.close());
  const ansible = await Ansible.create(join(dir, "ansible"), lab);
  const hostSide = hostSideDeployer(probe);

  // Warm-up, untimed: every host starts one instance's containers once (page cache, podman storage).
  const facts = await labFacts(lab[0]);
  const warm = renderFleet(await seedFor("bench", lab, lab.map(() => 1)), lab.map(() => 1), facts);
  await measure(hostSide, warm, probe);
  const noop = performance.now();
  await ansible.playbook("noop", warm);
  const ansibleNoopSeconds = (performance.now() - noop) / 1000;
  log(`warm-up done; ansible-playbook with no tasks takes ${ansibleNoopSeconds.toFixed(2)} s`);

  const controller: ControllerRun[] = [];
  const comparisons: Comparison[] = [];
  for (const [i, { fleet, compare }] of plan.sizes.entries()) {
    const label = fleetLabel(fleet);
    const steadyMinutes = i === plan.sizes.length - 1 ? plan.steadyMinutes : 0;
    const run = await runController({ cluster, lab, probe, dir, steadyMinutes }, fleet);
    controller.push(run);
    log(
      `${label}: controller deploy ${run.deploy.seconds.toFixed(2)} s, teardown ${run.teardown.seconds.toFixed(2)} s`,
    );
    if (!compare) continue;
    const placement = renderFleet(await seedFor("bench", lab.slice(0, fleet.length), fleet), fleet, facts);
    const others = [];
    for (const d of [hostSide, ansible, naiveDeployer, bareDeployer]) {
      const x = await measure(d, placement, probe);
      log(
        `${label}: ${x.deployer}: deploy ${x.deploy.seconds.toFixed(2)} s, teardown ${x.teardown.seconds.toFixed(2)} s`,
      );
      others.push(x);
    }
    const [hostSideResult, ansibleResult, naiveResult, bareResult] = others;
    comparisons.push({
      fleet: label,
      instances: instanceCount(fleet),
      ours: asDeployerResult(run),
      hostSide: hostSideResult,
      ansible: ansibleResult,
      naive: naiveResult,
      bare: bareResult,
    });
  }

  const last = comparisons[comparisons.length - 1];
  return {
    mode,
    startedAt,
    wallSeconds: NaN,
    machine: {
      cpus: navigator.hardwareConcurrency,
      loadavg: { start: loadavg, end: await loadAverage() },
      commit: await git("rev-parse", "HEAD"),
      deno: `deno ${Deno.version.deno}`,
      ansible: ansibleVersion,
    },
    apiRequestsMeasuredAt: "API server side: apiserver_request_total delta (resource requests, without " +
      "coordination.k8s.io) minus the bench's and the fake Jumpstarter's client-side counts",
    ansibleNoopSeconds,
    controller,
    comparisons,
    scaleModel: scaleModel(controller),
    ratios: {
      vsAnsible: ratio(last.ours, last.ansible),
      vsAnsibleWithoutStartup: ratio(last.ours, last.ansible, ansibleNoopSeconds),
      vsNaive: ratio(last.ours, last.naive),
      hostSideVsAnsible: ratio(last.hostSide, last.ansible),
      hostSideVsNaive: ratio(last.hostSide, last.naive),
      bareVsAnsible: ratio(last.bare, last.ansible),
      vsBare: ratio(last.ours, last.bare),
      hostSideVsBare: ratio(last.hostSide, last.bare),
    },
  };
}

const cleanup: (() => Promise<void>)[] = [];
let results: Results;
try {
  results = await bench(cleanup);
} finally {
  for (const step of cleanup.reverse()) await step().catch((e) => log(`cleanup: ${e}`));
}
await Deno.remove(dir, { recursive: true });
results.wallSeconds = (performance.now() - t0) / 1000;
const files = await writeResults(results);
console.error(markdown(results));
log(`results: ${files.join(", ")}`);
// the one line on stdout, and the last thing printed
console.log(ratioLine(results.ratios.vsAnsible));
