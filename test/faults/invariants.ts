/**
 * What must hold after any fault, once the controller has had time to settle:
 *
 * 1. every live Exporter of the set has exactly one instance, on the host it is annotated with (LabHosts.inspect),
 *    with its uid and all its files (two quadlets, the config and its link), and none on any other host;
 * 2. no host has a managed instance of the namespace without an Exporter, after the controller's orphan sweep;
 * 3. no Exporters beyond the set's desired count (none left from an earlier incarnation of the set, none stuck in
 *    deletion);
 * 4. the set's status tells the truth: replicas == live Exporters, readyReplicas == instances with both units active.
 */
import type { Exporter, ExporterSet } from "../../src/api/types.ts";
import type { HostInspection, InspectedInstance } from "../../src/host/remote.ts";
import { HOST_ANNOTATION } from "../../src/provision/marks.ts";
import { type FaultWorld, type Outcome, outcomes, secondsSince, sleep } from "./world.ts";

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
    insp.instances.filter((i) => w.owns(i)).map((inst) => ({ host, inst }))
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
    result = await fault(checks);
  } catch (e) {
    checks.failed.push(`fault step failed: ${e instanceof Error ? e.message : e}`);
  }
  const r = await checkInvariants(w, opts);
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
