/**
 * `deno task bench:scale [--hosts N] [--per-host M] [--sizes 50,100,250,500] [--steady-minutes S] [--resync SEC]
 * [--profile] [--out NAME] [--controller-flags=FLAGS] [--controller-args=ARGS] [--skip-floor]`: issue 12's scale world. N cheap lab
 * hosts (test/scalehost: one real OpenSSH sshd per address in network namespace qspscale, 10.90.0.0/16, the project's
 * host scripts run by sh, systemd/Podman replaced by recording fakes), a private control plane with its garbage
 * collector (bench/cluster.ts), the fake Jumpstarter, and the controller run as in production. Per size: the floor
 * (the same scripts straight over open connections), converge of N ExporterSets x M instances created at once, a
 * steady-state window (largest size only), delete-all with a leftover check on every host. Results:
 * bench/results/scale.{json,md}; progress on stderr; the last line on stdout:
 * `scale hosts=N instances=K converge=Xs floor=Fs teardown=Ys rss-peak=ZMiB cpu=Cs ssh-connections=S`.
 * --profile: V8 CPU profiles of every phase, with the controller's command line on the main thread
 * (bench/scale/entry.ts) instead of main.ts's Worker; write those runs with --out scale-profile.
 *
 * Everything started is stopped on the way out, also on failure and on SIGINT/SIGTERM. Every wait is bounded.
 */
import { parseArgs } from "node:util";
import { join } from "node:path";
import { startCluster } from "./cluster.ts";
import { scaleLine, type ScaleResults, writeScaleResults } from "./scale/report.ts";
import { runSize, type SizeResult } from "./scale/run.ts";
import { liveControllers } from "./scale/controller.ts";
import { hostMemory, startScaleHosts, stopScaleHosts } from "../test/scalehost/scalehost.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    hosts: { type: "string", default: "500" },
    "per-host": { type: "string", default: "8" },
    sizes: { type: "string" },
    "steady-minutes": { type: "string", default: "3" },
    resync: { type: "string", default: "60" },
    profile: { type: "boolean", default: false },
    out: { type: "string", default: "scale" },
    "controller-flags": { type: "string", default: "" },
    "controller-args": { type: "string", default: "" },
    "skip-floor": { type: "boolean", default: false },
    "keep-dir": { type: "boolean", default: false },
  },
});
const hostsMax = Number(values.hosts);
const perHost = Number(values["per-host"]);
const sizes = (values.sizes ?? String(hostsMax)).split(",").map(Number).sort((a, b) => a - b);
if (sizes.some((s) => !Number.isInteger(s) || s < 1 || s > 2000) || !(perHost >= 1 && perHost <= 64)) {
  console.error("usage: bench:scale [--hosts 1..2000] [--per-host 1..64] [--sizes a,b,c] [--steady-minutes S]");
  Deno.exit(2);
}
const t0 = performance.now();
const log = (msg: string) => console.error(`[scale ${((performance.now() - t0) / 1000).toFixed(0)}s] ${msg}`);
const loadavg = async () => (await Deno.readTextFile("/proc/loadavg")).split(" ").slice(0, 3).join(" ");
const git = async (...args: string[]) =>
  new TextDecoder().decode(
    (await new Deno.Command("git", { args, stdout: "piped", stderr: "null" }).output()).stdout,
  ).trim();

const dir = await Deno.makeTempDir({ prefix: "qsp-scale-bench-" });
const cleanup: (() => Promise<void>)[] = [];
let cleaning: Promise<void> | undefined;
const runCleanup = () =>
  cleaning ??= (async () => {
    await Promise.all([...liveControllers].map((c) => c.stop().catch((e) => log(`cleanup: ${e}`))));
    for (const step of cleanup.reverse()) await step().catch((e) => log(`cleanup: ${e}`));
  })();
for (const sig of ["SIGINT", "SIGTERM"] as const) {
  Deno.addSignalListener(sig, async () => {
    log(`${sig}: cleaning up`);
    await runCleanup();
    Deno.exit(130);
  });
}

const startedAt = new Date().toISOString();
const loadStart = await loadavg();
const results: SizeResult[] = [];
const hostStartSeconds: Record<number, number> = {};
const idleHostMemory: Record<number, Awaited<ReturnType<typeof hostMemory>>> = {};
let failure: unknown;
try {
  await stopScaleHosts(); // leftovers of an interrupted run
  cleanup.push(stopScaleHosts);
  const cluster = await startCluster(join(dir, "controlplane"));
  cleanup.push(() => cluster.stop());
  log(`control plane ready at ${cluster.cp.server}; work dir ${dir}`);
  for (const [i, n] of sizes.entries()) {
    const last = i === sizes.length - 1;
    const ts = performance.now();
    const hosts = await startScaleHosts(n);
    hostStartSeconds[n] = (performance.now() - ts) / 1000;
    idleHostMemory[n] = await hostMemory();
    log(`${n} scale hosts up in ${hostStartSeconds[n].toFixed(1)} s (${JSON.stringify(idleHostMemory[n])})`);
    try {
      results.push(
        await runSize({
          cluster,
          hosts,
          perHost,
          dir,
          steadyMinutes: last ? Number(values["steady-minutes"]) : 0,
          resyncSeconds: Number(values.resync),
          profile: values.profile,
          controllerFlags: values["controller-flags"].split(" ").filter((x) => x),
          controllerArgs: values["controller-args"].split(" ").filter((x) => x),
          skipFloor: values["skip-floor"],
          log,
        }),
      );
    } finally {
      await stopScaleHosts();
    }
  }
} catch (e) {
  failure = e;
  log(`FAILED: ${e instanceof Error ? e.stack : e}`);
} finally {
  await runCleanup();
}

if (results.length) {
  const r: ScaleResults = {
    startedAt,
    wallSeconds: (performance.now() - t0) / 1000,
    machine: {
      cpus: navigator.hardwareConcurrency,
      loadavg: { start: loadStart, end: await loadavg() },
      commit: await git("rev-parse", "HEAD"),
      dirty: (await git("status", "--porcelain", "--", "src", "main.ts")).length > 0,
      deno: `deno ${Deno.version.deno}`,
    },
    perHost,
    entry:
      (values.profile ? "bench/scale/entry.ts (main thread, inspector on)" : "main.ts (Worker, as in production)") +
      (values["controller-flags"] ? ` with ${values["controller-flags"]}` : "") +
      (values["controller-args"] ? `, run ${values["controller-args"]}` : ""),
    resyncSeconds: Number(values.resync),
    hostStartSeconds,
    idleHostMemory,
    sizes: results,
    failed: failure ? String(failure) : undefined,
  };
  const files = await writeScaleResults(r, values.out);
  log(`results: ${files.join(", ")}`);
  if (!values["keep-dir"] && !failure) await Deno.remove(dir, { recursive: true }).catch(() => {});
  else log(`kept ${dir} (controller logs, CPU profiles)`);
  console.log(scaleLine(results[results.length - 1]));
}
if (failure) Deno.exit(1);
