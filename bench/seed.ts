/**
 * `deno task bench:seed`: the feature description's Secret, VirtualTargetClass and ExporterSet, as written, on an idle
 * sandbox (one lab host), TRIALS times, each in a fresh namespace with a fresh controller process. Reports, as medians:
 * the controller's start-up time to /readyz and idle RSS, the time from applying the ExporterSet to its
 * minAvailableReplicas instances ready, and the API requests and SSH round trips (and connections) the controller
 * spent on it (its own rest_client_requests_total and qemu_ssh_command_seconds_count).
 */
import { join } from "node:path";
import { Buffer } from "node:buffer";
import { seedExample, waitFor } from "../test/env.ts";
import { startFakeJumpstarter } from "../test/fake_jumpstarter.ts";
import { type LabNet, startLabHosts, stopLabHosts } from "../test/labhost/labhost.ts";
import type { Exporter, ExporterSet, KubeObject } from "../src/api/types.ts";
import { EXPORTER_SETS, EXPORTERS, NAMESPACES, SECRETS, VIRTUAL_TARGET_CLASSES } from "../src/kube/resources.ts";
import { startCluster } from "./cluster.ts";
import { ControllerProcess, logPath } from "./controller.ts";
import { total } from "./prom.ts";
import { percentile, round } from "./stats.ts";
import { RESULTS_DIR } from "./report.ts";

const TRIALS = Number(Deno.env.get("TRIALS") ?? 5);
const LAB: LabNet = { dir: "/tmp/qsp-bench-seed-lab", bridge: "qsplabs", subnet: "10.91.0" };
const SEED_HOST = "lab-host-01.example.com";

interface Trial {
  startupMs: number;
  idleRssMiB: number;
  seedToReadySeconds: number;
  apiRequests: number;
  sshRoundTrips: number;
  sshConnections: number;
}

const dir = await Deno.makeTempDir({ prefix: "qsp-bench-seed-" });
const cluster = await startCluster(join(dir, "cp"));
const trials: Trial[] = [];
try {
  const [host] = await startLabHosts(LAB, 1);
  const key = Buffer.from(await Deno.readTextFile(host.privateKeyPath)).toString("base64");
  const fake = startFakeJumpstarter(cluster.jumpstarter);
  try {
    for (let i = 1; i <= TRIALS; i++) {
      const ns = `seed-${i}`;
      const c = cluster.bench;
      await c.create(NAMESPACES, { metadata: { name: ns } });
      await c.create(
        SECRETS,
        { metadata: { name: "lab-ssh-key", namespace: ns }, data: { "ssh-privatekey": key } } as KubeObject,
      );
      await c.create(VIRTUAL_TARGET_CLASSES, await seedExample("virtualtargetclass.yaml", ns));
      const t0 = performance.now();
      const controller = await ControllerProcess.start({
        kubeconfig: cluster.cp.kubeconfigPath,
        namespace: ns,
        logPath: logPath(dir, ns),
        args: [`--host-alias=${SEED_HOST}=${host.address}`],
      });
      try {
        const startupMs = performance.now() - t0;
        const idle = await controller.proc();
        const before = await controller.metrics();
        const t1 = performance.now();
        await c.create(EXPORTER_SETS, await seedExample("exporterset.yaml", ns));
        await waitFor(async () => {
          const s = await c.get<ExporterSet>(EXPORTER_SETS, ns, "aarch64-ssh-pool");
          return (s.status?.readyReplicas ?? 0) >= (s.spec.minAvailableReplicas ?? 0) &&
            s.status?.conditions?.some((x) => x.type === "Available" && x.status === "True");
        }, { what: `${ns}: the seed's set Available`, timeoutMs: 120_000, intervalMs: 50 });
        const seedToReady = (performance.now() - t1) / 1000;
        const after = await controller.metrics();
        const delta = (name: string) => total(after, name) - total(before, name);
        trials.push({
          startupMs,
          idleRssMiB: idle.rssMiB,
          seedToReadySeconds: seedToReady,
          apiRequests: delta("rest_client_requests_total"),
          sshRoundTrips: delta("qemu_ssh_command_seconds_count"),
          sshConnections: delta("qemu_ssh_connections_opened_total"),
        });
        console.log(`trial ${i}: ${JSON.stringify(trials.at(-1), (_k, v) => typeof v === "number" ? round(v) : v)}`);
        await c.delete(EXPORTER_SETS, ns, "aarch64-ssh-pool");
        await waitFor(async () => (await c.list<Exporter>(EXPORTERS, ns)).items.length === 0, {
          what: `${ns}: torn down`,
          timeoutMs: 60_000,
        });
      } catch (e) {
        console.error(`controller log:\n${(await Deno.readTextFile(logPath(dir, ns)).catch(() => "")).slice(-3000)}`);
        const s = await cluster.bench.get<ExporterSet>(EXPORTER_SETS, ns, "aarch64-ssh-pool").catch(() => undefined);
        console.error(`status: ${JSON.stringify(s?.status)}`);
        throw e;
      } finally {
        await controller.stop();
      }
    }
  } finally {
    await fake.stop();
  }
} finally {
  await stopLabHosts(LAB).catch((e) => console.error(`stopping lab hosts: ${e}`));
  await cluster.stop();
  await Deno.remove(dir, { recursive: true }).catch(() => {});
}

const median = (k: keyof Trial) => round(percentile(trials.map((t) => t[k]), 50));
const summary = Object.fromEntries((Object.keys(trials[0]) as (keyof Trial)[]).map((k) => [k, median(k)]));
const md = [
  `# The seed's ExporterSet on an idle sandbox (${TRIALS} trials, medians)`,
  "",
  "| controller start to ready ms | idle RSS MiB | ExporterSet applied to ready s | API requests | SSH round trips | SSH connections |",
  "|--:|--:|--:|--:|--:|--:|",
  `| ${summary.startupMs} | ${summary.idleRssMiB} | ${summary.seedToReadySeconds} | ${summary.apiRequests} | ` +
  `${summary.sshRoundTrips} | ${summary.sshConnections} |`,
  "",
].join("\n");
await Deno.writeTextFile(join(RESULTS_DIR, "seed.json"), JSON.stringify({ trials, median: summary }, null, 2) + "\n");
await Deno.writeTextFile(join(RESULTS_DIR, "seed.md"), md);
console.log(md);
