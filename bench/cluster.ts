/**
 * The bench's Kubernetes side: a private control plane (test/controlplane), the CRDs, and the clients the bench
 * uses. The controller does not export its API request count, so it is measured at the API server: the change in
 * apiserver_request_total (resource requests only, without the API server's own coordination Leases) minus what the
 * bench and the fake Jumpstarter counted on their own clients. Watches are counted by the API server when they end
 * and by a client when it starts one, so a window can be off by the few watches that straddle its edges. The
 * control plane's kube-controller-manager is not told apart either: its garbage collector's requests (deleting the
 * token Secrets of deleted Exporters; a watch on every kind, each re-opened every 5 to 10 minutes) count as the
 * controller's.
 */
import { type ControlPlane, startControlPlane } from "../test/controlplane/controlplane.ts";
import { installCrdsAt } from "../test/env.ts";
import { KubeClient } from "../src/kube/client.ts";
import { parseProm, total } from "./prom.ts";

export interface Cluster {
  cp: ControlPlane;
  /** Everything the bench itself does (seed objects, polling, observing Exporters). */
  bench: KubeClient;
  /** The FakeJumpstarterController's own client, so its requests can be told apart. */
  jumpstarter: KubeClient;
  /** Resource requests served so far by the API server, excluding its own coordination Leases. */
  served(): Promise<number>;
  /** Requests the bench's and the fake Jumpstarter's clients made so far. */
  ownRequests(): number;
  stop(): Promise<void>;
}

export async function startCluster(dir: string): Promise<Cluster> {
  const cp = await startControlPlane({ dir, setup: installCrdsAt });
  const clients: KubeClient[] = [];
  try {
    // the harness is not what is measured: no client-side rate limit (the controller keeps its own)
    for (let i = 0; i < 3; i++) clients.push(await KubeClient.load(cp.kubeconfigPath, { qps: 0 }));
  } catch (e) {
    clients.forEach((c) => c.close());
    await cp.stop();
    throw e;
  }
  const [bench, jumpstarter, scraper] = clients;
  return {
    cp,
    bench,
    jumpstarter,
    async served() {
      const text = await (await scraper.fetch("GET", "/metrics")).text();
      return total(
        parseProm(text),
        "apiserver_request_total",
        (l) => !!l.resource && l.group !== "coordination.k8s.io",
      );
    },
    ownRequests: () => bench.requests + jumpstarter.requests,
    async stop() {
      clients.forEach((c) => c.close());
      await cp.stop();
    },
  };
}
