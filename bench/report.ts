/** The bench's results: the JSON written to bench/results/, the Markdown summary beside it, and the ratio line. */
import { join } from "node:path";
import type { DeployerResult } from "./deployer.ts";
import type { ControllerRun } from "./ours.ts";
import { type LinearFit, linearFit, round } from "./stats.ts";

export const RESULTS_DIR = join(import.meta.dirname!, "results");

export interface Comparison {
  fleet: string;
  instances: number;
  /** ours = the controller end to end (control plane included); hostSide = LabHosts in process. */
  ours: DeployerResult;
  hostSide: DeployerResult;
  ansible: DeployerResult;
  naive: DeployerResult;
  /** The host's own work alone (bare.ts): the floor. */
  bare: DeployerResult;
}

export interface Results {
  mode: "quick" | "full";
  startedAt: string;
  wallSeconds: number;
  machine: { cpus: number; loadavg: { start: string; end: string }; commit: string; deno: string; ansible: string };
  apiRequestsMeasuredAt: string;
  /** ansible-playbook with no tasks: its fixed start-up cost, included in its times. */
  ansibleNoopSeconds: number;
  controller: ControllerRun[];
  comparisons: Comparison[];
  /** Cost per instance over the few instances measured here; bench:scale measures hundreds of hosts instead. */
  scaleModel: Record<string, LinearFit>;
  ratios: {
    vsAnsible: Ratio;
    /** Against Ansible minus its no-op start-up, since the controller's own start-up is not in its time either. */
    vsAnsibleWithoutStartup: Ratio;
    vsNaive: Ratio;
    hostSideVsAnsible: Ratio;
    hostSideVsNaive: Ratio;
    /** How far below Ansible the host's own work is: no deployer's ratio to Ansible can be lower. */
    bareVsAnsible: Ratio;
    vsBare: Ratio;
    hostSideVsBare: Ratio;
  };
}

export interface Ratio {
  deploy: number;
  teardown: number;
}

/** The controller's deploy as a DeployerResult, so every comparison row has the same shape. */
export function asDeployerResult(run: ControllerRun): DeployerResult {
  const phase = (p: ControllerRun["deploy"]) => ({
    seconds: p.seconds,
    sshRoundTrips: p.sshRoundTrips,
    sshConnections: p.sshConnections,
  });
  return {
    deployer: "ours: controller (control plane included)",
    deploy: phase(run.deploy),
    teardown: phase(run.teardown),
  };
}

/** ours / theirs, optionally with `theirsFixed` seconds taken off each of their phases. */
export const ratio = (ours: DeployerResult, theirs: DeployerResult, theirsFixed = 0): Ratio => ({
  deploy: ours.deploy.seconds / (theirs.deploy.seconds - theirsFixed),
  teardown: ours.teardown.seconds / (theirs.teardown.seconds - theirsFixed),
});

/**
 * Linear fits of the controller's cost against the instance count. Not extrapolated: from at most a few instances a
 * line to thousands said nothing (it once came out at -16430 s); bench:scale measures 50 to 500 hosts for that.
 */
export function scaleModel(runs: ControllerRun[]): Results["scaleModel"] {
  const xs = runs.map((r) => r.instances);
  const series: Record<string, number[]> = {
    deploySeconds: runs.map((r) => r.deploy.seconds),
    teardownSeconds: runs.map((r) => r.teardown.seconds),
    deploySshRoundTrips: runs.map((r) => r.deploy.sshRoundTrips),
    deployApiRequests: runs.map((r) => r.deploy.apiRequests),
    deployCpuSeconds: runs.map((r) => r.deploy.controllerCpuSeconds),
    peakRssMiB: runs.map((r) => r.rssMiB.peak),
    deployedRssMiB: runs.map((r) => r.rssMiB.deployed),
  };
  const out: Results["scaleModel"] = {};
  for (const [k, ys] of Object.entries(series)) {
    out[k] = linearFit(xs, ys);
  }
  return out;
}

const f = (v: number | undefined, d = 2) => v === undefined ? "" : String(round(v, d) ?? "n/a");
const row = (cells: (string | number)[]) => `| ${cells.join(" | ")} |`;

export function markdown(r: Results): string {
  const lines = [
    `# Benchmark (${r.mode}): qemu-ssh-provisioner vs Ansible vs naive vs the bare host work`,
    "",
    `${r.startedAt}, commit ${r.machine.commit.slice(0, 12)}, ${r.machine.cpus} CPUs shared with other work (load ` +
    `average ${r.machine.loadavg.start} at start, ${r.machine.loadavg.end} at the end), ${r.machine.deno}, ` +
    `${r.machine.ansible}; total ${f(r.wallSeconds, 0)} s.`,
    "",
    "## Deploy and teardown, same files on the same hosts (seconds; SSH round trips / connections)",
    "",
    row(["fleet", "deployer", "deploy s", "teardown s", "deploy SSH rt/conn", "teardown SSH rt/conn"]),
    row(["---", "---", "---:", "---:", "---:", "---:"]),
  ];
  for (const c of r.comparisons) {
    for (const d of [c.ours, c.hostSide, c.ansible, c.naive, c.bare]) {
      lines.push(row([
        c.fleet,
        d.deployer,
        f(d.deploy.seconds),
        f(d.teardown.seconds),
        `${d.deploy.sshRoundTrips} / ${d.deploy.sshConnections}`,
        `${d.teardown.sshRoundTrips} / ${d.teardown.sshConnections}`,
      ]));
    }
  }
  const rt = (x: Ratio) => `deploy ${f(x.deploy)}, teardown ${f(x.teardown)}`;
  lines.push(
    "",
    `Ratios at the largest fleet (target <= 0.25): controller/ansible ${rt(r.ratios.vsAnsible)} (against ansible ` +
      `without its ${f(r.ansibleNoopSeconds)} s no-op start-up: ${rt(r.ratios.vsAnsibleWithoutStartup)}); ` +
      `LabHosts/ansible ${rt(r.ratios.hostSideVsAnsible)}; controller/naive ${rt(r.ratios.vsNaive)}; ` +
      `LabHosts/naive ${rt(r.ratios.hostSideVsNaive)}. The host's own work (bare) against Ansible, the lowest ratio ` +
      `any deployer could reach: ${rt(r.ratios.bareVsAnsible)}; controller/bare ${rt(r.ratios.vsBare)}; ` +
      `LabHosts/bare ${rt(r.ratios.hostSideVsBare)}. SSH connections: as counted by the hosts' sshd.`,
    "",
    "## The controller per fleet size",
    "",
    row([
      "fleet",
      "inst.",
      "deploy s",
      "latency p50/p95 s",
      "apply p50/p95 s",
      "SSH rt/conn",
      "API req",
      "CPU s",
      "teardown s",
      "RSS idle/deployed/peak MiB",
    ]),
    row(["---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:"]),
  );
  for (const c of r.controller) {
    lines.push(row([
      c.fleet,
      c.instances,
      f(c.deploy.seconds),
      `${f(c.instanceLatency.p50)} / ${f(c.instanceLatency.p95)}`,
      `${f(c.applySeconds.p50)} / ${f(c.applySeconds.p95)}`,
      `${c.deploy.sshRoundTrips} / ${c.deploy.sshConnections}`,
      c.deploy.apiRequests,
      f(c.deploy.controllerCpuSeconds),
      f(c.teardown.seconds),
      `${f(c.rssMiB.idle, 0)} / ${f(c.rssMiB.deployed, 0)} / ${f(c.rssMiB.peak, 0)}`,
    ]));
  }
  lines.push(
    "",
    `Latency: Exporter created (bench watch) to both units active on the host; apply: qemu_ssh_deploy_seconds ` +
      `(interpolated in buckets). API requests: ${r.apiRequestsMeasuredAt}.`,
  );
  const steady = r.controller.find((c) => c.steady);
  if (steady?.steady) {
    const s = steady.steady;
    lines.push(
      "",
      `## Steady state (${steady.fleet}, ${f(s.minutes, 1)} min, nothing changing), per minute`,
      "",
      `SSH round trips ${f(s.sshRoundTrips)}, SSH connections ${f(s.sshConnections)}, API requests ` +
        `${f(s.apiRequests)}, controller CPU ${f(s.cpuSeconds, 3)} s.`,
    );
  }
  lines.push(
    "",
    "## Cost per instance: linear fit against the instances measured here",
    "",
    row(["quantity", "per instance", "fixed", "r2"]),
    row(["---", "---:", "---:", "---:"]),
  );
  for (const [k, m] of Object.entries(r.scaleModel)) {
    lines.push(row([k, f(m.slope, 3), f(m.intercept), f(m.r2, 3)]));
  }
  const measured = Math.max(...r.controller.map((c) => c.instances));
  lines.push(
    "",
    `Fitted over at most ${measured} instances, so not projected: \`deno task bench:scale\` measures 50 to 500 ` +
      `hosts and fits its model there (bench/results/scale-findings.md).`,
  );
  lines.push("", ratioLine(r.ratios.vsAnsible), "");
  return lines.join("\n");
}

export const ratioLine = (x: Ratio) =>
  `ratio-vs-ansible deploy=${x.deploy.toFixed(2)} teardown=${x.teardown.toFixed(2)}`;

/**
 * Writes RESULTS_DIR/<mode>.json and .md, each through a .tmp file (ignored by git) and a rename, then formats them
 * as `deno fmt` would (tables aligned), so `deno task check` stays clean with the results committed.
 */
export async function writeResults(r: Results): Promise<string[]> {
  await Deno.mkdir(RESULTS_DIR, { recursive: true });
  const out: string[] = [];
  for (const [ext, text] of [["json", JSON.stringify(r, roundReplacer, 2) + "\n"], ["md", markdown(r)]]) {
    const path = join(RESULTS_DIR, `${r.mode}.${ext}`);
    await Deno.writeTextFile(`${path}.tmp`, await denoFmt(text, ext));
    await Deno.rename(`${path}.tmp`, path);
    out.push(path);
  }
  return out;
}

async function denoFmt(text: string, ext: string): Promise<string> {
  // the project's config, so the file is exactly what `deno fmt --check` expects
  const config = join(import.meta.dirname!, "..", "deno.json");
  const child = new Deno.Command(Deno.execPath(), {
    args: ["fmt", `--config=${config}`, `--ext=${ext}`, "-"],
    stdin: "piped",
    stdout: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode(text));
  await writer.close();
  const out = await child.output();
  if (!out.success) throw new Error(`deno fmt --ext=${ext} failed (exit ${out.code})`);
  return new TextDecoder().decode(out.stdout);
}

/** Three decimals are plenty and keep the committed file small and its diffs readable. */
function roundReplacer(_k: string, v: unknown) {
  return typeof v === "number" ? round(v, 3) : v;
}
