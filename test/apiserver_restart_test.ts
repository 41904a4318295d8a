/**
 * The API server process killed and started again under a running informer: its request rate stays bounded while
 * the server is gone, and the watch resumes so that changes made after the restart reach the cache.
 * Uses a control plane of its own, since killing the shared one would disturb every other test.
 */
import assert from "node:assert/strict";
import { startControlPlane } from "./controlplane/controlplane.ts";
import { waitFor } from "./env.ts";
import { KubeClient } from "../src/kube/client.ts";
import { Informer } from "../src/kube/informer.ts";
import { CONFIG_MAPS, NAMESPACES } from "../src/kube/resources.ts";
import type { ConfigMap } from "../src/api/types.ts";
import { silentLogger } from "../src/observe/log.ts";

Deno.test({
  name: "informer: survives kube-apiserver being killed and restarted, with bounded requests while it is down",
  sanitizeOps: false,
  sanitizeResources: false,
  async fn() {
    const dir = await Deno.makeTempDir({ prefix: "qsp-restart-" });
    const cp = await startControlPlane({ dir });
    const admin = await KubeClient.load(cp.kubeconfigPath);
    const watcher = await KubeClient.load(cp.kubeconfigPath);
    const abort = new AbortController();
    try {
      const ns = "restart";
      await admin.create(NAMESPACES, { metadata: { name: ns } });
      const informer = new Informer<ConfigMap>(watcher, CONFIG_MAPS, {
        namespace: ns,
        log: silentLogger,
        watchTimeoutSeconds: 30,
        idleTimeoutMs: 45_000,
        backoffInitialMs: 200,
        backoffMaxMs: 2_000,
      });
      const run = informer.run(abort.signal);
      await informer.synced;
      await admin.create(CONFIG_MAPS, { metadata: { name: "before", namespace: ns } });
      await waitFor(() => informer.get(ns, "before"), { what: "the first object in the cache" });

      const killedAt = Date.now();
      const requestsBefore = watcher.requests;
      await cp.restartApiServer(5_000);
      const downMs = Date.now() - killedAt;
      const requestsWhileDown = watcher.requests - requestsBefore;
      console.log(`  api server down ${downMs} ms; informer requests meanwhile: ${requestsWhileDown}`);
      // With a 200 ms..2 s backoff a hot loop would make hundreds of requests; a few per second at most is bounded.
      assert.ok(requestsWhileDown <= Math.max(5, (downMs / 1000) * 3), `${requestsWhileDown} requests in ${downMs} ms`);

      await admin.create(CONFIG_MAPS, { metadata: { name: "after", namespace: ns } });
      await admin.delete(CONFIG_MAPS, ns, "before");
      const t0 = Date.now();
      await waitFor(() => informer.get(ns, "after") && !informer.get(ns, "before"), {
        what: "changes made after the restart in the cache",
        timeoutMs: 30_000,
      });
      console.log(`  changes after the restart seen within ${Date.now() - t0} ms; restarts=${informer.stats.restarts}`);
      abort.abort();
      await run;
    } finally {
      abort.abort();
      admin.close();
      watcher.close();
      await cp.stop();
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});
