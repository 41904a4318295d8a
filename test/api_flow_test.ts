/**
 * Flow control against the real API server in a 429 storm (test/apf_storm.ts: APF rejecting one user): requests are
 * retried after the server's Retry-After, paced by the token bucket while the storm lasts, and all complete once it
 * ends. The figures (requests a second under the storm, the waits) are printed for the benchmark notes. A control
 * plane of its own: the run's has API Priority and Fairness off.
 */
import assert from "node:assert/strict";
import { freshNamespace } from "./env.ts";
import { startControlPlane } from "./controlplane/controlplane.ts";
import { ApfStorm, impersonatingKubeconfig } from "./apf_storm.ts";
import { KubeClient, type RetryInfo } from "../src/kube/client.ts";
import { CONFIG_MAPS } from "../src/kube/resources.ts";
import type { KubeObject } from "../src/api/types.ts";

const CONCURRENT = 200;
const STORM_MS = 4_000;
/** A limit asked for: the default sets none. */
const QPS = 50;
const BURST = 100;

Deno.test({
  name: "flow control: a 429 storm is retried after Retry-After, paced by the bucket, and every request completes",
  sanitizeOps: false,
  sanitizeResources: false,
  async fn() {
    const dir = await Deno.makeTempDir({ prefix: "qsp-apf-" });
    const cp = await startControlPlane({ dir: `${dir}/controlplane`, priorityAndFairness: true });
    const admin = await KubeClient.load(cp.kubeconfigPath);
    const ns = await freshNamespace(admin, "flow");
    const user = `qsp-storm-${ns}`;
    let storm: ApfStorm | undefined;
    const clients: KubeClient[] = [];
    try {
      await impersonatingKubeconfig(admin, cp.kubeconfigPath, user, `${dir}/kubeconfig`);
      const retries: (RetryInfo & { at: number })[] = [];
      const client = await KubeClient.load(`${dir}/kubeconfig`, {
        qps: QPS,
        burst: BURST,
        onRetry: (r) => retries.push({ ...r, at: performance.now() }),
      });
      const probe = await KubeClient.load(`${dir}/kubeconfig`, { qps: 0 });
      clients.push(client, probe);
      await admin.create(CONFIG_MAPS, { metadata: { name: "target", namespace: ns }, data: { a: "1" } } as KubeObject);
      storm = await ApfStorm.create(admin, user);
      await storm.start(probe);
      const rejectedBefore = await storm.rejected();

      const sentBefore = client.requests;
      const t0 = performance.now();
      const gets = Array.from({ length: CONCURRENT }, () => client.get<KubeObject>(CONFIG_MAPS, ns, "target"));
      const settled = Promise.allSettled(gets);
      await new Promise((r) => setTimeout(r, STORM_MS));
      const sentInStorm = client.requests - sentBefore;
      const stormSecs = (performance.now() - t0) / 1000;
      const rejected = (await storm.rejected()) - rejectedBefore;
      await storm.stop(probe);
      const results = await settled;
      const total = (performance.now() - t0) / 1000;

      const failed = results.filter((r) => r.status === "rejected").map((r) =>
        String((r as PromiseRejectedResult).reason)
      );
      assert.deepEqual(failed.slice(0, 3), [], `${failed.length} of ${CONCURRENT} requests failed`);
      const rate = sentInStorm / stormSecs;
      const on429 = retries.filter((r) => r.cause === 429);
      assert.ok(on429.length > 0, "the storm answered 429");
      // Honoured: every 429 carried the server's Retry-After, and that is exactly how long the retry waited.
      for (const r of on429) {
        assert.ok(r.retryAfter !== undefined, `429 without Retry-After: ${JSON.stringify(r)}`);
        assert.equal(r.waitMs, Number(r.retryAfter) * 1000, JSON.stringify(r));
      }
      // Paced: the bucket never lets more than burst + qps x elapsed through, whatever the concurrency.
      assert.ok(sentInStorm <= BURST + QPS * stormSecs + 1, `${sentInStorm} in ${stormSecs}s`);
      console.log(
        `  ${CONCURRENT} concurrent GETs in a ${STORM_MS / 1000}s storm: ${sentInStorm} attempts ` +
          `(${rate.toFixed(1)}/s; bucket ${QPS} qps, burst ${BURST}), ${rejected} rejected by APF, ` +
          `${on429.length} retries each after Retry-After ${[...new Set(on429.map((r) => r.retryAfter))]} s; ` +
          `all ${CONCURRENT} done ${total.toFixed(1)}s after the start`,
      );
    } finally {
      await storm?.remove().catch(() => {});
      for (const c of clients) c.close();
      admin.close();
      await cp.stop();
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});
