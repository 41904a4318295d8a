/**
 * The Informer against the real API server, through a FaultInjector for the faults the server cannot produce on
 * demand (outage, half-dead connection). The 410 case is real: core/v1 Events bypass the API server's watch cache, so
 * compacting etcd makes a watch from an older resourceVersion fail with 410 exactly as in production.
 */
import assert from "node:assert/strict";
import { freshNamespace, testEnv, waitFor } from "./env.ts";
import { FaultInjector } from "./faultproxy.ts";
import { KubeClient } from "../src/kube/client.ts";
import { type EventType, Informer, type InformerOptions } from "../src/kube/informer.ts";
import { WorkQueue } from "../src/kube/queue.ts";
import { CONFIG_MAPS, EVENTS } from "../src/kube/resources.ts";
import type { ConfigMap, KubeObject } from "../src/api/types.ts";
import { createLogger } from "../src/observe/log.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const secs = (ms: number) => `${(ms / 1000).toFixed(2)} s`;

interface Seen {
  type: EventType;
  name: string;
  at: number;
  lists: number;
}

/** A fresh namespace, an admin client straight to the server, and an informer whose client goes through the proxy. */
async function setup<T extends KubeObject>(
  resource: typeof CONFIG_MAPS,
  opts: Partial<InformerOptions> = {},
  clientOpts: Parameters<typeof KubeClient.load>[1] = {},
) {
  const env = await testEnv();
  const admin = await KubeClient.load(env.kubeconfig);
  const proxy = await FaultInjector.forKubeconfig(env.kubeconfig);
  const client = await proxy.client(env.kubeconfig, clientOpts);
  const ns = await freshNamespace(admin, "kinf");
  const logs: string[] = [];
  const log = createLogger({
    level: "debug",
    write: (line) => {
      logs.push(line);
      if (Deno.env.get("QSP_TEST_LOG")) console.error(line);
    },
  });
  const informer = new Informer<T>(client, resource, {
    namespace: ns,
    log,
    watchTimeoutSeconds: 2,
    idleTimeoutMs: 4000,
    ...opts,
  });
  const seen: Seen[] = [];
  informer.on((type, o) =>
    seen.push({ type, name: o.metadata.name!, at: performance.now(), lists: informer.stats.lists })
  );
  const abort = new AbortController();
  let running: Promise<void> | undefined;
  return {
    env,
    admin,
    proxy,
    client,
    ns,
    logs,
    informer,
    seen,
    start() {
      running = informer.run(abort.signal);
      return informer.synced;
    },
    saw: (type: EventType, name: string) => seen.find((s) => s.type === type && s.name === name),
    async stop() {
      abort.abort();
      await running;
      await proxy.close();
      client.close();
      admin.close();
    },
  };
}

const cm = (ns: string, name: string, data: Record<string, string> = {}): ConfigMap => ({
  metadata: { name, namespace: ns },
  data,
});

Deno.test("informer: lists, then sees ADDED, MODIFIED and DELETED from the real API server", async () => {
  const t = await setup<ConfigMap>(CONFIG_MAPS);
  try {
    await t.admin.create(CONFIG_MAPS, cm(t.ns, "before"));
    await t.start();
    assert.ok(t.saw("ADDED", "before"), "the initial list reports existing objects as ADDED");
    assert.equal(t.informer.get(t.ns, "before")?.kind, "ConfigMap", "listed items carry their kind");

    await t.admin.create(CONFIG_MAPS, cm(t.ns, "a", { v: "1" }));
    await waitFor(() => t.saw("ADDED", "a"), { what: "ADDED a", timeoutMs: 5000, intervalMs: 20 });
    await t.admin.mergePatch(CONFIG_MAPS, t.ns, "a", { data: { v: "2" } });
    await waitFor(() => t.saw("MODIFIED", "a"), { what: "MODIFIED a", timeoutMs: 5000, intervalMs: 20 });
    assert.equal(t.informer.get(t.ns, "a")?.data?.v, "2");
    await t.admin.delete(CONFIG_MAPS, t.ns, "a");
    await waitFor(() => t.saw("DELETED", "a"), { what: "DELETED a", timeoutMs: 5000, intervalMs: 20 });
    assert.equal(t.informer.get(t.ns, "a"), undefined);
    assert.deepEqual(t.informer.list(t.ns).map((o) => o.metadata.name), ["before"]);
    assert.equal(t.informer.stats.lists, 1, "no relist needed");
  } finally {
    await t.stop();
  }
});

Deno.test("informer: an API server outage is ridden out with backoff, and what changed meanwhile is seen", async () => {
  const t = await setup<ConfigMap>(CONFIG_MAPS);
  try {
    await t.admin.create(CONFIG_MAPS, cm(t.ns, "doomed"));
    await t.start();
    const attemptsBefore = t.proxy.stats().accepted;
    const requestsBefore = t.client.requests;
    const OUTAGE_MS = 3000;
    const outage = t.proxy.outage(OUTAGE_MS);
    await t.admin.create(CONFIG_MAPS, cm(t.ns, "born-in-outage"));
    await t.admin.delete(CONFIG_MAPS, t.ns, "doomed");
    await outage;
    const ended = performance.now();
    const attempts = t.proxy.stats().accepted - attemptsBefore;
    const requests = t.client.requests - requestsBefore;

    await waitFor(() => t.saw("ADDED", "born-in-outage") && t.saw("DELETED", "doomed"), {
      what: "the changes made during the outage",
      timeoutMs: 15_000,
      intervalMs: 20,
    });
    const recovered = Math.max(t.saw("ADDED", "born-in-outage")!.at, t.saw("DELETED", "doomed")!.at) - ended;
    console.log(
      `outage ${secs(OUTAGE_MS)}: ${attempts} connection attempts, ${requests} requests during it; ` +
        `changes seen ${secs(recovered)} after it ended; lists=${t.informer.stats.lists} ` +
        `(the resumed watch replayed the changes), restarts=${t.informer.stats.restarts}`,
    );
    assert.ok(attempts < 30, `no hot loop: ${attempts} connection attempts in ${OUTAGE_MS} ms`);
    assert.ok(attempts >= 2, `it kept retrying during the outage: ${attempts} attempts`);
    assert.ok(recovered < 8000, `recovered ${secs(recovered)} after the outage`);
    assert.deepEqual(t.informer.list(t.ns).map((o) => o.metadata.name), ["born-in-outage"]);
    assert.ok(t.logs.some((l) => l.includes("list/watch failed, retrying")), "the failures were logged");
  } finally {
    await t.stop();
  }
});

Deno.test("informer: a silent (half-dead) watch is detected by the idle timeout and restarted", async () => {
  const IDLE_MS = 4000;
  const t = await setup<ConfigMap>(CONFIG_MAPS, { watchTimeoutSeconds: 2, idleTimeoutMs: IDLE_MS });
  try {
    await t.start();
    await sleep(500); // a watch is established and streaming
    const idleBefore = t.informer.stats.idleTimeouts;
    t.proxy.silence();
    const silenced = performance.now();
    await t.admin.create(CONFIG_MAPS, cm(t.ns, "born-in-silence"));
    await waitFor(() => t.informer.stats.idleTimeouts > idleBefore, {
      what: "the idle timeout to fire",
      timeoutMs: IDLE_MS + 5000,
      intervalMs: 20,
    });
    const detected = performance.now() - silenced;
    assert.equal(t.saw("ADDED", "born-in-silence"), undefined, "nothing can arrive through a silent link");
    t.proxy.resume();
    const resumed = performance.now();
    await waitFor(() => t.saw("ADDED", "born-in-silence"), {
      what: "the object created during the silence",
      timeoutMs: IDLE_MS + 5000,
      intervalMs: 20,
    });
    const seenAfter = t.saw("ADDED", "born-in-silence")!.at - resumed;
    console.log(
      `silent watch detected ${secs(detected)} after the link went silent (idle timeout ${secs(IDLE_MS)}, ` +
        `watch timeout 2 s); object created during the silence seen ${secs(seenAfter)} after resume; ` +
        `idleTimeouts=${t.informer.stats.idleTimeouts} lists=${t.informer.stats.lists}`,
    );
    assert.ok(detected <= IDLE_MS + 1000, `detected within the idle timeout: ${secs(detected)}`);
    assert.ok(seenAfter < IDLE_MS + 1000, `seen ${secs(seenAfter)} after resume`);
    assert.ok(t.logs.some((l) => l.includes("watch silent, restarting")));
  } finally {
    await t.stop();
  }
});

Deno.test("informer: a list on a half-dead connection times out and is retried, so the cache still syncs", async () => {
  const REQUEST_TIMEOUT_MS = 1500;
  const t = await setup<ConfigMap>(CONFIG_MAPS, {}, { requestTimeoutMs: REQUEST_TIMEOUT_MS });
  try {
    await t.admin.create(CONFIG_MAPS, cm(t.ns, "present"));
    t.proxy.silence();
    const synced = t.start();
    await waitFor(() => t.informer.stats.lists >= 2, {
      what: "the stalled list to be given up and retried",
      timeoutMs: 3 * REQUEST_TIMEOUT_MS,
      intervalMs: 20,
    });
    assert.ok(!t.informer.hasSynced);
    assert.ok(t.logs.some((l) => l.includes("list/watch failed") && l.includes("TimeoutError")), t.logs.join("\n"));
    t.proxy.resume();
    const resumed = performance.now();
    await synced;
    console.log(`synced ${secs(performance.now() - resumed)} after resume; lists=${t.informer.stats.lists}`);
    assert.ok(t.saw("ADDED", "present"));
  } finally {
    await t.stop();
  }
});

Deno.test("informer: a real 410 Gone after etcd compaction makes it relist, and the diff reports deletions", async () => {
  const t = await setup<KubeObject>(EVENTS);
  const event = (name: string) => ({
    metadata: { name, namespace: t.ns },
    involvedObject: { apiVersion: "v1", kind: "ConfigMap", name: "x", namespace: t.ns },
    reason: "Test",
    message: name,
    type: "Normal",
  } as KubeObject);
  try {
    await t.admin.create(EVENTS, event("kept"));
    await t.admin.create(EVENTS, event("doomed"));
    await t.start();
    assert.equal(t.informer.stats.lists, 1);

    const outage = t.proxy.outage(1500);
    await t.admin.delete(EVENTS, t.ns, "doomed");
    await t.admin.create(EVENTS, event("born-in-outage"));
    const head = (await t.admin.list(EVENTS, t.ns)).metadata.resourceVersion!;
    await compactEtcd(t.env.controlPlaneDir, head);
    await outage;

    await waitFor(() => t.saw("DELETED", "doomed") && t.saw("ADDED", "born-in-outage"), {
      what: "the relist after 410",
      timeoutMs: 15_000,
      intervalMs: 20,
    });
    assert.ok(t.logs.some((l) => l.includes("watch expired (410), relisting")), "the watch got a real 410");
    assert.equal(t.informer.stats.lists, 2, "exactly one relist");
    assert.equal(t.saw("DELETED", "doomed")!.lists, 2, "the deletion came from the relist diff");
    assert.equal(t.seen.filter((s) => s.name === "kept").length, 1, "unchanged objects are not re-reported");
    assert.deepEqual(t.informer.list(t.ns).map((o) => o.metadata.name).sort(), ["born-in-outage", "kept"]);
  } finally {
    await t.stop();
  }
});

Deno.test("informer + queue: a burst of events never reconciles one key concurrently, and the last run sees the last version", async () => {
  const t = await setup<ConfigMap>(CONFIG_MAPS);
  const KEYS = 20;
  const UPDATES = 8;
  const running = new Set<string>();
  let overlaps = 0;
  let runs = 0;
  const lastSeenVersion = new Map<string, string>();
  const queue = new WorkQueue({
    concurrency: 4,
    process: async (key) => {
      if (running.has(key)) overlaps++;
      running.add(key);
      runs++;
      const [ns, name] = key.split("/");
      await sleep(Math.random() * 15);
      const obj = t.informer.get(ns, name);
      if (obj) lastSeenVersion.set(key, obj.data!.v);
      running.delete(key);
    },
  });
  t.informer.on((_type, o) => queue.add(`${o.metadata.namespace}/${o.metadata.name}`));
  try {
    await t.start();
    queue.start();
    const names = Array.from({ length: KEYS }, (_, i) => `k${i}`);
    await Promise.all(names.map(async (n) => {
      await t.admin.create(CONFIG_MAPS, cm(t.ns, n, { v: "0" }));
      for (let v = 1; v <= UPDATES; v++) await t.admin.mergePatch(CONFIG_MAPS, t.ns, n, { data: { v: String(v) } });
    }));
    await waitFor(() => names.every((n) => lastSeenVersion.get(`${t.ns}/${n}`) === String(UPDATES)), {
      what: "every key reconciled at its last version",
      timeoutMs: 20_000,
      intervalMs: 20,
    });
    console.log(`${KEYS * (UPDATES + 1)} writes became ${runs} reconciles (deduplicated), overlaps=${overlaps}`);
    assert.equal(overlaps, 0, "one key was reconciled concurrently");
  } finally {
    await queue.shutdown();
    await t.stop();
  }
});

/** Compacts etcd's history up to `revision`, through its JSON gateway, as the API server's compactor would. */
async function compactEtcd(controlPlaneDir: string, revision: string): Promise<void> {
  const pid = (await Deno.readTextFile(`${controlPlaneDir}/etcd.pid`)).trim();
  const args = (await Deno.readTextFile(`/proc/${pid}/cmdline`)).split("\0");
  const url = args.find((a) => a.startsWith("--listen-client-urls="))?.split("=")[1].split(",")[0];
  assert.ok(url, "etcd's client URL");
  const res = await fetch(`${url}/v3/kv/compaction`, {
    method: "POST",
    body: JSON.stringify({ revision, physical: true }),
  });
  assert.equal(res.status, 200, await res.text());
}
