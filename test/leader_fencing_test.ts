/**
 * Fencing: a leader that can no longer renew its Lease stops writing to hosts and to the API before a standby can
 * take over. Real API server (the old leader's link to it goes through a FaultInjector that silences it) and a real
 * lab host, reached through the same LabHosts and SshPool the controller uses.
 */
import assert from "node:assert/strict";
import type { ConfigMap } from "../src/api/types.ts";
import { KubeClient } from "../src/kube/client.ts";
import { acquireLeadership, fencedApi, type LeaderOptions, type Leadership } from "../src/kube/leader.ts";
import { CONFIG_MAPS } from "../src/kube/resources.ts";
import { LabHosts } from "../src/host/lab.ts";
import { SshError, SshPool } from "../src/host/ssh.ts";
import { createLogger } from "../src/observe/log.ts";
import { freshNamespace, testEnv } from "./env.ts";
import { directTarget } from "./e2e_world.ts";
import { FaultInjector } from "./faultproxy.ts";

const LEASE_MS = 3000;
const RENEW_DEADLINE_MS = 2000;
const RETRY_MS = 500;
/** How often the test samples the pool's count of commands started. */
const SAMPLE_MS = 10;

Deno.test("leader fencing: a leader gone dark starts no host command or API write once a standby could lead", async () => {
  const env = await testEnv();
  const admin = await KubeClient.load(env.kubeconfig);
  const ns = await freshNamespace(admin, "fence");
  const proxy = await FaultInjector.forKubeconfig(env.kubeconfig);
  const darkClient = await proxy.client(env.kubeconfig);
  const standbyClient = await KubeClient.load(env.kubeconfig);
  const campaigns = new AbortController();
  const opts = (identity: string): LeaderOptions => ({
    namespace: ns,
    name: "qsp-fencing-test",
    identity,
    leaseDurationMs: LEASE_MS,
    renewDeadlineMs: RENEW_DEADLINE_MS,
    retryPeriodMs: RETRY_MS,
    log: createLogger({ level: Deno.env.get("QSP_TEST_LOG") ? "debug" : "error" }).child({ elector: identity }),
  });
  const pool = new SshPool();
  const target = await directTarget(env.labhosts[0]);
  let working = true;
  const held: Leadership[] = [];
  try {
    const old = await acquireLeadership(darkClient, opts("old"), campaigns.signal);
    assert.ok(old);
    held.push(old);
    const standby = acquireLeadership(standbyClient, opts("standby"), campaigns.signal)
      .then((l) => ({ leadership: l!, at: performance.now() }));
    const hosts = new LabHosts(pool, { fence: old.lost });
    const api = fencedApi(admin, old.lost);
    let lostAt: number | undefined;
    old.lost.addEventListener("abort", () => lostAt = performance.now());

    // The old leader keeps its host busy: inspections back to back, and one long command (killed if fenced).
    const marker = `/tmp/qsp-fenced-${crypto.randomUUID().slice(0, 8)}`;
    const long = pool.exec(target, `sleep 30; touch ${marker}`, { signal: old.lost }).then(
      () => ({ at: performance.now(), error: undefined }),
      (error: unknown) => ({ at: performance.now(), error }),
    );
    const refused: unknown[] = [];
    const pause = () => new Promise((r) => setTimeout(r, SAMPLE_MS));
    const inspecting = (async () => {
      // a refusal comes at once: pausing after it keeps the loop from starving the timers
      while (working) await hosts.inspect(target).catch((e) => (refused.push(e), pause()));
    })();
    let writes = 0;
    let lastWrite = 0;
    const writing = (async () => {
      while (working) {
        const at = performance.now();
        await api.create<ConfigMap>(CONFIG_MAPS, { metadata: { generateName: "w-", namespace: ns } })
          .then(() => (writes++, lastWrite = at), (e) => refused.push(e));
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    let lastStart = { at: performance.now(), commands: pool.stats().commands };
    const sampling = (async () => {
      while (working) {
        const commands = pool.stats().commands;
        if (commands !== lastStart.commands) lastStart = { at: performance.now(), commands };
        await pause();
      }
    })();

    await new Promise((r) => setTimeout(r, 2 * RETRY_MS));
    const startedWhileLeading = pool.stats().commands;
    const writesWhileLeading = writes;
    proxy.silence();
    const dark = performance.now();
    const next = await standby;
    await new Promise((r) => setTimeout(r, 2 * RETRY_MS));
    working = false;
    await Promise.all([inspecting, writing, sampling]);
    const killed = await long;

    console.log(
      `  gone dark at 0 s: fenced after ${((lostAt! - dark) / 1000).toFixed(2)} s, last host command started at ` +
        `${((lastStart.at - dark) / 1000).toFixed(2)} s, standby took over at ${
          ((next.at - dark) / 1000).toFixed(2)
        } s`,
    );
    assert.ok(startedWhileLeading > 1 && writesWhileLeading > 0, "the old leader did work while it led");
    assert.ok(lostAt !== undefined && lostAt < next.at, "fenced before the standby took over");
    assert.ok(lostAt - dark <= RENEW_DEADLINE_MS + 100, `fenced only ${lostAt - dark} ms after going dark`);
    assert.ok(lastStart.at <= lostAt + SAMPLE_MS + 50, "a host command started after the fence");
    assert.ok(lastStart.at < next.at, "a host command of the old leader started after the standby took over");
    assert.ok(refused.some((e) => e instanceof SshError), "host commands were refused once fenced");
    assert.ok(killed.error instanceof SshError, "the running command was aborted");
    assert.ok(killed.at < next.at, "the running command was aborted before the standby took over");
    assert.ok(lastWrite < lostAt, "an API write of the old leader started after the fence");
    const check = new SshPool();
    const probe = await check.exec(target, `test -e ${marker} && echo ran || echo killed`);
    await check.close();
    assert.equal(probe.stdout.trim(), "killed", "the long command ran on after the fence");
    held.push(next.leadership);
  } finally {
    working = false;
    campaigns.abort();
    for (const l of held) await l.release();
    await pool.close();
    await proxy.close();
    darkClient.close();
    standbyClient.close();
    admin.close();
  }
});
