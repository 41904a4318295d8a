/**
 * Faults of the API server side, on a control plane of the scenario's own (the run's is shared by every test):
 * kube-apiserver SIGKILLed and started again (same etcd) in the middle of a scale, etcd compacted past what the
 * controller has seen (so its watches come back 410 Gone and it must relist), every connection of the controller
 * gone silent for a while, and a 429 storm (test/apf_storm.ts: the server's API Priority and Fairness shedding the
 * requests of the controller's user, which the controller impersonates for that). The controller reaches the API
 * server through test/faultproxy.ts; the test and the fake Jumpstarter talk to it directly.
 */
import { parse, stringify } from "yaml";
import { startControlPlane } from "../controlplane/controlplane.ts";
import { installCrdsAt, waitFor } from "../env.ts";
import { FaultInjector } from "../faultproxy.ts";
import { ApfStorm, impersonatingKubeconfig } from "../apf_storm.ts";
import { KubeClient } from "../../src/kube/client.ts";
import type { KubeObject } from "../../src/api/types.ts";
import { CONFIG_MAPS } from "../../src/kube/resources.ts";
import { checkInvariants, trial } from "./invariants.ts";
import { FaultWorld, type Outcome, randomBetween, sleep } from "./world.ts";

export async function apiScenario(reps: number, silenceMs: number, stormMs: number): Promise<Outcome[]> {
  const dir = await Deno.makeTempDir({ prefix: "qsp-faults-api-" });
  const cp = await startControlPlane({ dir: `${dir}/controlplane`, setup: installCrdsAt, priorityAndFairness: true });
  let proxy: FaultInjector | undefined;
  let w: FaultWorld | undefined;
  let storm: ApfStorm | undefined;
  let probe: KubeClient | undefined;
  const admin = await KubeClient.load(cp.kubeconfigPath);
  const results: Outcome[] = [];
  try {
    proxy = await FaultInjector.forKubeconfig(cp.kubeconfigPath);
    const viaProxy = `${dir}/via-proxy.kubeconfig`;
    await writeKubeconfigVia(cp.kubeconfigPath, proxy.url, viaProxy);
    // a user of its own, so that the storm's FlowSchema can single it out (the admin is exempt: system:masters)
    const user = "qsp-faults-controller";
    await impersonatingKubeconfig(admin, viaProxy, user, viaProxy);
    storm = await ApfStorm.create(admin, user);
    probe = await KubeClient.load(viaProxy, { qps: 0 });
    w = await FaultWorld.create({ kubeconfig: cp.kubeconfigPath, controllerKubeconfig: viaProxy, prefix: "api" });
    const world = w;
    const fp = proxy;
    await w.seed((s) => Object.assign(s.spec, FaultWorld.LOW));
    await w.controller.start();
    const base = await checkInvariants(w);
    if (!base.ok) throw new Error(`baseline did not hold: ${base.violations.join("; ")}`);

    for (let rep = 1; rep <= reps; rep++) {
      results.push(
        await trial(world, "api", `apiserver restart #${rep}`, async () => {
          const scale = await world.toggleScale();
          const delay = randomBetween(100, 2_500);
          await sleep(delay);
          const t0 = performance.now();
          await cp.restartApiServer();
          return { fault: `${scale}, kube-apiserver SIGKILL+start @${(delay / 1000).toFixed(1)}s (${secs(t0)}s)` };
        }),
      );

      results.push(
        await trial(world, "api", `etcd compacted #${rep}`, async (checks) => {
          const relists = count(await world.controller.log(), "watch expired (410)");
          // The controller is cut off while things change, etcd forgets the history, and the API server's watch cache
          // (which would otherwise replay it) starts afresh: its watches must come back 410 Gone.
          const outage = fp.outage(300_000);
          let revision = 0;
          let scale = "";
          try {
            scale = await world.toggleScale();
            for (let i = 0; i < 5; i++) {
              await world.client.create(CONFIG_MAPS, {
                metadata: { name: `churn-${rep}-${i}`, namespace: world.ns },
                data: { i: String(i) },
              } as KubeObject);
            }
            revision = await compactEtcd(cp.dir);
            await cp.restartApiServer();
          } finally {
            await fp.outage(1); // ends the long outage (the new one lasts 1 ms)
            await outage;
          }
          const after = async () => {
            const seen = count(await world.controller.log(), "watch expired (410)") - relists;
            checks.expect(seen > 0, "the controller never saw 410 Gone (no relist after the compaction)");
            return `${seen} informers relisted after 410 Gone`;
          };
          return {
            fault: `${scale} while cut off, etcd compacted at revision ${revision}, apiserver restarted`,
            after,
          };
        }),
      );

      results.push(
        await trial(world, "api", `silent connections #${rep}`, async () => {
          const scale = await world.toggleScale();
          const delay = randomBetween(200, 3_000);
          await sleep(delay);
          fp.silence();
          try {
            await sleep(silenceMs);
          } finally {
            fp.resume();
          }
          return { fault: `${scale}, every connection silent @${(delay / 1000).toFixed(1)}s for ${silenceMs / 1000}s` };
        }),
      );

      results.push(
        await trial(world, "api", `429 storm #${rep}`, async () => {
          const s = storm!;
          const scale = await world.toggleScale();
          await sleep(randomBetween(100, 1_500));
          const before = await s.rejected();
          await s.start(probe!);
          const t0 = performance.now();
          try {
            await sleep(stormMs);
          } finally {
            await s.stop(probe!);
          }
          const rejected = (await s.rejected()) - before;
          const rate = rejected / ((performance.now() - t0) / 1000);
          return {
            fault: `${scale}, the controller's requests shed by APF (429, Retry-After; one at a time let through) ` +
              `for ${stormMs / 1000}s`,
            note: `${rejected} requests rejected, ${rate.toFixed(1)}/s under the storm`,
          };
        }),
      );
    }
  } finally {
    await w?.stop({ keepLogs: results.some((r) => !r.ok) }).catch((e) => console.error(`  stopping the world: ${e}`));
    await storm?.remove().catch(() => {});
    probe?.close();
    admin.close();
    await proxy?.close();
    await cp.stop();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
  return results;
}

const secs = (t0: number) => ((performance.now() - t0) / 1000).toFixed(1);
const count = (text: string, what: string) => text.split(what).length - 1;

/** A copy of a kubeconfig whose current cluster's server is `server`. */
async function writeKubeconfigVia(from: string, server: string, to: string): Promise<void> {
  const config = parse(await Deno.readTextFile(from)) as {
    "current-context": string;
    contexts: { name: string; context: { cluster: string } }[];
    clusters: { name: string; cluster: { server: string } }[];
  };
  const ctx = config.contexts.find((c) => c.name === config["current-context"])!;
  config.clusters.find((c) => c.name === ctx.context.cluster)!.cluster.server = server;
  await Deno.writeTextFile(to, stringify(config), { mode: 0o600 });
}

/**
 * Compacts etcd at its current revision through its JSON gateway (the client URL from etcd's command line), and
 * waits until a read at an older revision is refused. Returns the revision.
 */
async function compactEtcd(controlPlaneDir: string): Promise<number> {
  const pid = (await Deno.readTextFile(`${controlPlaneDir}/etcd.pid`)).trim();
  const cmdline = (await Deno.readTextFile(`/proc/${pid}/cmdline`)).split("\0");
  const url = cmdline.find((a) => a.startsWith("--listen-client-urls="))?.split("=")[1].split(",")[0];
  if (!url) throw new Error(`no --listen-client-urls in etcd's command line: ${cmdline.join(" ")}`);
  const post = async (path: string, body: unknown) => {
    const res = await fetch(`${url}${path}`, { method: "POST", body: JSON.stringify(body) });
    const text = await res.text();
    if (!res.ok) throw new Error(`etcd ${path}: ${res.status} ${text}`);
    return JSON.parse(text);
  };
  const head = await post("/v3/kv/range", { key: btoa("\0") });
  const revision = Number(head.header.revision);
  await post("/v3/kv/compaction", { revision, physical: true });
  await waitFor(async () => {
    const res = await fetch(`${url}/v3/kv/range`, {
      method: "POST",
      body: JSON.stringify({ key: btoa("\0"), revision: revision - 1 }),
    });
    const text = await res.text();
    return !res.ok || /compacted/.test(text);
  }, { what: "etcd to refuse reads below the compacted revision", timeoutMs: 10_000 });
  return revision;
}
