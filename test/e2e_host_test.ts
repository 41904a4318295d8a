/**
 * End to end, what happens on the lab host after the first deploy: token rotation reloads the exporter without
 * touching QEMU, hand-made drift is repaired, and an exporter that ends after its lease is replaced (ExitAndReplace)
 * or started again (InPlaceReuse); one that ends with no lease ended is started again with back-off, not replaced.
 */
import assert from "node:assert/strict";
import { waitFor } from "./env.ts";
import {
  applySeed,
  cond,
  containerIdentity,
  events,
  exporters,
  getSet,
  hostHas,
  journal,
  seconds,
  SET,
  sh,
  unb64,
  unitStates,
  waitReady,
  waitStandinUp,
  type World,
  world,
} from "./e2e_world.ts";
import { EXPORTERS, JUMPSTARTER_LEASES, SECRETS } from "../src/kube/resources.ts";
import type { Exporter, Lease, Secret } from "../src/api/types.ts";

const opts = { sanitizeOps: false, sanitizeResources: false };

Deno.test({
  name: "e2e: a rotated token reaches the host by SIGHUP, QEMU keeps running, and no token leaks into the API",
  ...opts,
  async fn() {
    const w = await world();
    try {
      await applySeed(w);
      const [e] = await waitReady(w, 1);
      const name = e.metadata.name!;
      await waitStandinUp(w.host, name);
      const secretName = e.status!.credential!.name;
      const oldToken = unb64((await w.client.get<Secret>(SECRETS, w.ns, secretName)).data!.token);
      const before = await containerIdentity(w.host, name);
      const hupsBefore = (await journal(w.host, name)).split("SIGHUP, reloaded").length;

      const t0 = performance.now();
      const token = await w.fake.rotate(w.ns, name);
      await waitFor(async () => (await journal(w.host, name)).split("SIGHUP, reloaded").length > hupsBefore, {
        what: "the exporter to log its SIGHUP reload",
        timeoutMs: 30_000,
      });
      console.log(`  rotated token reloaded on the host after ${seconds(t0)}`);

      const config = await sh(w.host, `cat /etc/jumpstarter/exporters/${name}.yaml`);
      assert.match(config, new RegExp(`^token: ${token.replaceAll(".", "\\.")}$`, "m"));
      assert.ok(!config.includes(oldToken), "the old token is gone from the config");
      assert.equal(await containerIdentity(w.host, name), before, "neither container was restarted");
      assert.equal(await unitStates(w.host, name), "active active");
      // the exporter (the stand-in) re-read the config from its directory mount: it logs the reload path
      assert.match(await journal(w.host, name), /SIGHUP, reloaded \/etc\/jumpstarter\/exporters\//);

      // Neither token may appear in any Event of the namespace or any status we (or Jumpstarter) write.
      await w.controller.recorder.flush();
      const visible = JSON.stringify({
        events: await events(w),
        set: (await getSet(w)).status,
        exporters: (await exporters(w)).map((x) => ({ status: x.status, annotations: x.metadata.annotations })),
      });
      for (const t of [token, oldToken]) assert.ok(!visible.includes(t), "a token appears in an Event or a status");
      assert.ok(
        (await events(w)).some((ev) => ev.reason === "Updated" && ev.involvedObject.name === name),
        "an Updated event tells the config changed",
      );
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: drift on the host (a quadlet deleted, the units stopped by hand) is repaired at the next resync",
  ...opts,
  async fn() {
    const w = await world({ resyncMs: 2_000 });
    try {
      await applySeed(w);
      const [e] = await waitReady(w, 1);
      const name = e.metadata.name!;
      await waitStandinUp(w.host, name);

      const t0 = performance.now();
      // A resync can land between the daemon-reload and the stop: its start job then cancels the stop (systemctl
      // exits 1, "Job ... canceled"), and the repair is simply under way already.
      const stop = await sh(
        w.host,
        `rm /etc/containers/systemd/${name}-exporter.container && systemctl daemon-reload && ` +
          `{ systemctl stop ${name}-runtime.service ${name}-exporter.service 2>&1 && echo stopped || true; }`,
      );
      // "stopped": systemctl stop returned once both units were down. Their state is not read afterwards: with a 2 s
      // resync the repair may already have started them again by then.
      if (!stop.includes("stopped")) {
        assert.match(stop, /canceled/, "the stop failed only because a repair's start job replaced it");
      }
      await waitFor(async () => {
        const states = await unitStates(w.host, name);
        const quadlet = await sh(
          w.host,
          `test -f /etc/containers/systemd/${name}-exporter.container && echo ok || true`,
        );
        return states === "active active" && quadlet.trim() === "ok";
      }, { what: "the quadlet back and both units active again", timeoutMs: 30_000 });
      console.log(`  drift repaired after ${seconds(t0)}`);
      await waitStandinUp(w.host, name);
      assert.equal((await exporters(w)).length, 1, "repaired in place, not replaced");
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: ExitAndReplace: once Jumpstarter ends the lease the instance is torn down and replaced by a fresh one",
  ...opts,
  async fn() {
    // A long resync: the replacement must follow Jumpstarter's word that the lease ended, not a timer. The exporter
    // need not exit by itself (released exporters ignore exitOnLeaseEnd).
    const w = await world({ resyncMs: 600_000 });
    try {
      await applySeed(w);
      const [e] = await waitReady(w, 1);
      const name = e.metadata.name!;
      await waitStandinUp(w.host, name);

      // every version of the Exporter from here on, to see what it was when its deletion began
      const versions: Exporter[] = [];
      const stop = new AbortController();
      const watched = (async () => {
        const query = { fieldSelector: `metadata.name=${name}`, resourceVersion: e.metadata.resourceVersion };
        for await (const ev of w.client.watch<Exporter>(EXPORTERS, w.ns, query, stop.signal)) versions.push(ev.object);
      })().catch((err) => {
        if (!stop.signal.aborted) throw err;
      });

      const t0 = performance.now();
      await endedLease(w, name);

      const [fresh] = await waitFor(async () => {
        const es = await exporters(w);
        return es.length === 1 && es[0].metadata.name !== name ? es : undefined;
      }, { what: "a fresh exporter replacing the exited one", timeoutMs: 60_000 });
      await waitReady(w, 1);
      await waitStandinUp(w.host, fresh.metadata.name!);
      console.log(`  exited exporter replaced and the replacement up after ${seconds(t0)}`);
      assert.equal(await hostHas(w.host, name), false, "the exited instance is gone from the host");
      stop.abort();
      await watched;
      // #935: disabled first, so that no new lease lands on it while it goes
      const deleting = versions.find((v) => v.metadata.deletionTimestamp);
      assert.ok(deleting, `its deletion was seen: ${versions.length} versions`);
      assert.equal(deleting.spec?.enabled, false, "disabled before its deletion began");
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: ExitAndReplace: an exporter that exited by itself is replaced once its lease is reported ended",
  ...opts,
  async fn() {
    const w = await world({ resyncMs: 2_000 });
    try {
      await applySeed(w);
      const [e] = await waitReady(w, 1);
      const name = e.metadata.name!;
      await waitStandinUp(w.host, name);
      const t0 = performance.now();
      await sh(w.host, `podman stop ${name}-exporter >/dev/null`);
      await endedLease(w, name);
      await waitFor(async () => {
        const es = await exporters(w);
        return es.length === 1 && es[0].metadata.name !== name ? es : undefined;
      }, { what: "a fresh exporter replacing the exited one", timeoutMs: 60_000 });
      await waitReady(w, 1);
      console.log(`  exited exporter replaced after ${seconds(t0)}`);
      assert.equal(await hostHas(w.host, name), false, "the exited instance is gone from the host");
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: InPlaceReuse: an exporter that ended is started again in place at the next resync",
  ...opts,
  async fn() {
    const w = await world({ resyncMs: 2_000 });
    try {
      await applySeed(w, (s) => s.spec.recycleStrategy = "InPlaceReuse");
      const [e] = await waitReady(w, 1);
      const name = e.metadata.name!;
      assert.match(await waitStandinUp(w.host, name), /exitOnLeaseEnd=false/);
      const runtimeBefore = (await containerIdentity(w.host, name)).split("\n")[0];

      const t0 = performance.now();
      await sh(w.host, `podman stop ${name}-exporter >/dev/null`);
      await waitFor(async () => (await unitStates(w.host, name)) === "active active", {
        what: "the exporter unit active again",
        timeoutMs: 30_000,
      });
      console.log(`  exporter started again after ${seconds(t0)}`);
      const es = await exporters(w);
      assert.deepEqual(es.map((x) => x.metadata.name), [name], "the same exporter, not a replacement");
      assert.equal((await containerIdentity(w.host, name)).split("\n")[0], runtimeBefore, "QEMU kept running");
      await waitFor(async () => (await getSet(w, SET)).status?.readyReplicas === 1, {
        what: "the status to show the exporter ready again",
        timeoutMs: 30_000,
      });
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: ExitAndReplace: an exporter that exits with no lease ended is started again with back-off, then reported",
  ...opts,
  async fn() {
    // `jmp run` exits 0 when it cannot reach the controller: a clean exit is no evidence that a lease ended
    const w = await world({ resyncMs: 2_000 });
    try {
      await applySeed(w);
      const [e] = await waitReady(w, 1);
      const name = e.metadata.name!;
      const t0 = performance.now();
      const starts: number[] = [];
      for (let i = 1; i <= 3; i++) {
        await waitFor(async () => (await unitStates(w.host, name)) === "active active", {
          what: `the exporter running (start ${i})`,
          timeoutMs: 60_000,
        });
        starts.push(performance.now());
        await sh(w.host, `podman stop ${name}-exporter >/dev/null`);
      }
      const failing = await waitFor(async () => {
        const c = cond(await getSet(w), "Degraded");
        return c?.reason === "ExporterFailing" ? c : undefined;
      }, { what: "the set to report the failing exporter", timeoutMs: 90_000 });
      const gaps = starts.slice(1).map((t, i) => ((t - starts[i]) / 1000).toFixed(1));
      console.log(`  gaps between starts ${gaps.join(" s, ")} s; reported after ${seconds(t0)}`);
      assert.match(
        failing.message ?? "",
        new RegExp(`${name}: the exporter went down 3 times without its lease ending`),
      );
      assert.match(failing.message ?? "", /last lines: .*standin-exporter/, "the journal says why");
      assert.deepEqual((await exporters(w)).map((x) => x.metadata.name), [name], "never replaced without a lease end");
      assert.ok(starts[2] - starts[1] > starts[1] - starts[0], "each start waits longer than the one before");
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: an exporter that gave up on a controller that was not ready (exit 0) is started again within seconds",
  ...opts,
  async fn() {
    // Why 6 of issue 18. The resync is far away: only the close check of an exporter not yet Online can notice, as
    // Jumpstarter never saw it online and the exit is clean (Restart=on-failure leaves it down).
    const w = await world({ resyncMs: 600_000 });
    try {
      await applySeed(w);
      const [e] = await waitReady(w, 1);
      const name = e.metadata.name!;
      await waitStandinUp(w.host, name);
      const starts = async () => (await journal(w.host, name)).split("standin-exporter: starting").length - 1;
      // the endpoint of a controller that is not ready: the stand-in fails 5 times and exits 0, as `jmp run` does
      await w.client.mergePatch(
        EXPORTERS,
        w.ns,
        name,
        { status: { endpoint: "jumpstarter.unready.invalid:443" } },
        "status",
      );
      await waitFor(async () => (await journal(w.host, name)).includes("exiting with status 0"), {
        what: "the exporter to give up on its controller",
        timeoutMs: 60_000,
      });
      const t0 = performance.now();
      const before = await starts();
      await waitFor(async () => (await starts()) > before, {
        what: "the exporter started again after its clean exit (the resync is 10 minutes away)",
        timeoutMs: 60_000,
      });
      console.log(`  exited exporter started again after ${seconds(t0)}`);
      // it keeps giving up: started again with back-off, then reported, never replaced
      const failing = await waitFor(async () => {
        const c = cond(await getSet(w), "Degraded");
        return c?.reason === "ExporterFailing" ? c : undefined;
      }, { what: "the set to report the failing exporter", timeoutMs: 120_000 });
      assert.match(failing.message ?? "", /went down 3 times without its lease ending/);
      assert.deepEqual((await exporters(w)).map((x) => x.metadata.name), [name], "never replaced without a lease end");
    } finally {
      await w.stop();
    }
  },
});

/** What Jumpstarter records when a lease of the exporter is over: a Lease naming it, with status.ended. */
async function endedLease(w: World, exporter: string): Promise<void> {
  const lease = await w.client.create<Lease>(JUMPSTARTER_LEASES, {
    metadata: { generateName: "lease-", namespace: w.ns },
    spec: { selector: { matchLabels: { board: "aarch64-qemu" } } },
  });
  await w.client.mergePatch<Lease>(JUMPSTARTER_LEASES, w.ns, lease.metadata.name!, {
    status: { exporterRef: { name: exporter }, ended: true },
  }, "status");
}
