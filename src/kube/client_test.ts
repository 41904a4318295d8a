import assert from "node:assert/strict";
import { type ClientOptions, KubeClient, resourceOfPath } from "./client.ts";
import { CONFIG_MAPS } from "./resources.ts";

Deno.test("resourceOfPath: the resource, and its subresource, a request path names", () => {
  const cases: [string, string][] = [
    ["/apis/virtualtarget.jumpstarter.dev/v1alpha1/namespaces/lab/exportersets/pool/status", "exportersets/status"],
    ["/apis/jumpstarter.dev/v1alpha1/exporters?watch=1&resourceVersion=5", "exporters"],
    ["/api/v1/namespaces/lab/events/pool.1", "events"],
    ["/api/v1/namespaces/lab", "namespaces"],
    ["/api/v1/namespaces", "namespaces"],
    ["/apis/coordination.k8s.io/v1/namespaces/lab/leases", "leases"],
  ];
  for (const [path, want] of cases) assert.equal(resourceOfPath(path), want, path);
});

/** A client of a loopback HTTP server that answers every request with an empty list, and the paths it was sent. */
async function withServer(
  opts: ClientOptions,
  fn: (client: KubeClient, sent: string[]) => Promise<void>,
): Promise<void> {
  const s = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, () => Response.json({ items: [] }));
  const dir = await Deno.makeTempDir({ prefix: "qsp-client-" });
  const sent: string[] = [];
  const config = {
    "current-context": "c",
    contexts: [{ name: "c", context: { cluster: "k", user: "u" } }],
    clusters: [{ name: "k", cluster: { server: `http://127.0.0.1:${s.addr.port}` } }],
    users: [{ name: "u", user: { token: "t" } }],
  };
  await Deno.writeTextFile(`${dir}/config`, JSON.stringify(config));
  const client = await KubeClient.load(`${dir}/config`, {
    env: () => undefined,
    onRequest: (method, path) => sent.push(`${method} ${path}`),
    ...opts,
  });
  try {
    await fn(client, sent);
  } finally {
    client.close();
    await s.shutdown();
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("client: the request deadline starts once the request holds its token, not while it waits in the bucket", () =>
  // 2 a second, burst 1: the sixth request waits 2.5 s for its token, past the 2 s deadline
  withServer({ qps: 2, burst: 1, requestTimeoutMs: 2_000 }, async (client, sent) => {
    const lists = await Promise.all(Array.from({ length: 6 }, () => client.list(CONFIG_MAPS, "default")));
    assert.equal(lists.length, 6);
    assert.equal(sent.length, 6);
  }));

Deno.test("client: a caller's own signal still ends the wait in the bucket (leader election's renew deadline)", () =>
  withServer({ qps: 0.1, burst: 1 }, async (client, sent) => {
    await client.list(CONFIG_MAPS, "default");
    const renew = new AbortController();
    const queued = client.list(CONFIG_MAPS, "default", {}, renew.signal);
    renew.abort(new DOMException("renew deadline", "TimeoutError"));
    await assert.rejects(queued, /renew deadline/);
    assert.deepEqual(sent, ["GET /api/v1/namespaces/default/configmaps"], "the second was never sent");
  }));
