/**
 * Ours end to end: the controller process (bench/controller.ts) in a fresh namespace, the FakeJumpstarterController
 * issuing credentials, one ExporterSet per host. Deploy is timed from the sets' creation until the bench's watch sees
 * every set report all its replicas ready, so it includes the control plane's share (Exporter creation, credentials,
 * watches, status writes); teardown from the sets' deletion until the watch sees every Exporter gone (each finalizer
 * is dropped only after its instance was removed from the host).
 */
import { startFakeJumpstarter } from "../test/fake_jumpstarter.ts";
import type { LabHost } from "../test/labhost/labhost.ts";
import type { Exporter, ExporterSet, KubeObject } from "../src/api/types.ts";
import { Informer } from "../src/kube/informer.ts";
import { EXPORTER_SETS, EXPORTERS, NAMESPACES, SECRETS, VIRTUAL_TARGET_CLASSES } from "../src/kube/resources.ts";
import { silentLogger } from "../src/observe/log.ts";
import { SET_LABEL } from "../src/provision/marks.ts";
import type { Cluster } from "./cluster.ts";
import { ControllerProcess, logPath, type ProcSample } from "./controller.ts";
import { type Fleet, fleetLabel, instanceCount, type Seed, seedFor } from "./fleet.ts";
import type { HostProbe } from "./hosts.ts";
import { histogram, histogramDelta, histogramQuantile, type Sample, total } from "./prom.ts";
import { percentile } from "./stats.ts";

/** Everything counted at one moment; phases are differences of two. */
interface Snapshot {
  at: number;
  proc: ProcSample;
  metrics: Sample[];
  served: number;
  own: number;
}

export interface PhaseCost {
  seconds: number;
  controllerCpuSeconds: number;
  sshRoundTrips: number;
  /** Accepted by the hosts' sshd (see HostProbe.sshLogins). */
  sshConnections: number;
  /** The controller's own qemu_ssh_connections_opened_total, for comparison with what the hosts saw. */
  sshConnectionsMetric: number;
  /** Requests the controller made to the API server (see cluster.ts for how they are told apart). */
  apiRequests: number;
  reconciles: number;
}

export interface ControllerRun {
  fleet: string;
  hosts: number;
  instances: number;
  deploy: PhaseCost;
  teardown: PhaseCost;
  /** Exporter creation (seen by the bench's watch) to both units active on the host, seconds. */
  instanceLatency: { p50: number; p95: number; max: number };
  /** qemu_ssh_deploy_seconds: one apply on the host, seconds, interpolated within histogram buckets. */
  applySeconds: { p50: number; p95: number; mean: number };
  rssMiB: { idle: number; deployed: number; peak: number };
  /** Per minute with nothing changing, measured over `minutes` after the deploy. */
  steady?: { minutes: number; sshRoundTrips: number; sshConnections: number; apiRequests: number; cpuSeconds: number };
}

const SSH_CMDS = "qemu_ssh_command_seconds_count";
const SSH_CONNS = "qemu_ssh_connections_opened_total";
const RECONCILES = "controller_runtime_reconcile_total";

async function cost(probe: HostProbe, hosts: LabHost[], a: Snapshot, b: Snapshot): Promise<PhaseCost> {
  const d = (name: string) => total(b.metrics, name) - total(a.metrics, name);
  return {
    seconds: (b.at - a.at) / 1000,
    controllerCpuSeconds: b.proc.cpuSeconds - a.proc.cpuSeconds,
    sshRoundTrips: d(SSH_CMDS),
    sshConnections: await probe.sshLogins(hosts, a.at, b.at),
    sshConnectionsMetric: d(SSH_CONNS),
    apiRequests: (b.served - a.served) - (b.own - a.own),
    reconciles: d(RECONCILES),
  };
}

export async function runController(
  opts: { cluster: Cluster; lab: LabHost[]; probe: HostProbe; dir: string; steadyMinutes?: number },
  fleet: Fleet,
): Promise<ControllerRun> {
  const { cluster, probe } = opts;
  const kube = cluster.bench;
  const ns = `bench-n${instanceCount(fleet)}-${crypto.randomUUID().slice(0, 6)}`;
  const hosts = opts.lab.slice(0, fleet.length);
  const seed = await seedFor(ns, hosts, fleet);
  await kube.create(NAMESPACES, { metadata: { name: ns } });
  await kube.create(SECRETS, seed.secret);
  await kube.create(VIRTUAL_TARGET_CLASSES, seed.cls);

  const fake = startFakeJumpstarter(cluster.jumpstarter, ns);
  const abort = new AbortController();
  const exporters = new Informer<Exporter>(kube, EXPORTERS, { namespace: ns, log: silentLogger });
  const created = new Map<string, number>();
  exporters.on((type, e) =>
    type === "ADDED" && !created.has(e.metadata.name!) && created.set(e.metadata.name!, Date.now())
  );
  const sets = new Informer<ExporterSet>(kube, EXPORTER_SETS, { namespace: ns, log: silentLogger });
  const watching = Promise.all([exporters.run(abort.signal), sets.run(abort.signal)]);
  await Promise.all([exporters.synced, sets.synced]);

  const controller = await ControllerProcess.start({
    kubeconfig: cluster.cp.kubeconfigPath,
    namespace: ns,
    logPath: logPath(opts.dir, ns),
  });
  const snap = async (): Promise<Snapshot> => {
    const [proc, metrics, served] = await Promise.all([controller.proc(), controller.metrics(), cluster.served()]);
    return { at: Date.now(), proc, metrics, served, own: cluster.ownRequests() };
  };
  try {
    const s0 = await snap();
    await Promise.all(seed.sets.map(({ set }) => kube.create(EXPORTER_SETS, set as KubeObject)));
    await watchedUntil(
      sets,
      () => allReady(seed, sets.list(ns)),
      `${fleetLabel(fleet)}: every ExporterSet ready`,
      120_000 + 10_000 * instanceCount(fleet),
    );
    const s1 = await snap();
    const latencies = await instanceLatencies(probe, seed, exporters.list(ns), created);
    const applied = histogramDelta(
      histogram(s1.metrics, "qemu_ssh_deploy_seconds"),
      histogram(s0.metrics, "qemu_ssh_deploy_seconds"),
    );

    let steady: ControllerRun["steady"];
    if (opts.steadyMinutes) {
      console.error(`[bench] ${fleetLabel(fleet)}: steady state for ${opts.steadyMinutes} min`);
      const a = await snap();
      await new Promise((r) => setTimeout(r, opts.steadyMinutes! * 60_000));
      const c = await cost(probe, hosts, a, await snap());
      const perMin = (v: number) => v / (c.seconds / 60);
      steady = {
        minutes: c.seconds / 60,
        sshRoundTrips: perMin(c.sshRoundTrips),
        sshConnections: perMin(c.sshConnections),
        apiRequests: perMin(c.apiRequests),
        cpuSeconds: perMin(c.controllerCpuSeconds),
      };
    }

    const s2 = await snap();
    await Promise.all(seed.sets.map(({ set }) => kube.delete(EXPORTER_SETS, ns, set.metadata.name!)));
    await watchedUntil(
      exporters,
      () => exporters.list(ns).length === 0,
      `${fleetLabel(fleet)}: every Exporter gone`,
      120_000 + 5_000 * instanceCount(fleet),
    );
    const s3 = await snap();
    await probe.assertClean(hosts, "controller teardown");
    return {
      fleet: fleetLabel(fleet),
      hosts: hosts.length,
      instances: instanceCount(fleet),
      deploy: await cost(probe, hosts, s0, s1),
      teardown: await cost(probe, hosts, s2, s3),
      instanceLatency: { p50: percentile(latencies, 50), p95: percentile(latencies, 95), max: Math.max(...latencies) },
      applySeconds: {
        p50: histogramQuantile(0.5, applied),
        p95: histogramQuantile(0.95, applied),
        mean: applied.sum / applied.count,
      },
      rssMiB: { idle: s0.proc.rssMiB, deployed: s1.proc.rssMiB, peak: s3.proc.peakRssMiB },
      steady,
    };
  } finally {
    await controller.stop();
    abort.abort();
    await watching;
    await fake.stop();
  }
}

/**
 * Resolves once `done` holds, tested at each event of the watch: the moment the bench can know it, as a deployer's
 * own end is for the others (a list polled every 200 ms added 100 ms on average, up to 200, to each phase).
 */
function watchedUntil<T extends KubeObject>(
  informer: Informer<T>,
  done: () => boolean,
  what: string,
  timeoutMs: number,
): Promise<void> {
  return new Promise((resolve, reject) => {
    let over = false;
    const timer = setTimeout(() => {
      over = true;
      reject(new Error(`timed out waiting for ${what}`));
    }, timeoutMs);
    const test = () => {
      if (over || !done()) return;
      over = true;
      clearTimeout(timer);
      resolve();
    };
    informer.on(test);
    test();
  });
}

function allReady(seed: Seed, sets: ExporterSet[]): boolean {
  return seed.sets.every(({ set }) => {
    const s = sets.find((x) => x.metadata.name === set.metadata.name)?.status;
    const want = set.spec.minReplicas;
    return s?.replicas === want && s?.readyReplicas === want;
  });
}

/** Seconds from each Exporter's creation to its instance's units both active on its host. */
async function instanceLatencies(
  probe: HostProbe,
  seed: Seed,
  exporters: Exporter[],
  created: Map<string, number>,
): Promise<number[]> {
  const perHost = await Promise.all(seed.sets.map(async ({ host, set }) => {
    const names = exporters.filter((e) => e.metadata.labels?.[SET_LABEL] === set.metadata.name).map((e) =>
      e.metadata.name!
    );
    const ready = await probe.readyTimes(host, names);
    return names.map((n) => {
      const [c, r] = [created.get(n), ready.get(n)];
      if (c === undefined || r === undefined) throw new Error(`no creation or ready time for exporter ${n}`);
      return (r - c) / 1000;
    });
  }));
  return perHost.flat();
}
