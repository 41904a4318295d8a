/**
 * The world of the fault scenarios (test/faults/): a fresh namespace, the seed's Secret, class and set, the
 * FakeJumpstarterController issuing credentials, and the controller as the operator runs it: a SUBPROCESS
 * (`deno run -A main.ts run ...`) that a scenario can SIGKILL and start again. Lab hosts are looked at with the
 * product's own `LabHosts.inspect`, and the product's orphan sweep (`Controller.sweep`) can be called on demand.
 *
 * Every trial a scenario runs is recorded in `outcomes`; faults_test.ts prints them as a table at the end.
 */
import { Buffer } from "node:buffer";
import { freshNamespace, seedExample, type TestEnv, testEnv, waitFor } from "../env.ts";
import { type FakeJumpstarter, startFakeJumpstarter } from "../fake_jumpstarter.ts";
import { directTarget, ourController } from "../e2e_world.ts";
import { readClusterId } from "../../src/run.ts";
import { hostExec, type LabHost } from "../labhost/labhost.ts";
import { KubeClient } from "../../src/kube/client.ts";
import { Informer } from "../../src/kube/informer.ts";
import {
  EVENTS,
  EXPORTER_SETS,
  EXPORTERS,
  NAMESPACES,
  SECRETS,
  VIRTUAL_TARGET_CLASSES,
} from "../../src/kube/resources.ts";
import { controllerIdentity } from "../../src/host/render.ts";
import {
  type Exporter,
  type ExporterSet,
  type ExporterSetSpec,
  type KubeObject,
  PROVISIONER,
  type Secret,
  type VirtualTargetClass,
} from "../../src/api/types.ts";
import { SshPool } from "../../src/host/ssh.ts";
import { LabHosts } from "../../src/host/lab.ts";
import type { HostInspection } from "../../src/host/remote.ts";
import { ownerSetName } from "../../src/provision/marks.ts";
import { desiredCount } from "../../src/provision/plan.ts";
import { silentLogger } from "../../src/observe/log.ts";
import { foreignInstanceName } from "./invariants.ts";

export const SEED_HOST = "lab-host-01.example.com";
export const SECOND_HOST = "lab-host-02.example.com";
export const SET = "aarch64-ssh-pool";
export const CLASS = "qemu-ssh-aarch64";
export const KEY_SECRET = "lab-ssh-key";
const ROOT = new URL("../../", import.meta.url).pathname;

// ---------------------------------------------------------------- outcomes

export interface Outcome {
  scenario: string;
  trial: string;
  /** What the fault hit: e.g. "kill@1.8s mid-work". */
  fault: string;
  ok: boolean;
  /** Orphans on the hosts before the sweep / removed by the sweep. */
  orphans?: number;
  swept?: number;
  /** Most live Exporters of the set seen at once during the trial, and the desired count. */
  peak?: number;
  desired?: number;
  seconds: number;
  note?: string;
}

export const outcomes: Outcome[] = [];

/** The recorded outcomes as a fixed-width table. */
export function outcomeTable(rows: Outcome[] = outcomes): string {
  const head = ["scenario", "trial", "fault", "result", "orphans/swept", "peak/desired", "secs", "note"];
  const body = rows.map((o) => [
    o.scenario,
    o.trial,
    o.fault,
    o.ok ? "ok" : "FAIL",
    o.orphans === undefined ? "-" : `${o.orphans}/${o.swept ?? 0}`,
    o.peak === undefined ? "-" : `${o.peak}/${o.desired ?? "?"}`,
    o.seconds.toFixed(1),
    (o.note ?? "").slice(0, 110),
  ]);
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((r) => r[i].length)));
  const line = (r: string[]) => r.map((c, i) => c.padEnd(widths[i])).join("  ").trimEnd();
  const ok = rows.filter((o) => o.ok).length;
  return [line(head), line(widths.map((w) => "-".repeat(w))), ...body.map(line), `${ok}/${rows.length} trials held`]
    .join("\n");
}

// ---------------------------------------------------------------- small helpers

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
export const randomBetween = (lo: number, hi: number) => lo + Math.random() * (hi - lo);
export const secondsSince = (t0: number) => (performance.now() - t0) / 1000;
export const trialCount = (env: string, fallback: number) => {
  const n = Number(Deno.env.get(env) ?? fallback);
  return Number.isInteger(n) && n > 0 ? n : fallback;
};

export function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = l.addr.port;
  l.close();
  return port;
}

/** Runs a command on a lab host (system ssh client); throws on a non-zero exit. */
export async function sh(host: LabHost, command: string): Promise<string> {
  const r = await hostExec(host, command);
  if (r.code !== 0) throw new Error(`${host.name}: ${command}: exit ${r.code}: ${r.stderr.trim()}`);
  return r.stdout;
}

/** Runs a command on the outer machine; throws on a non-zero exit. */
export async function outer(cmd: string, ...args: string[]): Promise<string> {
  const out = await new Deno.Command(cmd, { args, stdin: "null", stdout: "piped", stderr: "piped" }).output();
  const dec = new TextDecoder();
  if (!out.success) throw new Error(`${cmd} ${args.join(" ")}: exit ${out.code}: ${dec.decode(out.stderr).trim()}`);
  return dec.decode(out.stdout);
}

export const b64 = (s: string): string => Buffer.from(s).toString("base64");

// ---------------------------------------------------------------- the controller as a subprocess

export interface ControllerProcessOptions {
  kubeconfig: string;
  namespace: string;
  hostAliases: Record<string, string>;
  resyncSeconds: number;
  logPath: string;
  logLevel?: string;
  /** --sweep-interval (default: the product's, 300 s). */
  sweepSeconds?: number;
  /** --teardown-grace (default: the product's, 120 s). */
  teardownGraceSeconds?: number;
  /** --cluster-id (default: read from the cluster). */
  clusterId?: string;
}

/** `deno run -A main.ts run ...` with its output appended to a log file; killable and restartable. */
export class ControllerProcess {
  private child: Deno.ChildProcess | undefined;
  private exit: Deno.CommandStatus | undefined;
  starts = 0;
  kills = 0;

  constructor(readonly opts: ControllerProcessOptions) {}

  get running(): boolean {
    return this.child !== undefined && this.exit === undefined;
  }

  /** Starts the controller and waits until its /readyz says the caches are synced. */
  async start(): Promise<void> {
    if (this.running) throw new Error("controller already running");
    const port = freePort();
    const o = this.opts;
    const args = [
      "run",
      "-A",
      "main.ts",
      "run",
      "--kubeconfig",
      o.kubeconfig,
      "--namespace",
      o.namespace,
      ...Object.entries(o.hostAliases).flatMap(([n, a]) => ["--host-alias", `${n}=${a}`]),
      "--resync",
      String(o.resyncSeconds),
      ...(o.sweepSeconds ? ["--sweep-interval", String(o.sweepSeconds)] : []),
      ...(o.teardownGraceSeconds ? ["--teardown-grace", String(o.teardownGraceSeconds)] : []),
      ...(o.clusterId ? ["--cluster-id", o.clusterId] : []),
      `--health-probe-bind-address=127.0.0.1:${port}`,
      "--log-level",
      o.logLevel ?? Deno.env.get("QSP_FAULT_LOG_LEVEL") ?? "info",
    ];
    this.starts++;
    await Deno.writeTextFile(o.logPath, `=== start #${this.starts} ${new Date().toISOString()}\n`, { append: true });
    this.exit = undefined;
    const child = new Deno.Command("sh", {
      args: ["-c", `exec "$@" >>"$QSP_LOG" 2>&1 </dev/null`, "sh", Deno.execPath(), ...args],
      cwd: ROOT,
      env: { QSP_LOG: o.logPath, NO_COLOR: "1" },
      stdin: "null",
      stdout: "null",
      stderr: "null",
    }).spawn();
    this.child = child;
    child.status.then((s) => {
      if (this.child === child) this.exit = s;
    });
    await waitFor(async () => {
      if (this.exit) throw new Error(`controller exited with ${this.exit.code}:\n${await this.logTail()}`);
      const res = await fetch(`http://127.0.0.1:${port}/readyz`).catch(() => undefined);
      await res?.body?.cancel();
      return res?.ok;
    }, { what: "the controller's /readyz", timeoutMs: 90_000, intervalMs: 200 }).catch(async (e) => {
      if (this.exit) throw new Error(`controller exited with ${this.exit.code}:\n${await this.logTail()}`);
      throw e;
    });
  }

  /** SIGKILL: no shutdown code runs, as on an OOM kill or a node loss. */
  async kill(): Promise<void> {
    const child = this.child;
    if (!child || this.exit) return;
    this.kills++;
    await Deno.writeTextFile(this.opts.logPath, `=== SIGKILL ${new Date().toISOString()}\n`, { append: true });
    try {
      Deno.kill(child.pid, "SIGKILL");
    } catch {
      // already gone
    }
    await child.status;
  }

  /** SIGTERM, SIGKILL after 15 s. */
  async stop(): Promise<void> {
    const child = this.child;
    if (!child || this.exit) return;
    try {
      Deno.kill(child.pid, "SIGTERM");
    } catch {
      // already gone
    }
    const timer = setTimeout(() => {
      try {
        Deno.kill(child.pid, "SIGKILL");
      } catch {
        // already gone
      }
    }, 15_000);
    await child.status;
    clearTimeout(timer);
  }

  async logTail(lines = 40): Promise<string> {
    const text = await Deno.readTextFile(this.opts.logPath).catch(() => "");
    return text.trimEnd().split("\n").slice(-lines).join("\n");
  }

  async log(): Promise<string> {
    return await Deno.readTextFile(this.opts.logPath).catch(() => "");
  }
}

// ---------------------------------------------------------------- the world

export interface FaultWorldOptions {
  /** Kubeconfig of the control plane (default: the run's). */
  kubeconfig?: string;
  /** Kubeconfig the controller subprocess uses (default: `kubeconfig`), e.g. one that points at a fault proxy. */
  controllerKubeconfig?: string;
  resyncSeconds?: number;
  prefix?: string;
  /** The namespace to create (default: a fresh name from `prefix`), e.g. the same name in two clusters. */
  namespace?: string;
  sweepSeconds?: number;
  teardownGraceSeconds?: number;
  /** --cluster-id of the controller (default: read from the cluster, as `run` does). */
  clusterId?: string;
}

export class FaultWorld {
  /** Every Exporter name and uid ever seen in the namespace: attributes leftovers that carry no namespace. */
  readonly seenNames = new Set<string>();
  readonly seenUids = new Set<string>();
  /** Most live Exporters of SET seen at once since the last `resetPeak`. */
  peak = 0;
  /** Exporter watch events seen so far: a clock that ticks with the controller's progress. */
  exporterEvents = 0;
  private readonly abort = new AbortController();
  private watchLoop: Promise<void> = Promise.resolve();
  private readonly watcher: Informer<Exporter>;

  private constructor(
    readonly env: TestEnv,
    readonly client: KubeClient,
    readonly ns: string,
    readonly hosts: LabHost[],
    readonly aliases: Record<string, string>,
    readonly fake: FakeJumpstarter,
    readonly pool: SshPool,
    readonly lab: LabHosts,
    readonly controller: ControllerProcess,
    readonly dir: string,
    /** The cluster id the controller names its instances with (its identity: controllerIdentity). */
    readonly clusterId: string,
  ) {
    this.watcher = new Informer<Exporter>(client, EXPORTERS, { namespace: ns, log: silentLogger });
    this.watcher.on(() => {
      this.exporterEvents++;
      const mine = this.watcher.list().filter((e) => ownerSetName(e) === SET);
      for (const e of this.watcher.list()) {
        this.seenNames.add(e.metadata.name!);
        this.seenUids.add(e.metadata.uid!);
      }
      this.peak = Math.max(this.peak, mine.filter((e) => !e.metadata.deletionTimestamp).length);
    });
  }

  static async create(opts: FaultWorldOptions = {}): Promise<FaultWorld> {
    const env = await testEnv();
    const kubeconfig = opts.kubeconfig ?? env.kubeconfig;
    const client = await KubeClient.load(kubeconfig);
    const ns = opts.namespace ?? await freshNamespace(client, opts.prefix ?? "fault");
    if (opts.namespace) await client.create(NAMESPACES, { metadata: { name: ns } });
    const hosts = env.labhosts;
    const aliases = { [SEED_HOST]: hosts[0].address, [SECOND_HOST]: hosts[1].address };
    const dir = await Deno.makeTempDir({ prefix: `qsp-${ns}-` });
    const pool = new SshPool({
      connectTimeoutMs: 5_000,
      backoffBaseMs: 200,
      backoffMaxMs: 2_000,
      commandTimeoutMs: 60_000,
      keepaliveIntervalMs: 2_000,
      keepaliveCountMax: 3,
    });
    const controller = new ControllerProcess({
      kubeconfig: opts.controllerKubeconfig ?? kubeconfig,
      namespace: ns,
      hostAliases: aliases,
      resyncSeconds: opts.resyncSeconds ?? 5,
      logPath: `${dir}/controller.log`,
      sweepSeconds: opts.sweepSeconds,
      teardownGraceSeconds: opts.teardownGraceSeconds,
      clusterId: opts.clusterId,
    });
    const w = new FaultWorld(
      env,
      client,
      ns,
      hosts,
      aliases,
      startFakeJumpstarter(client, ns),
      pool,
      new LabHosts(pool),
      controller,
      dir,
      await readClusterId(client, opts.clusterId),
    );
    w.watchLoop = w.watcher.run(w.abort.signal);
    await w.watcher.synced;
    return w;
  }

  /** What the controller writes into its instances' ownership (render.ts controllerIdentity). */
  get identity(): string {
    return controllerIdentity(this.clusterId, PROVISIONER);
  }

  /** The lab host behind a host name of the class parameters. */
  hostNamed(name: string): LabHost | undefined {
    return this.hosts.find((h) => h.address === this.aliases[name]);
  }

  /** Steps 2 to 4 of the seed, with a short scale-down cooldown and optional edits of the set. */
  async seed(edit: (s: ExporterSet) => void = () => {}): Promise<void> {
    const key = await Deno.readTextFile(this.hosts[0].privateKeyPath);
    await this.client.create<Secret>(SECRETS, {
      metadata: { name: KEY_SECRET, namespace: this.ns },
      type: "Opaque",
      data: { "ssh-privatekey": b64(key) },
    });
    const cls = await seedExample("virtualtargetclass.yaml", this.ns) as VirtualTargetClass;
    await this.client.create(VIRTUAL_TARGET_CLASSES, cls as KubeObject);
    await this.createSet(edit);
  }

  async createSet(edit: (s: ExporterSet) => void = () => {}): Promise<ExporterSet> {
    const set = await seedExample("exporterset.yaml", this.ns) as ExporterSet;
    set.spec.scaleDownCooldown = "1s";
    edit(set);
    return await this.client.create(EXPORTER_SETS, set as KubeObject) as ExporterSet;
  }

  async deleteSet(): Promise<void> {
    await this.client.delete(EXPORTER_SETS, this.ns, SET);
  }

  /** Merge-patches the set's spec (scale up or down). */
  async patchSpec(spec: Partial<ExporterSetSpec>): Promise<void> {
    await this.client.mergePatch(EXPORTER_SETS, this.ns, SET, { spec });
  }

  async set(): Promise<ExporterSet | undefined> {
    return await this.client.find<ExporterSet>(EXPORTER_SETS, this.ns, SET);
  }

  /** The set's spec for 1 exporter (LOW) or 3-4 (HIGH). */
  static readonly LOW = { minReplicas: 0, minAvailableReplicas: 1, maxReplicas: 4 };
  static high() {
    return { minReplicas: 0, minAvailableReplicas: Math.random() < 0.5 ? 3 : 4, maxReplicas: 4 };
  }

  /** Scales the other way: from 1 up to 3-4, or from more down to 1. Returns e.g. "1->3". */
  async toggleScale(): Promise<string> {
    const from = this.desired(await this.set());
    const spec = from > 1 ? FaultWorld.LOW : FaultWorld.high();
    await this.patchSpec(spec);
    return `${from}->${spec.minAvailableReplicas}`;
  }

  /** Waits for a condition of the set to match; returns it. */
  async waitCondition(
    type: string,
    match: (c: { status: string; reason?: string; message?: string }) => boolean,
    timeoutMs: number,
  ): Promise<{ status: string; reason?: string; message?: string }> {
    return await waitFor(async () => {
      const c = (await this.set())?.status?.conditions?.find((x) => x.type === type);
      return c && match(c) ? c : undefined;
    }, { what: `condition ${type} of ${SET}`, timeoutMs, intervalMs: 500 });
  }

  /**
   * Runs a command inside a lab host without SSH (nsenter into its init's namespaces), for when sshd or the network
   * is the fault.
   */
  async inHost(host: LabHost, command: string): Promise<string> {
    const nspawn = (await Deno.readTextFile(`${this.env.labNet.dir}/hosts/${host.name}/nspawn.pid`)).trim();
    const init = (await outer("ps", "-o", "pid=", "--ppid", nspawn)).trim().split(/\s+/)[0];
    if (!init) throw new Error(`${host.name}: no init process under nspawn ${nspawn}`);
    return await outer("nsenter", "-t", init, "-a", "sh", "-c", command);
  }

  /** Exporters of the namespace that belong to SET by owner name (any incarnation of the set). */
  async exporters(): Promise<Exporter[]> {
    return (await this.client.list<Exporter>(EXPORTERS, this.ns)).items.filter((e) => ownerSetName(e) === SET);
  }

  /** The count the set asks for with no leases and no demand (0 when the set is gone). */
  desired(set: ExporterSet | undefined): number {
    return set ? desiredCount(set.spec, 0, 0).desired : 0;
  }

  /** Resolves after `n` more Exporter events, or after `timeoutMs` (the work may need fewer); returns how many. */
  async afterExporterEvents(n: number, timeoutMs: number): Promise<number> {
    const start = this.exporterEvents;
    const deadline = Date.now() + timeoutMs;
    while (this.exporterEvents - start < n && Date.now() < deadline) await sleep(20);
    return this.exporterEvents - start;
  }

  resetPeak(): void {
    this.peak = this.watcher.list().filter((e) => ownerSetName(e) === SET && !e.metadata.deletionTimestamp).length;
  }

  /** `LabHosts.inspect` of every lab host, by host name (h1, h2). */
  async inspectAll(): Promise<Map<string, HostInspection>> {
    const out = new Map<string, HostInspection>();
    for (const h of this.hosts) out.set(h.name, await this.lab.inspect(await directTarget(h)));
    return out;
  }

  /**
   * The product's orphan sweep, once: a Controller of this namespace whose caches are listed (its work queue never
   * starts, so it reconciles nothing), then `sweep()`. Returns how many instances it removed.
   */
  async sweep(): Promise<number> {
    const { controller: ctl, pool } = ourController(this.client, this.ns, this.aliases, {
      pool: { connectTimeoutMs: 5_000, backoffBaseMs: 200, backoffMaxMs: 2_000 },
      // the identity of the controller under test (`run`), or its instances would not be this sweep's to judge
      clusterId: this.clusterId,
    });
    const abort = new AbortController();
    const caches = Object.values(ctl.caches) as Informer<KubeObject>[];
    const loops = caches.map((i) => i.run(abort.signal));
    try {
      await Promise.race([
        Promise.all(caches.map((i) => i.synced)),
        sleep(30_000).then(() => Promise.reject(new Error("sweep: caches did not sync in 30 s"))),
      ]);
      return await ctl.sweep();
    } finally {
      abort.abort();
      await Promise.all(loops);
      await ctl.queue.shutdown();
      await pool.close();
    }
  }

  /** Events of the namespace, newest last. */
  async events(): Promise<{ reason: string; message: string; type: string; involvedObject: { name: string } }[]> {
    const items = (await this.client.list<
      KubeObject & { reason: string; message: string; type: string; involvedObject: { name: string } }
    >(EVENTS, this.ns)).items;
    return items;
  }

  async stop(opts: { keepLogs?: boolean } = {}): Promise<void> {
    await this.controller.stop().catch(() => {});
    this.abort.abort();
    await this.watchLoop;
    await this.fake.stop();
    // Leave the hosts clean for whoever comes next: Exporters and instances of this namespace go.
    await this.purge().catch((e) => console.error(`  cleanup of ${this.ns}: ${e}`));
    await this.pool.close();
    this.client.close();
    if (!opts.keepLogs && !Deno.env.get("QSP_FAULT_KEEP")) await Deno.remove(this.dir, { recursive: true });
    else console.error(`  controller log kept: ${this.controller.opts.logPath}`);
  }

  /**
   * Removes the set, its Exporters (finalizers stripped) and this namespace's instances on the hosts. `setOnly`: only
   * the set under test's, so that a reset after a failed trial keeps the fixtures the invariants compare against
   * (the foreign objects, the leased set), and one failure does not fail every later trial on them.
   */
  async purge(opts: { setOnly?: boolean } = {}): Promise<void> {
    for (const e of (await this.client.list<Exporter>(EXPORTERS, this.ns)).items) {
      if (opts.setOnly && ownerSetName(e) !== SET) continue;
      await this.client.mergePatch(EXPORTERS, this.ns, e.metadata.name!, { metadata: { finalizers: null } })
        .catch(() => {});
      await this.client.delete(EXPORTERS, this.ns, e.metadata.name!).catch(() => {});
    }
    await this.client.delete(EXPORTER_SETS, this.ns, SET).catch(() => {});
    for (const h of this.hosts) {
      const t = await directTarget(h);
      const inspection = await this.lab.inspect(t).catch(() => undefined);
      for (const i of inspection?.instances ?? []) {
        const ours = this.owns(i) && (!opts.setOnly || i.set === SET || i.set === undefined);
        const foreign = !opts.setOnly && i.name === foreignInstanceName(this.ns);
        if (ours || foreign) await this.lab.remove(t, i.name).catch(() => {});
      }
    }
  }

  /**
   * Whether an inspected instance is this world's: its cluster's and namespace's (leftovers without files are told
   * by name or uid). Another cluster's namespace of the same name shares the host in the two-clusters world.
   */
  owns(i: { name: string; namespace?: string; uid?: string; controller?: string }): boolean {
    if (i.controller !== undefined && i.controller !== this.identity) return false;
    if (i.namespace !== undefined) return i.namespace === this.ns;
    return (i.uid !== undefined && this.seenUids.has(i.uid)) || this.seenNames.has(i.name);
  }
}

/** The outer (bridge) side of a lab host's veth, found among the bridge's ports. */
export async function outerVeth(bridge: string, host: LabHost): Promise<string> {
  const id = `${bridge}-${host.name}`;
  const expected = id.length <= 13
    ? `v-${id}`
    : `v-${(await outer("sh", "-c", `printf %s '${id}' | md5sum`)).slice(0, 13)}`;
  const ports = (await outer("ip", "-o", "link", "show", "master", bridge)).split("\n")
    .map((l) => /^\d+:\s+([^:@\s]+)/.exec(l)?.[1]).filter((n): n is string => !!n);
  if (!ports.includes(expected)) {
    throw new Error(`no port ${expected} on bridge ${bridge} (ports: ${ports.join(", ")})`);
  }
  return expected;
}
