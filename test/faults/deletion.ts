/**
 * Deletion orders under faults (issue 18): on a control plane of the scenario's own, whose kube-controller-manager
 * runs the real garbage collector and namespace controller (and with API Priority and Fairness on, for the 429
 * storm), each trial seeds a fresh namespace (the seed's Secret, class and set at 2, both instances on the seed's
 * host), then deletes it in one of the orders of test/deletion_orders.ts (those of test/e2e_deletion_test.ts) picked
 * at random, while a random fault hits the teardown: the controller SIGKILLed mid-teardown and started again, the host
 * unreachable for a few seconds, the host unreachable past --teardown-grace, or a 429 storm on the controller's
 * requests.
 *
 * Invariant: 0 finalizers stuck past the bound. No Exporter holds our finalizer longer than --teardown-grace plus
 * SLACK_S after its deletion, and both instances are gone from the host at the end. Where the host was unreachable
 * past the grace, the controller must have given the teardown up with a TeardownAbandoned Warning and its sweep of the
 * remembered host must have cleaned it once the host was back (also when the class or the namespace went, and with
 * them every other way to know the host).
 */
import { startControlPlane } from "../controlplane/controlplane.ts";
import { installCrdsAt, waitFor } from "../env.ts";
import { ApfStorm, impersonatingKubeconfig } from "../apf_storm.ts";
import { DELETION_ORDERS, type DeletionOrder } from "../deletion_orders.ts";
import { directTarget, hostHas, plugIn, unplug } from "../e2e_world.ts";
import { KubeClient } from "../../src/kube/client.ts";
import { EXPORTERS, NAMESPACES } from "../../src/kube/resources.ts";
import type { Exporter } from "../../src/api/types.ts";
import { FINALIZER } from "../../src/provision/marks.ts";
import { checkInvariants } from "./invariants.ts";
import { FaultWorld, type Outcome, outcomes, randomBetween, secondsSince, SEED_HOST, sleep } from "./world.ts";

/** --teardown-grace of the trials: short, so the past-the-grace fault ends soon. */
const GRACE_S = 20;
/**
 * How much longer than the grace a finalizer may be seen: the controller acts on the grace at its next reconcile of
 * the Exporter (a requeue at the grace's end, or the 5 s resync), which a SIGKILL delays by the restart (up to ~15 s
 * for `deno run` on a loaded 2-core machine) and a 429 storm by its Retry-After backlog; and this test sees the
 * finalizer go only at its next poll of the API (0.5 s).
 */
const SLACK_S = 30;
const SWEEP_SECONDS = 2;
/** What the controller logs as it gives a teardown up (teardown.ts abandon). */
const DROPPED = "dropping a finalizer without teardown";
const REPLICAS = 2;
/** How long the host is unreachable in the brief case: well within the grace. */
const BRIEF_MS = 8_000;

type Fault = "controller SIGKILL mid-teardown" | "host unreachable briefly" | "host unreachable past the grace" | "429";
const FAULTS: Fault[] = [
  "controller SIGKILL mid-teardown",
  "host unreachable briefly",
  "host unreachable past the grace",
  "429",
];

/**
 * A random one of `xs`, among those whose name contains the environment variable `env` when it is set (to run again
 * the combination a failed trial drew, e.g. QSP_FAULT_DELETION_ORDER="delete -f" QSP_FAULT_DELETION_FAULT=past).
 */
function pick<T>(xs: T[], env: string, name: (x: T) => string): T {
  const only = Deno.env.get(env);
  const from = only ? xs.filter((x) => name(x).includes(only)) : xs;
  if (from.length === 0) throw new Error(`${env}=${only} matches none of: ${xs.map(name).join("; ")}`);
  return from[Math.floor(Math.random() * from.length)];
}

export async function deletionScenario(trials: number, stormMs: number): Promise<Outcome[]> {
  const dir = await Deno.makeTempDir({ prefix: "qsp-faults-deletion-" });
  const cp = await startControlPlane({ dir: `${dir}/controlplane`, setup: installCrdsAt, priorityAndFairness: true });
  const admin = await KubeClient.load(cp.kubeconfigPath);
  let storm: ApfStorm | undefined;
  let probe: KubeClient | undefined;
  const results: Outcome[] = [];
  try {
    // the controller as a user of its own, which the storm's FlowSchema singles out (the test's admin is exempt)
    const user = "qsp-faults-deletion";
    const kubeconfig = `${dir}/controller.kubeconfig`;
    await impersonatingKubeconfig(admin, cp.kubeconfigPath, user, kubeconfig);
    storm = await ApfStorm.create(admin, user);
    probe = await KubeClient.load(kubeconfig, { qps: 0 });
    const env = { kubeconfig: cp.kubeconfigPath, controllerKubeconfig: kubeconfig, storm, probe, stormMs };
    for (let i = 1; i <= trials; i++) {
      const order = pick(DELETION_ORDERS, "QSP_FAULT_DELETION_ORDER", (o) => o.name);
      const fault = pick(FAULTS, "QSP_FAULT_DELETION_FAULT", (f) => f);
      results.push(await deletionTrial(env, `#${i}`, order, fault));
    }
  } finally {
    await storm?.remove().catch(() => {});
    probe?.close();
    admin.close();
    await cp.stop();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
  return results;
}

interface TrialEnv {
  kubeconfig: string;
  controllerKubeconfig: string;
  storm: ApfStorm;
  probe: KubeClient;
  stormMs: number;
}

async function deletionTrial(env: TrialEnv, trial: string, order: DeletionOrder, fault: Fault): Promise<Outcome> {
  const t0 = performance.now();
  const problems: string[] = [];
  let note = "";
  const w = await FaultWorld.create({
    kubeconfig: env.kubeconfig,
    controllerKubeconfig: env.controllerKubeconfig,
    prefix: "deletion",
    teardownGraceSeconds: GRACE_S,
    sweepSeconds: SWEEP_SECONDS,
  });
  const host = w.hostNamed(SEED_HOST)!;
  let held: FinalizerWatch | undefined;
  let left = "";
  try {
    await w.seed((s) => Object.assign(s.spec, FaultWorld.LOW, { minAvailableReplicas: REPLICAS }));
    await w.controller.start();
    const base = await checkInvariants(w);
    if (!base.ok) throw new Error(`baseline did not hold: ${base.violations.join("; ")}`);
    const names = (await w.exporters()).map((e) => e.metadata.name!);
    held = watchFinalizers(w);
    const started = performance.now();
    const [, what] = await Promise.all([order.run(w), inject(w, env, fault)]);
    // full cleanup: no Exporter (or no namespace) left, and no trace of either instance on the host
    await waitFor(async () => {
      const left = order.namespaceGone
        ? !!(await w.client.find(NAMESPACES, undefined, w.ns))
        : (await w.client.list<Exporter>(EXPORTERS, w.ns)).items.length > 0;
      if (left) return false;
      for (const n of names) if (await hostHas(host, n)) return false;
      return true;
    }, { what: "no Exporter left and the host clean", timeoutMs: (GRACE_S + SLACK_S) * 1000 + 120_000 })
      .catch(async () => {
        const exporters = (await w.client.list<Exporter>(EXPORTERS, w.ns)).items.map((e) => e.metadata.name);
        const onHost = [];
        for (const n of names) if (await hostHas(host, n)) onHost.push(n);
        // README, "Removal and the sweep": the key the host took is remembered by the process only, so after a
        // restart with no key left in the cluster the instance stays, announced as one to remove by hand
        // named in the Warning, or (a terminating namespace takes no Event) in the log line that goes with it
        const said = [
          ...await abandoned(w),
          ...(await w.controller.log()).split("\n").filter((l) => l.includes(DROPPED)),
        ];
        const announced = onHost.every((n) =>
          said.some((m) => m.includes(n) && /by hand|dropping a finalizer/.test(m))
        );
        if (exporters.length === 0 && order.keyGone && fault === "controller SIGKILL mid-teardown" && announced) {
          left = `documented leftover (key gone, process memory lost): ${
            onHost.join(", ")
          } announced to remove by hand`;
          for (const n of onHost) await w.lab.remove(await directTarget(host), n);
          return;
        }
        problems.push(
          `not cleaned up in ${secondsSince(started).toFixed(0)} s: Exporters [${exporters.join(", ")}], ` +
            `instances still on ${host.name} [${onHost.join(", ")}]`,
        );
      });
    const cleanup = secondsSince(started);
    await held.stop();
    const oldest = held.oldestSeconds;
    if (oldest > GRACE_S + SLACK_S) {
      problems.push(`a finalizer held ${oldest.toFixed(1)} s after its deletion (bound ${GRACE_S} s + ${SLACK_S} s)`);
    }
    const abandonedCount = (await abandoned(w)).length;
    if (fault === "host unreachable past the grace" && abandonedCount === 0) {
      problems.push("no TeardownAbandoned Warning although the host was unreachable past the grace");
    }
    note = `${what}; cleanup ${cleanup.toFixed(1)} s, finalizer held at most ${oldest.toFixed(1)} s, ` +
      `${abandonedCount} TeardownAbandoned${left ? `; ${left}` : ""}`;
  } catch (e) {
    problems.push(`trial failed: ${e instanceof Error ? e.message : e}`);
  } finally {
    await held?.stop();
    await plugIn(host).catch(() => {});
    await w.stop({ keepLogs: problems.length > 0 }).catch((e) => console.error(`  stopping the world: ${e}`));
  }
  const o: Outcome = {
    scenario: "deletion",
    trial: `${trial} ${order.name}`,
    fault,
    ok: problems.length === 0,
    seconds: secondsSince(t0),
    note: [...problems, note].filter((x) => x).join("; "),
  };
  outcomes.push(o);
  console.log(
    `  [deletion] ${o.trial} + ${fault}: ${o.ok ? "ok" : "FAIL"} (${o.seconds.toFixed(1)}s)\n      ${o.note}`,
  );
  return o;
}

/** The fault, from just after the first delete; returns what it was. */
async function inject(w: FaultWorld, env: TrialEnv, fault: Fault): Promise<string> {
  const host = w.hostNamed(SEED_HOST)!;
  if (fault === "controller SIGKILL mid-teardown") {
    // counted in the controller's progress: drains, deletions, finalizer removals of the two Exporters
    const seen = await w.afterExporterEvents(1 + Math.floor(Math.random() * 4), 20_000);
    await sleep(randomBetween(0, 800));
    await w.controller.kill();
    await sleep(randomBetween(0, 1_000));
    await w.controller.start();
    return `killed after ${seen} Exporter events`;
  }
  if (fault === "host unreachable briefly") {
    await unplug(host);
    await sleep(BRIEF_MS);
    await plugIn(host);
    return `host unplugged for ${BRIEF_MS / 1000} s`;
  }
  if (fault === "host unreachable past the grace") {
    await unplug(host);
    const t0 = performance.now();
    try {
      // until the finalizers went (given up after the grace), or the namespace with them
      await waitFor(async () => (await w.client.list<Exporter>(EXPORTERS, w.ns)).items.length === 0, {
        what: "the Exporters let go after the grace",
        timeoutMs: (GRACE_S + SLACK_S) * 1000 + 60_000,
      });
    } finally {
      await plugIn(host);
    }
    return `host unplugged until the Exporters went (${secondsSince(t0).toFixed(0)} s)`;
  }
  await sleep(randomBetween(0, 1_000));
  await env.storm.start(env.probe);
  await sleep(env.stormMs);
  await env.storm.stop(env.probe);
  return `429 storm on the controller for ${env.stormMs / 1000} s`;
}

interface FinalizerWatch {
  /** The longest time an Exporter was seen holding our finalizer after its deletionTimestamp. */
  readonly oldestSeconds: number;
  stop(): Promise<void>;
}

/** Polls the namespace's Exporters (twice a second) for how long our finalizer outlives their deletion. */
function watchFinalizers(w: FaultWorld): FinalizerWatch {
  let oldest = 0;
  let running = true;
  const loop = (async () => {
    while (running) {
      const items = await w.client.list<Exporter>(EXPORTERS, w.ns).then((l) => l.items, () => []);
      for (const e of items) {
        const since = Date.parse(e.metadata.deletionTimestamp ?? "");
        if (Number.isNaN(since) || !e.metadata.finalizers?.includes(FINALIZER)) continue;
        oldest = Math.max(oldest, (Date.now() - since) / 1000);
      }
      await sleep(500);
    }
  })();
  return {
    get oldestSeconds() {
      return oldest;
    },
    stop() {
      running = false;
      return loop;
    },
  };
}

/**
 * The messages of the TeardownAbandoned Warnings: the namespace's Events, and the controller's log where it could not
 * record one (a terminating namespace takes no new Event; the recorder then logs the reason) or said it was dropping
 * a finalizer.
 */
async function abandoned(w: FaultWorld): Promise<string[]> {
  const events = (await w.events().catch(() => [])).filter((e) => e.reason === "TeardownAbandoned")
    .map((e) => e.message);
  const unrecorded = (await w.controller.log()).split("\n")
    .filter((l) => l.includes("could not record event") && l.includes("TeardownAbandoned"));
  return [...events, ...unrecorded];
}
