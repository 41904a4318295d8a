/**
 * What must hold after any fault, once the controller has had time to settle:
 *
 * 1. every live Exporter of the set has exactly one instance, on the host it is annotated with (LabHosts.inspect),
 *    with its uid and all its files (two quadlets, the config and its link), and none on any other host;
 * 2. no host has a managed instance of the namespace without an Exporter, after the controller's orphan sweep;
 * 3. no Exporters beyond the set's desired count (none left from an earlier incarnation of the set, none stuck in
 *    deletion);
 * 4. the set's status tells the truth: replicas == live Exporters, readyReplicas == instances with both units active;
 * 5. foreign Exporters (another provisioner's, one owned by a set of a kind this controller does not know) and a
 *    foreign instance's files on every host are byte-for-byte as they were before the first trial;
 * 6. no leased instance was restarted or removed: a second set of ours keeps one Exporter leased as Jumpstarter marks
 *    it, its runtime changes with every trial (pull policy), and its containers are the same ones (pid, start time)
 *    after every trial, unless its host rebooted;
 * 7. another cluster's instances on the same hosts (the two-clusters world) are file for file, unit invocation for
 *    unit invocation, container for container and volume for volume as they were: 0 foreign changes.
 */
import type { Exporter, ExporterSet, KubeObject, VirtualTargetClass } from "../../src/api/types.ts";
import type { HostInspection, InspectedInstance } from "../../src/host/remote.ts";
import { CONFIG_DIR, configPath, ownerLine } from "../../src/host/render.ts";
import { EXPORTER_SETS, EXPORTERS, VIRTUAL_TARGET_CLASSES } from "../../src/kube/resources.ts";
import { HOST_ANNOTATION, ownerSetName } from "../../src/provision/marks.ts";
import { seedExample, waitFor } from "../env.ts";
import type { LabHost } from "../labhost/labhost.ts";
import { directTarget, instanceState, leaseExporter } from "../e2e_world.ts";
import { FaultWorld, type FaultWorldOptions, type Outcome, outcomes, secondsSince, SET, sh, sleep } from "./world.ts";

export interface InvariantReport {
  ok: boolean;
  violations: string[];
  /** Whether the world settled in time (if not, the violations say what was still off). */
  settled: boolean;
  settleSeconds: number;
  /** Instances of the namespace without an Exporter before the sweep, and how many the sweep removed. */
  orphans: number;
  swept: number;
  desired: number;
  live: number;
}

interface View {
  set?: ExporterSet;
  desired: number;
  /** Exporters owned (by name) by the set, any incarnation. */
  all: Exporter[];
  live: Exporter[];
  hosts: Map<string, HostInspection>;
}

const active = (i?: InspectedInstance) => i?.runtime?.active === "active" && i?.exporter?.active === "active";

async function view(w: FaultWorld): Promise<View> {
  const set = await w.set();
  const all = await w.exporters();
  return {
    set,
    desired: w.desired(set),
    all,
    live: all.filter((e) => !e.metadata.deletionTimestamp),
    hosts: await w.inspectAll(),
  };
}

/** Instances of the namespace on any host, with the host's name. */
function ownInstances(w: FaultWorld, v: View): { host: string; inst: InspectedInstance }[] {
  return [...v.hosts].flatMap(([host, insp]) =>
    insp.instances.filter((i) => w.owns(i) && i.set !== LEASED_SET).map((inst) => ({ host, inst }))
  );
}

function orphansOf(w: FaultWorld, v: View): { host: string; inst: InspectedInstance }[] {
  const uids = new Set(v.all.map((e) => e.metadata.uid));
  const names = new Set(v.all.map((e) => e.metadata.name));
  return ownInstances(w, v).filter(({ inst }) => inst.uid ? !uids.has(inst.uid) : !names.has(inst.name));
}

/** Everything that is off right now; empty when all four invariants hold. */
function violationsOf(w: FaultWorld, v: View): string[] {
  const out: string[] = [];
  const own = ownInstances(w, v);
  const setUid = v.set?.metadata.uid;
  // 1. one instance per live Exporter, on its host
  for (const e of v.live) {
    const name = e.metadata.name!;
    const annotated = e.metadata.annotations?.[HOST_ANNOTATION];
    const host = annotated ? w.hostNamed(annotated)?.name : undefined;
    const found = own.filter(({ inst }) => inst.name === name);
    if (!host) out.push(`${name}: no usable ${HOST_ANNOTATION} annotation (${annotated ?? "none"})`);
    if (found.length !== 1) {
      out.push(`${name}: ${found.length} instances (${found.map((f) => f.host).join(", ") || "none"}), want 1`);
      continue;
    }
    const [{ host: on, inst }] = found;
    if (host && on !== host) out.push(`${name}: instance on ${on}, annotated ${annotated} (${host})`);
    if (inst.uid !== e.metadata.uid) out.push(`${name}: instance uid ${inst.uid} != Exporter uid ${e.metadata.uid}`);
    // the two quadlets and the config, which is there twice: in its mounted directory and linked at the top level
    const kinds = inst.files.map((f) => f.kind).sort().join(",");
    if (kinds !== "config,config,exporter,runtime") out.push(`${name}: files on ${on} are [${kinds}]`);
    if (inst.containers.length > 2) out.push(`${name}: ${inst.containers.length} containers on ${on}`);
  }
  // 2. no instance without an Exporter
  for (const { host, inst } of orphansOf(w, v)) {
    out.push(
      `orphan on ${host}: ${inst.name} (uid ${inst.uid ?? "?"}, ${inst.files.length} files, ` +
        `${inst.containers.length} containers, volume ${inst.volume})`,
    );
  }
  // 3. nothing beyond the desired count
  const stale = v.all.filter((e) => !e.metadata.ownerReferences?.some((o) => o.uid === setUid));
  if (stale.length) {
    const running = stale.filter((e) => own.some(({ inst }) => inst.name === e.metadata.name)).length;
    out.push(
      `${stale.length} Exporters of a deleted incarnation of the set remain (` +
        stale.map((e) => `${e.metadata.name}${e.metadata.deletionTimestamp ? " deleting" : ""}`).join(", ") +
        `), ${running} of them still with an instance on a host`,
    );
  }
  const deleting = v.all.filter((e) => e.metadata.deletionTimestamp && !stale.includes(e));
  if (deleting.length) out.push(`stuck in deletion: ${deleting.map((e) => e.metadata.name).join(", ")}`);
  const current = v.live.filter((e) => !stale.includes(e));
  if (current.length !== v.desired) out.push(`${current.length} live Exporters, desired ${v.desired}`);
  // 4. the status tells the truth
  if (v.set) {
    const st = v.set.status;
    const ready = current.filter((e) => active(own.find(({ inst }) => inst.name === e.metadata.name)?.inst)).length;
    if (st?.replicas !== current.length) out.push(`status.replicas ${st?.replicas} != ${current.length} Exporters`);
    if (st?.readyReplicas !== ready) out.push(`status.readyReplicas ${st?.readyReplicas} != ${ready} active instances`);
    if (st?.observedGeneration !== v.set.metadata.generation) {
      out.push(`status.observedGeneration ${st?.observedGeneration} != generation ${v.set.metadata.generation}`);
    }
  }
  return out;
}

/** What keeps the world from being settled (API side first, hosts last); undefined once settled. */
function unsettled(v: View): string | undefined {
  const deleting = v.all.filter((e) => e.metadata.deletionTimestamp);
  if (deleting.length) return `${deleting.length} Exporters being deleted`;
  if (v.live.length !== v.desired) return `${v.live.length} live Exporters, ${v.desired} desired`;
  if (!v.set) return undefined;
  if (v.live.some((e) => e.spec?.enabled === false)) return "an Exporter is draining";
  if (v.live.some((e) => !e.metadata.annotations?.[HOST_ANNOTATION])) return "not every Exporter is deployed";
  const st = v.set.status;
  if (st?.observedGeneration !== v.set.metadata.generation) return "status not yet observed";
  if (st?.replicas !== v.live.length || st?.readyReplicas !== v.live.length) {
    return `status replicas ${st?.replicas} ready ${st?.readyReplicas}, ${v.live.length} Exporters`;
  }
  const insts = [...v.hosts.values()].flatMap((h) => h.instances);
  const down = v.live.filter((e) => !active(insts.find((i) => i.name === e.metadata.name)));
  if (down.length) return `not active on the host: ${down.map((e) => e.metadata.name).join(", ")}`;
  return undefined;
}

/** What keeps the world from being settled right now, or undefined. */
export async function unsettledNow(w: FaultWorld): Promise<string | undefined> {
  return unsettled(await view(w));
}

/**
 * Waits (bounded) for the world to settle, runs the orphan sweep, and checks the invariants; a violation that is
 * only the status lagging one resync behind gets `graceMs` to clear.
 */
export async function checkInvariants(
  w: FaultWorld,
  opts: { settleTimeoutMs?: number; graceMs?: number; stuckMs?: number } = {},
): Promise<InvariantReport> {
  const t0 = performance.now();
  const deadline = Date.now() + (opts.settleTimeoutMs ?? 90_000);
  let v: View | undefined;
  let why: string | undefined = "not looked yet";
  // A state that has not changed at all for stuckMs is not going to settle: stop waiting early.
  let same = { why: "", since: Date.now() };
  for (;;) {
    try {
      v = await view(w);
      why = unsettled(v);
    } catch (e) {
      why = `looking failed: ${e instanceof Error ? e.message : e}`;
    }
    if (why !== same.why) same = { why: why ?? "", since: Date.now() };
    if (!why || Date.now() > deadline || Date.now() - same.since > (opts.stuckMs ?? 60_000)) break;
    await sleep(1_000);
  }
  const settleSeconds = (performance.now() - t0) / 1000;
  const settled = !why;
  let orphans = 0;
  let swept = 0;
  const violations: string[] = [];
  if (!settled) {
    const stuck = Date.now() <= deadline ? ", stuck" : "";
    violations.push(`did not settle in ${settleSeconds.toFixed(0)} s${stuck}: ${why}`);
  }
  try {
    if (v) orphans = orphansOf(w, v).length;
    swept = await w.sweep();
  } catch (e) {
    violations.push(`orphan sweep failed: ${e instanceof Error ? e.message : e}`);
  }
  const graceEnd = Date.now() + (opts.graceMs ?? 15_000);
  let found: string[] = [];
  for (;;) {
    try {
      found = violationsOf(w, await view(w));
    } catch (e) {
      found = [`looking failed: ${e instanceof Error ? e.message : e}`];
    }
    if (found.length === 0 || Date.now() > graceEnd) break;
    await sleep(1_000);
  }
  violations.push(...found);
  return {
    ok: violations.length === 0,
    violations,
    settled,
    settleSeconds,
    orphans,
    swept,
    desired: v?.desired ?? 0,
    live: v?.live.length ?? 0,
  };
}

/**
 * A fault world seeded with the set at 1 (FaultWorld.LOW), its controller started, and the invariants holding before
 * any trial; stopped again (logs kept) if that baseline does not hold.
 */
export async function settledWorld(prefix: string, opts: FaultWorldOptions = {}): Promise<FaultWorld> {
  const w = await FaultWorld.create({ prefix, ...opts });
  try {
    await w.seed((s) => Object.assign(s.spec, FaultWorld.LOW));
    await w.controller.start();
    const base = await checkInvariants(w);
    if (!base.ok) throw new Error(`baseline did not hold: ${base.violations.join("; ")}`);
    return w;
  } catch (e) {
    await w.stop({ keepLogs: true });
    throw e;
  }
}

/** Scenario-specific expectations a trial collects besides the invariants (each failure is a message). */
export class Checks {
  readonly failed: string[] = [];
  expect(ok: unknown, message: string): void {
    if (!ok) this.failed.push(message);
  }
}

export interface TrialResult {
  /** What the fault was and when it hit, for the table. */
  fault: string;
  note?: string;
  /** Runs after the invariants (the world settled): more checks, and a note to add. */
  after?: (checks: Checks) => Promise<string | undefined>;
}

/**
 * Runs one trial: the fault (which may record expectations in `checks`), then the invariants. Records the outcome
 * and prints one line; never throws, so a scenario can run all of its trials and report them together.
 */
export async function trial(
  w: FaultWorld,
  scenario: string,
  name: string,
  fault: (checks: Checks) => Promise<TrialResult>,
  opts: { settleTimeoutMs?: number } = {},
): Promise<Outcome> {
  const t0 = performance.now();
  const checks = new Checks();
  w.resetPeak();
  let result: TrialResult = { fault: "(did not run)" };
  try {
    await seedForeign(w);
    await leaseOne(w);
    result = await fault(checks);
  } catch (e) {
    checks.failed.push(`fault step failed: ${e instanceof Error ? e.message : e}`);
  }
  const r = await checkInvariants(w, opts);
  r.violations.push(...await foreignChanges(w).catch((e) => [`looking at foreign objects failed: ${e}`]));
  r.violations.push(...await disruptedLeases(w).catch((e) => [`looking at the leased instance failed: ${e}`]));
  if (result.after) {
    try {
      const more = await result.after(checks);
      if (more) result.note = result.note ? `${result.note}; ${more}` : more;
    } catch (e) {
      checks.failed.push(`check after settling failed: ${e instanceof Error ? e.message : e}`);
    }
  }
  const problems = [...checks.failed, ...r.violations];
  const o: Outcome = {
    scenario,
    trial: name,
    fault: result.fault,
    ok: problems.length === 0,
    orphans: r.orphans,
    swept: r.swept,
    peak: w.peak,
    desired: r.desired,
    seconds: secondsSince(t0),
    note: problems.length ? problems.join("; ") : result.note,
  };
  outcomes.push(o);
  console.log(
    `  [${scenario}] ${name}: ${o.ok ? "ok" : "FAIL"} (${o.fault}; settled in ${r.settleSeconds.toFixed(1)}s, ` +
      `orphans ${o.orphans}, swept ${o.swept}, peak ${o.peak}/${o.desired}, ${o.seconds.toFixed(1)}s)` +
      (o.note ? `\n      ${o.note}` : ""),
  );
  return o;
}

// ---------------------------------------------------------------- 5. foreign objects

/** The in-cluster qemu provisioner's class, set and Exporter, next to ours in the namespace. */
const FOREIGN_PROVISIONER = "qemu.jumpstarter.dev";
const FOREIGN_SET = "in-cluster-qemu-pool";

/** The name of a foreign instance on the hosts: another namespace's, with its own ownership line. */
export const foreignInstanceName = (ns: string) => `foreign-${ns}`;

/** What the foreign objects were before the first trial: Exporters by name, and each host's files by host. */
const foreignBefore = new WeakMap<FaultWorld, { exporters: Map<string, string>; files: Map<string, string> }>();

/** An Exporter as only its owner may change it: status is Jumpstarter's, resourceVersion follows any write. */
export function ownersPart(e: Exporter): string {
  const { resourceVersion: _rv, managedFields: _mf, ...metadata } = e.metadata as Exporter["metadata"] & {
    managedFields?: unknown;
  };
  return JSON.stringify({ metadata, spec: e.spec });
}

async function foreignExporters(w: FaultWorld): Promise<Map<string, string>> {
  const items = (await w.client.list<Exporter>(EXPORTERS, w.ns)).items;
  const names = new Set(foreignBefore.get(w)?.exporters.keys() ?? [FOREIGN_SET, "unseen-owner"]);
  return new Map(items.filter((e) => names.has(e.metadata.name!)).map((e) => [e.metadata.name!, ownersPart(e)]));
}

async function foreignFiles(w: FaultWorld): Promise<Map<string, string>> {
  const path = configPath(foreignInstanceName(w.ns));
  const out = new Map<string, string>();
  for (const h of w.hosts) out.set(h.name, await sh(h, `sha256sum ${path} 2>&1 || true`));
  return out;
}

/**
 * Once per world, before its first trial: an in-cluster qemu set with an Exporter it owns, an Exporter owned by an
 * ExporterSet of another API group (the controller never sees that set; the garbage collector cannot resolve it and
 * leaves it), and a foreign instance's config file on every host.
 */
async function seedForeign(w: FaultWorld): Promise<void> {
  if (foreignBefore.has(w)) return;
  const cls = await seedExample("virtualtargetclass.yaml", w.ns) as VirtualTargetClass;
  cls.metadata.name = FOREIGN_SET;
  cls.spec.provisioner = FOREIGN_PROVISIONER;
  await w.client.create(VIRTUAL_TARGET_CLASSES, cls as KubeObject);
  const set = await seedExample("exporterset.yaml", w.ns) as ExporterSet;
  set.metadata.name = FOREIGN_SET;
  set.spec.virtualTargetClassName = FOREIGN_SET;
  const created = await w.client.create(EXPORTER_SETS, set as KubeObject) as ExporterSet;
  const owned = (apiVersion: string, name: string, uid: string) => ({
    ownerReferences: [{ apiVersion, kind: "ExporterSet", name, uid, controller: true }],
  });
  for (
    const e of [
      { name: FOREIGN_SET, ...owned(created.apiVersion!, FOREIGN_SET, created.metadata.uid!) },
      { name: "unseen-owner", ...owned("other.example.com/v1", "some-other-set", crypto.randomUUID()) },
    ]
  ) {
    await w.client.create<Exporter>(EXPORTERS, {
      apiVersion: "jumpstarter.dev/v1alpha1",
      kind: "Exporter",
      metadata: { ...e, namespace: w.ns, labels: { board: "foreign" } },
      spec: {},
    });
  }
  const name = foreignInstanceName(w.ns);
  const owner = ownerLine({ namespace: `${w.ns}-elsewhere`, setName: "pool", name, uid: crypto.randomUUID() });
  for (const h of w.hosts) {
    await sh(h, `mkdir -p ${CONFIG_DIR} && printf '%s\\n' '${owner}' 'export: {}' > ${configPath(name)}`);
  }
  foreignBefore.set(w, { exporters: await foreignExporters(w), files: await foreignFiles(w) });
}

/** How the foreign objects differ from before the first trial: none of them is ours to change. */
async function foreignChanges(w: FaultWorld): Promise<string[]> {
  const before = foreignBefore.get(w);
  if (!before) return [];
  const out: string[] = [];
  const [exporters, files] = [await foreignExporters(w), await foreignFiles(w)];
  for (const [name, was] of before.exporters) {
    const now = exporters.get(name);
    if (now !== was) out.push(`foreign Exporter ${name} ${now ? `changed: ${now}` : "is gone"}`);
  }
  for (const [host, was] of before.files) {
    if (files.get(host) !== was) out.push(`foreign instance on ${host} changed: ${files.get(host)}`);
  }
  return out;
}

// ---------------------------------------------------------------- 6. leased instances

/** A set of ours next to the set under test, one Exporter, leased for the whole run (invariant 6). */
const LEASED_SET = `${SET}-leased`;

interface Leased {
  name: string;
  host: LabHost;
  /** Pid and start time of its runtime and exporter containers. */
  identity: string;
  /** When the host's init started: a different one means the host rebooted, which restarts everything on it. */
  boot: string;
}

const leasedBefore = new WeakMap<FaultWorld, Leased>();

const containers = (l: Pick<Leased, "host" | "name">) =>
  sh(l.host, `podman inspect -f '{{.State.Pid}} {{.State.StartedAt}}' ${l.name}-runtime ${l.name}-exporter`);
const bootOf = (host: LabHost) => sh(host, "cut -d' ' -f22 /proc/1/stat");

/** Containers running on the host (both pids set), as they are now. */
const runningIdentity = (l: Pick<Leased, "host" | "name">) =>
  waitFor(async () => {
    const id = await containers(l).catch(() => "");
    return id && !/^0 /m.test(id) ? id : undefined;
  }, { what: `${l.name}'s containers running on ${l.host.name}`, timeoutMs: 120_000 });

/**
 * Once per world, before its first trial: the second set, its Exporter deployed, then leased the way Jumpstarter
 * records it (a Lease whose status names the Exporter, and the Exporter's status.leaseRef). Before every trial: a
 * change of its runtime, which a set without a lease would restart.
 */
async function leaseOne(w: FaultWorld): Promise<void> {
  if (leasedBefore.has(w)) {
    const set = await w.client.get<ExporterSet>(EXPORTER_SETS, w.ns, LEASED_SET);
    const pull = set.spec.images?.runtime?.imagePullPolicy === "Never" ? "IfNotPresent" : "Never";
    await w.client.mergePatch(EXPORTER_SETS, w.ns, LEASED_SET, {
      spec: { images: { runtime: { imagePullPolicy: pull } } },
    });
    return;
  }
  const set = await seedExample("exporterset.yaml", w.ns) as ExporterSet;
  set.metadata.name = LEASED_SET;
  Object.assign(set.spec, { minReplicas: 0, minAvailableReplicas: 1, maxReplicas: 1 });
  await w.client.create(EXPORTER_SETS, set as KubeObject);
  const e = await waitFor(async () => {
    const ready = (await w.client.get<ExporterSet>(EXPORTER_SETS, w.ns, LEASED_SET)).status?.readyReplicas === 1;
    const items = (await w.client.list<Exporter>(EXPORTERS, w.ns)).items;
    return ready ? items.find((x) => ownerSetName(x) === LEASED_SET && !x.metadata.deletionTimestamp) : undefined;
  }, { what: `an Exporter of ${LEASED_SET} deployed`, timeoutMs: 120_000 });
  const name = e.metadata.name!;
  const host = w.hostNamed(e.metadata.annotations![HOST_ANNOTATION])!;
  await leaseExporter(w.client, w.ns, name, { lease: "fault-suite" });
  leasedBefore.set(w, { name, host, identity: await runningIdentity({ name, host }), boot: await bootOf(host) });
}

/** Whether the leased instance still runs the containers it ran before the trial; a reboot starts a new baseline. */
async function disruptedLeases(w: FaultWorld): Promise<string[]> {
  const l = leasedBefore.get(w);
  if (!l) return [];
  const boot = await bootOf(l.host);
  if (boot !== l.boot) {
    leasedBefore.set(w, { ...l, boot, identity: await runningIdentity(l) });
    return [];
  }
  const now = await containers(l).catch((e) => `gone (${e instanceof Error ? e.message : e})`);
  if (now === l.identity) return [];
  // reported once: the trials after it compare with what it became
  leasedBefore.set(w, { ...l, identity: now });
  return [`leased ${l.name} on ${l.host.name} was restarted or removed: ${now.trim()}`];
}

// ---------------------------------------------------------------- 7. another cluster's instances

/**
 * A world's instances on every host as they are now, by host: their names, then instanceState (file digests, unit
 * invocations, container ids and start times, volumes).
 */
export async function clusterSnapshot(w: FaultWorld): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  for (const h of w.hosts) {
    const names = (await w.lab.inspect(await directTarget(h))).instances.filter((i) => w.owns(i)).map((i) => i.name)
      .sort();
    out.set(h.name, names.length ? `instances ${names.join(" ")}\n${await instanceState(h, names)}` : "");
  }
  return out;
}

/** "0 foreign changes": what differs in `other`'s instances from its snapshot `before`, by host; empty if nothing. */
export async function foreignClusterChanges(other: FaultWorld, before: Map<string, string>): Promise<string[]> {
  const now = await clusterSnapshot(other);
  const out: string[] = [];
  for (const [host, was] of before) {
    const is = now.get(host) ?? "";
    if (is === was) continue;
    const [a, b] = [was.split("\n"), is.split("\n")];
    const gone = a.filter((l) => !b.includes(l));
    const added = b.filter((l) => !a.includes(l));
    out.push(
      `cluster ${other.clusterId}'s instances on ${host} changed: was [${gone.join(" | ")}], now [${
        added.join(" | ")
      }]`,
    );
  }
  return out;
}
