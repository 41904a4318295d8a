/**
 * One size of the scale benchmark: the floor (the host scripts straight over open connections), then the controller
 * converging N ExporterSets of M instances applied at once, a steady-state window, and deleting them all.
 */
import { join } from "node:path";
import type { Exporter, ExporterSet, KubeObject } from "../../src/api/types.ts";
import { EXPORTER_SETS, EXPORTERS, NAMESPACES, SECRETS, VIRTUAL_TARGET_CLASSES } from "../../src/kube/resources.ts";
import { startFakeJumpstarter } from "../../test/fake_jumpstarter.ts";
import {
  acceptedConnections,
  hostMemory,
  leftovers,
  type ScaleHost,
  sessions,
  uptime,
} from "../../test/scalehost/scalehost.ts";
import type { Cluster } from "../cluster.ts";
import { labFacts, renderFleet, seedFor } from "../fleet.ts";
import { total } from "../prom.ts";
import { percentile } from "../stats.ts";
import { type FloorResult, measureFloor } from "./floor.ts";
import { type LiveHeap, type ProfileSummary, ScaleController } from "./controller.ts";
import { type CpuReading, cpuSplit, type Grouping, machineBusySeconds, readCpu } from "../proc_cpu.ts";
import { Informer } from "../../src/kube/informer.ts";
import { silentLogger } from "../../src/observe/log.ts";

export interface Phase {
  seconds: number;
  cpuSeconds: number;
  /** The controller's own count (rest_client_requests_total). */
  apiRequests: number;
  /** The same by "METHOD resource", e.g. "PATCH exportersets/status". */
  apiRequestsByCall: Record<string, number>;
  /** Seconds the controller's requests waited for its token bucket, summed (rest_client_rate_limiter_wait_seconds_total). */
  apiRateLimitedSeconds: number;
  /** At the API server (apiserver_request_total, resources, without coordination) minus the bench's and fake's. */
  apiRequestsServerSide: number;
  /** Commands the hosts ran (session-recorder), and the controller's qemu_ssh_command_seconds_count. */
  sshCommands: number;
  sshCommandsMetric: number;
  /** The hosts' commands by the script they ran (apply, inspect, remove, ...). */
  sshCommandsByKind: Record<string, number>;
  /** Connections the hosts' sshd accepted, and the controller's qemu_ssh_connections_opened_total. */
  sshConnections: number;
  sshConnectionsMetric: number;
  reconciles: number;
  /** The whole machine's CPU use over the phase (all processes, other people's too), in cores busy on average. */
  machineCoresBusy: number;
  /** CPU seconds by process group (proc_cpu.ts), and the whole machine's as "machine". */
  cpuByGroup: Record<string, number>;
  profile?: ProfileSummary;
  /** With --profile: the live heap after a full GC at the end of the phase, and what allocated it. */
  heap?: LiveHeap;
}

export interface SizeResult {
  hosts: number;
  perHost: number;
  instances: number;
  floor: FloorResult;
  converge: Phase & {
    /** Seconds from the first create to the last set Available, at percentiles over sets. */
    setAvailable: { p50: number; p95: number; max: number };
    /** Seconds until every Exporter had its credentials from the fake Jumpstarter. */
    credentialsSeconds: number;
    /** Every TIMELINE_EVERY_S seconds from the first create: where the converge's time went. */
    timeline: TimelineSample[];
  };
  steady?: Phase & {
    minutes: number;
    resyncSeconds: number;
    /** Commands per host per resync interval, by script kind. */
    perHostPerResync: Record<string, number>;
    apiRequestsPerMinute: number;
  };
  teardown: Phase & { leftovers: string[] };
  rssMiB: { idle: number; converged: number; peak: number; afterTeardown: number };
  /** The controller isolate's Deno.memoryUsage() (its deno_memory_bytes gauge), MiB: what of the RSS is V8's heap. */
  memoryMiB: Record<"idle" | "converged" | "afterTeardown", Record<string, number>>;
  /** (converged - idle) / instances, KiB. */
  kibPerInstanceAboveIdle: number;
  hostMemory: { pssKiBPerHost: number; tmpfsKiBPerHost: number; processesPerHost: number };
  controllerLog: string;
}

/** Cumulative from the first create; the controller's figures from its metrics. */
export interface TimelineSample {
  t: number;
  /** The whole machine's busy CPU seconds since the first create. */
  busyCoreSeconds: number;
  credentials: number;
  available: number;
  queueDepth: number;
  sshCommands: number;
  apiRequests: number;
}

const TIMELINE_EVERY_S = 5;

interface Snap {
  at: number;
  up: number;
  cpu: number;
  rss: number;
  peak: number;
  memory: Record<string, number>;
  api: number;
  apiByCall: Record<string, number>;
  apiWait: number;
  served: number;
  own: number;
  sshCmds: number;
  sshConns: number;
  reconciles: number;
  accepted: number;
  /** The processes' and the machine's CPU (/proc), read after `at`. */
  machine: CpuReading;
}

export interface RunOptions {
  cluster: Cluster;
  hosts: ScaleHost[];
  perHost: number;
  dir: string;
  steadyMinutes: number;
  resyncSeconds: number;
  profile: boolean;
  /** Extra `deno run` flags for the controller. */
  controllerFlags?: string[];
  /** Extra flags of the controller's `run`, e.g. --max-concurrent-reconciles=100. */
  controllerArgs?: string[];
  /** Skip the floor (its figures are NaN): for experiments on the controller alone. */
  skipFloor?: boolean;
  log: (msg: string) => void;
}

/** Runs `fn` over `items` with at most `n` in flight. */
async function limited<T>(items: T[], n: number, fn: (t: T) => Promise<unknown>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, async () => {
    while (next < items.length) await fn(items[next++]);
  }));
}

/**
 * Polls `check` until it holds. A request that times out while the API server is saturated (the controller under test
 * shares its 2 cores) is a "not yet", counted, not the end of the run.
 */
async function until(what: string, timeoutMs: number, everyMs: number, check: () => Promise<boolean>) {
  const deadline = Date.now() + timeoutMs;
  let busy = 0;
  const checked = () =>
    check().catch((e) => {
      if (!/Timeout|timed out|no complete response/i.test(String(e))) throw e;
      if (busy++ === 0) console.error(`[scale] ${what}: the API server is too busy to answer (${e}); polling on`);
      return false;
    });
  while (!await checked()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs / 1000} s: ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

export async function runSize(o: RunOptions): Promise<SizeResult> {
  const { cluster, hosts, perHost, log } = o;
  const kube = cluster.bench;
  const n = hosts.length;
  const instances = n * perHost;
  const fleet = hosts.map(() => perHost);

  // the programs sharing the cores, for the CPU split of each phase (the controller's once it runs)
  let controllerPid = -1;
  const groupOf: Grouping = (pid, comm) =>
    pid === controllerPid
      ? "controller"
      : pid === Deno.pid
      ? "bench and fake Jumpstarter"
      : comm.startsWith("sshd")
      ? "hosts (sshd and the scripts)"
      : ["kube-apiserver", "etcd", "kube-controller"].includes(comm)
      ? comm
      : "other";

  // ---- floor
  const floorSeed = await seedFor(`floor-${n}`, hosts, fleet);
  const floor: FloorResult = o.skipFloor
    ? {
      deploySeconds: NaN,
      teardownSeconds: NaN,
      deployCommands: 0,
      teardownCommands: 0,
      connectionsDuringPhases: 0,
      hostBusy: 0,
      clientCpu: { deploy: NaN, teardown: NaN },
      cpuByGroup: { deploy: {}, teardown: {} },
    }
    : await measureFloor(renderFleet(floorSeed, fleet, await labFacts(floorSeed.sets[0].host)), groupOf);
  const afterFloor = await leftovers();
  if (afterFloor.length) throw new Error(`floor left instances: ${afterFloor.slice(0, 5).join("; ")}`);
  log(
    `${n}x${perHost}: floor deploy ${floor.deploySeconds.toFixed(1)} s, remove ${
      floor.teardownSeconds.toFixed(1)
    } s (${floor.hostBusy} host-busy retries)`,
  );

  // ---- the controller's world
  const ns = `scale-${n}x${perHost}-${crypto.randomUUID().slice(0, 4)}`;
  const seed = await seedFor(ns, hosts, fleet);
  await kube.create(NAMESPACES, { metadata: { name: ns } });
  await kube.create(SECRETS, seed.secret);
  await kube.create(VIRTUAL_TARGET_CLASSES, seed.cls);
  const fake = startFakeJumpstarter(cluster.jumpstarter, ns);
  const logPath = join(o.dir, `controller-${ns}.log`);
  const controller = await ScaleController.start({
    kubeconfig: cluster.cp.kubeconfigPath,
    namespace: ns,
    logPath,
    args: [
      `--resync=${o.resyncSeconds}`,
      `--sweep-interval=${o.resyncSeconds}`,
      "--log-level=warn",
      ...o.controllerArgs ?? [],
    ],
    inspect: o.profile,
    denoFlags: o.controllerFlags,
  });
  controllerPid = controller.pid;
  const snap = async (): Promise<Snap> => {
    const [proc, m, served, up, accepted] = await Promise.all([
      controller.proc(),
      controller.metrics(),
      cluster.served(),
      uptime(),
      Promise.all(hosts.map(acceptedConnections)).then((a) => a.reduce((x, y) => x + y, 0)),
    ]);
    const at = performance.now();
    // after the clock: /proc of a thousand processes takes a while
    const machine = await readCpu(groupOf);
    return {
      at,
      up,
      cpu: proc.cpuSeconds,
      rss: proc.rssMiB,
      peak: proc.peakRssMiB,
      memory: Object.fromEntries(
        m.filter((x) => x.name === "deno_memory_bytes").map((x) => [x.labels.kind, x.value / 2 ** 20]),
      ),
      api: total(m, "rest_client_requests_total"),
      apiByCall: Object.fromEntries(
        m.filter((x) => x.name === "rest_client_requests_total").map((x) => [
          `${x.labels.method} ${x.labels.resource}`,
          x.value,
        ]),
      ),
      apiWait: total(m, "rest_client_rate_limiter_wait_seconds_total"),
      served,
      own: cluster.ownRequests(),
      sshCmds: total(m, "qemu_ssh_command_seconds_count"),
      sshConns: total(m, "qemu_ssh_connections_opened_total"),
      reconciles: total(m, "controller_runtime_reconcile_total"),
      accepted,
      machine,
    };
  };
  const hostSessions = async (a: Snap, b: Snap) => {
    const per = await Promise.all(
      hosts.map(async (h) => (await sessions(h)).filter((s) => s.at > a.up && s.at <= b.up)),
    );
    return per;
  };
  const byKind = (per: Awaited<ReturnType<typeof hostSessions>>) => {
    const kinds: Record<string, number> = {};
    for (const s of per.flat()) {
      const kind = /: (\w+)$/.exec(s.what)?.[1] ?? /^sh -s # (\w+)$/.exec(s.what)?.[1] ?? "other";
      kinds[kind] = (kinds[kind] ?? 0) + 1;
    }
    return kinds;
  };
  const phase = async (a: Snap, b: Snap): Promise<Phase> => {
    const per = await hostSessions(a, b);
    return {
      seconds: (b.at - a.at) / 1000,
      cpuSeconds: b.cpu - a.cpu,
      apiRequests: b.api - a.api,
      apiRequestsByCall: Object.fromEntries(
        Object.entries(b.apiByCall).map(([k, v]) => [k, v - (a.apiByCall[k] ?? 0)] as const).filter(([, v]) => v > 0),
      ),
      apiRateLimitedSeconds: b.apiWait - a.apiWait,
      apiRequestsServerSide: (b.served - a.served) - (b.own - a.own),
      sshCommands: per.reduce((x, s) => x + s.length, 0),
      sshCommandsMetric: b.sshCmds - a.sshCmds,
      sshCommandsByKind: byKind(per),
      sshConnections: b.accepted - a.accepted,
      sshConnectionsMetric: b.sshConns - a.sshConns,
      reconciles: b.reconciles - a.reconciles,
      machineCoresBusy: ((b.machine.busy - a.machine.busy) / Math.max(1, b.machine.jiffies - a.machine.jiffies)) *
        navigator.hardwareConcurrency,
      cpuByGroup: await cpuSplit(a.machine, b.machine),
    };
  };
  const profilePath = (what: string) => join(o.dir, `${ns}-${what}.cpuprofile`);

  try {
    await new Promise((r) => setTimeout(r, 2000)); // let start-up settle before "idle"
    const s0 = await snap();
    log(`${n}x${perHost}: controller idle RSS ${s0.rss.toFixed(0)} MiB; creating ${n} ExporterSets`);

    // ---- converge
    await controller.startProfile();
    const t0 = performance.now();
    const availableAt = new Map<string, number>();
    let credentialsAt = NaN;
    // Watched, not polled: a list of the sets every second and of the 4000 Exporters every 5 s was API server CPU
    // on the cores the converge is measured on, which the floor does not pay.
    const watching = new AbortController();
    const setsSeen = new Informer<ExporterSet>(kube, EXPORTER_SETS, { namespace: ns, log: silentLogger });
    setsSeen.on((_type, s) => {
      const ok = s.status?.readyReplicas === perHost &&
        s.status?.conditions?.some((c) => c.type === "Available" && c.status === "True");
      if (ok && !availableAt.has(s.metadata.name!)) availableAt.set(s.metadata.name!, (performance.now() - t0) / 1000);
    });
    const watched = setsSeen.run(watching.signal);
    const timeline: TimelineSample[] = [];
    const busy0 = await machineBusySeconds();
    const sample = async () => {
      const m = await controller.metrics();
      timeline.push({
        t: (performance.now() - t0) / 1000,
        busyCoreSeconds: await machineBusySeconds() - busy0,
        credentials: fake.issued,
        available: availableAt.size,
        queueDepth: total(m, "workqueue_depth"),
        sshCommands: total(m, "qemu_ssh_command_seconds_count"),
        apiRequests: total(m, "rest_client_requests_total"),
      });
    };
    await sample();
    await limited(seed.sets, 32, ({ set }) => kube.create(EXPORTER_SETS, set as KubeObject));
    log(`${n}x${perHost}: sets created after ${((performance.now() - t0) / 1000).toFixed(1)} s`);
    // bounded well past the 1.5 x floor target, so that a miss still gets its memory and delete measured
    const deadline = Date.now() + Math.max(1_200_000, instances * 300);
    try {
      for (let tick = 1; availableAt.size < n; tick++) {
        if (Date.now() > deadline) throw new Error(`timed out: ${n}x${perHost}: every ExporterSet Available`);
        await new Promise((r) => setTimeout(r, 1000));
        if (Number.isNaN(credentialsAt) && fake.issued >= instances) credentialsAt = (performance.now() - t0) / 1000;
        if (tick % TIMELINE_EVERY_S === 0) await sample();
      }
      await sample();
    } finally {
      watching.abort();
      await watched;
    }
    const s1 = await snap();
    const convergeProfile = await controller.stopProfile(profilePath("converge"));
    const convergeHeap = await controller.liveHeap();
    const times = [...availableAt.values()];
    const converge = {
      ...await phase(s0, s1),
      profile: convergeProfile,
      heap: convergeHeap,
      setAvailable: { p50: percentile(times, 50), p95: percentile(times, 95), max: Math.max(...times) },
      credentialsSeconds: credentialsAt,
      timeline,
    };
    converge.seconds = (s1.at - t0) / 1000;
    log(
      `${n}x${perHost}: all Available after ${converge.seconds.toFixed(1)} s; CPU ${
        converge.cpuSeconds.toFixed(1)
      } s, RSS ${s1.rss.toFixed(0)} MiB (peak ${s1.peak.toFixed(0)}), ${JSON.stringify(s1.memory)} MiB; SSH commands ${
        JSON.stringify(converge.sshCommandsByKind)
      }`,
    );
    const mem = await hostMemory();

    // ---- steady state
    let steady: SizeResult["steady"];
    if (o.steadyMinutes > 0) {
      log(`${n}x${perHost}: steady state for ${o.steadyMinutes} min (resync ${o.resyncSeconds} s)`);
      const a = await snap();
      await controller.startProfile();
      await new Promise((r) => setTimeout(r, o.steadyMinutes * 60_000));
      const b = await snap();
      const p = await phase(a, b);
      p.profile = await controller.stopProfile(profilePath("steady"));
      p.heap = await controller.liveHeap();
      const intervals = p.seconds / o.resyncSeconds;
      const perResync: Record<string, number> = {};
      for (const [k, v] of Object.entries(p.sshCommandsByKind)) perResync[k] = v / n / intervals;
      perResync.all = p.sshCommands / n / intervals;
      steady = {
        ...p,
        minutes: p.seconds / 60,
        resyncSeconds: o.resyncSeconds,
        perHostPerResync: perResync,
        apiRequestsPerMinute: p.apiRequests / (p.seconds / 60),
      };
      log(`${n}x${perHost}: steady: ${JSON.stringify(perResync)} SSH commands per host per resync`);
    }

    // ---- teardown
    const s2 = await snap();
    await controller.startProfile();
    const t2 = performance.now();
    await limited(seed.sets, 32, ({ set }) => kube.delete(EXPORTER_SETS, ns, set.metadata.name!));
    await until(`${n}x${perHost}: every Exporter gone`, Math.max(1_200_000, instances * 300), 1000, async () => {
      // one item asked for: the API server reads and encodes one, however many are left
      return (await kube.list<Exporter>(EXPORTERS, ns, { limit: "1" })).items.length === 0;
    });
    const s3 = await snap();
    const teardownProfile = await controller.stopProfile(profilePath("teardown"));
    const teardownHeap = await controller.liveHeap();
    const left = await leftovers();
    const teardown = {
      ...await phase(s2, s3),
      seconds: (s3.at - t2) / 1000,
      profile: teardownProfile,
      heap: teardownHeap,
      leftovers: left,
    };
    log(`${n}x${perHost}: all deleted after ${teardown.seconds.toFixed(1)} s; ${left.length} hosts with leftovers`);

    return {
      hosts: n,
      perHost,
      instances,
      floor,
      converge,
      steady,
      teardown,
      rssMiB: { idle: s0.rss, converged: s1.rss, peak: s3.peak, afterTeardown: s3.rss },
      memoryMiB: { idle: s0.memory, converged: s1.memory, afterTeardown: s3.memory },
      kibPerInstanceAboveIdle: ((s1.rss - s0.rss) * 1024) / instances,
      hostMemory: {
        pssKiBPerHost: mem.pssKiB / n,
        tmpfsKiBPerHost: mem.tmpfsKiB / n,
        processesPerHost: mem.processes / n,
      },
      controllerLog: logPath,
    };
  } finally {
    await controller.stop();
    await fake.stop();
  }
}
