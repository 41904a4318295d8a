/**
 * Leader election between two electors in one process, against the real API server, each through its own
 * FaultInjector so one can lose its network. Both run as a ServiceAccount allowed only get/create/update on
 * coordination.k8s.io leases: anything more (list, watch, patch) would fail with 403.
 */
import assert from "node:assert/strict";
import { parse, stringify } from "yaml";
import { freshNamespace, testEnv, waitFor } from "./env.ts";
import { FaultInjector } from "./faultproxy.ts";
import { KubeClient, type Resource } from "../src/kube/client.ts";
import { acquireLeadership, type LeaderOptions, type Leadership } from "../src/kube/leader.ts";
import { COORDINATION_LEASES } from "../src/kube/resources.ts";
import type { KubeObject } from "../src/api/types.ts";
import { createLogger } from "../src/observe/log.ts";

const SERVICE_ACCOUNTS: Resource = { group: "", version: "v1", plural: "serviceaccounts", kind: "ServiceAccount" };
const ROLES: Resource = { group: "rbac.authorization.k8s.io", version: "v1", plural: "roles", kind: "Role" };
const ROLE_BINDINGS: Resource = {
  group: "rbac.authorization.k8s.io",
  version: "v1",
  plural: "rolebindings",
  kind: "RoleBinding",
};

const LEASE_MS = 3000;
const RENEW_DEADLINE_MS = 2000;
const RETRY_MS = 500;
const secs = (ms: number) => `${(ms / 1000).toFixed(2)} s`;

/** A kubeconfig for a ServiceAccount that may only get, create and update Leases in `ns`. */
async function leaseOnlyKubeconfig(admin: KubeClient, kubeconfig: string, ns: string): Promise<string> {
  await admin.create(SERVICE_ACCOUNTS, { metadata: { name: "elector", namespace: ns } });
  await admin.create(ROLES, {
    metadata: { name: "elector", namespace: ns },
    rules: [{ apiGroups: ["coordination.k8s.io"], resources: ["leases"], verbs: ["get", "create", "update"] }],
  } as KubeObject);
  await admin.create(ROLE_BINDINGS, {
    metadata: { name: "elector", namespace: ns },
    roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name: "elector" },
    subjects: [{ kind: "ServiceAccount", name: "elector", namespace: ns }],
  } as KubeObject);
  const { status } = await admin.request<{ status: { token: string } }>(
    "POST",
    `/api/v1/namespaces/${ns}/serviceaccounts/elector/token`,
    { body: { apiVersion: "authentication.k8s.io/v1", kind: "TokenRequest", spec: { expirationSeconds: 3600 } } },
  );
  const config = parse(await Deno.readTextFile(kubeconfig));
  for (const u of config.users) u.user = { token: status.token };
  const path = await Deno.makeTempFile({ prefix: "qsp-leader-", suffix: ".kubeconfig" });
  await Deno.writeTextFile(path, stringify(config), { mode: 0o600 });
  return path;
}

interface Contender {
  id: string;
  proxy: FaultInjector;
  client: KubeClient;
  /** Resolves with the leadership, stamped with when it was won. */
  campaign(): Promise<{ leadership: Leadership; at: number }>;
  stop(): void;
}

Deno.test("leader: one leads; a release hands over within a retry; a leader that goes dark is replaced after the lease", async () => {
  const env = await testEnv();
  const admin = await KubeClient.load(env.kubeconfig);
  const ns = await freshNamespace(admin, "klead");
  const kubeconfig = await leaseOnlyKubeconfig(admin, env.kubeconfig, ns);
  const contenders: Contender[] = [];
  const held: Leadership[] = [];
  try {
    for (const id of ["a", "b"]) {
      const proxy = await FaultInjector.forKubeconfig(kubeconfig);
      const client = await proxy.client(kubeconfig);
      const abort = new AbortController();
      const opts: LeaderOptions = {
        namespace: ns,
        name: "qsp-leader-test",
        identity: id,
        leaseDurationMs: LEASE_MS,
        renewDeadlineMs: RENEW_DEADLINE_MS,
        retryPeriodMs: RETRY_MS,
        log: createLogger({ level: Deno.env.get("QSP_TEST_LOG") ? "debug" : "error" }).child({ elector: id }),
      };
      contenders.push({
        id,
        proxy,
        client,
        async campaign() {
          const leadership = await acquireLeadership(client, opts, abort.signal);
          assert.ok(leadership, `${id} stopped campaigning`);
          held.push(leadership);
          return { leadership, at: performance.now() };
        },
        stop: () => abort.abort(),
      });
    }
    const holder = async () =>
      (await admin.get<KubeObject & { spec: { holderIdentity?: string } }>(COORDINATION_LEASES, ns, "qsp-leader-test"))
        .spec.holderIdentity;

    // Both campaign; exactly one wins, and the other stays out while the winner renews.
    const campaigns = contenders.map((c) => c.campaign().then((won) => ({ c, ...won })));
    const first = await Promise.race(campaigns);
    const second = campaigns[contenders.indexOf(first.c) === 0 ? 1 : 0];
    let secondWon: number | undefined;
    second.then((w) => secondWon = w.at, () => {});
    await new Promise((r) => setTimeout(r, LEASE_MS + 1000));
    assert.equal(secondWon, undefined, "two leaders at once");
    assert.equal(await holder(), first.c.id);
    assert.ok(!first.leadership.lost.aborted);

    // A release hands over within about one retry period.
    const released = performance.now();
    await first.leadership.release();
    const next = await second;
    const handover = next.at - released;
    assert.equal(await holder(), next.c.id);
    assert.ok(handover < RETRY_MS + 1000, `handover took ${secs(handover)}`);

    // The new leader's network goes dark: it must notice within the renew deadline, and only then may the old one,
    // campaigning again, take over (a full lease duration after it last saw the lease change).
    const comeback = first.c.campaign();
    await new Promise((r) => setTimeout(r, 2 * RETRY_MS));
    next.c.proxy.silence();
    const dark = performance.now();
    let lostAt: number | undefined;
    next.leadership.lost.addEventListener("abort", () => lostAt = performance.now());
    const back = await comeback;
    await waitFor(() => lostAt, { what: "the dark leader to give up", timeoutMs: 1000, intervalMs: 20 });
    const lostAfter = lostAt! - dark;
    const takeoverAfter = back.at - dark;
    console.log(
      `release handover ${secs(handover)}; leader gone dark: it gave up after ${secs(lostAfter)}, ` +
        `the other took over after ${secs(takeoverAfter)} (lease ${secs(LEASE_MS)}, ` +
        `renew deadline ${secs(RENEW_DEADLINE_MS)}, retry ${secs(RETRY_MS)})`,
    );
    assert.ok(lostAt! < back.at, "the old leader was still leading when the new one took over");
    assert.ok(lostAfter <= RENEW_DEADLINE_MS + 200, `gave up after ${secs(lostAfter)}`);
    assert.ok(takeoverAfter >= LEASE_MS - RETRY_MS - 200, `took over after only ${secs(takeoverAfter)}`);
    assert.ok(takeoverAfter <= LEASE_MS + 2 * RETRY_MS + 500, `took over after ${secs(takeoverAfter)}`);
    assert.equal(await holder(), first.c.id);
    next.c.proxy.resume();
  } finally {
    for (const c of contenders) c.stop();
    for (const l of held) await l.release();
    for (const c of contenders) {
      await c.proxy.close();
      c.client.close();
    }
    admin.close();
    await Deno.remove(kubeconfig);
  }
});
