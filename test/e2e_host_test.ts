/**
 * End to end, what happens on the lab host after the first deploy: token rotation reloads the exporter without
 * touching QEMU, hand-made drift is repaired, and an exporter that ends after its lease is replaced (ExitAndReplace)
 * or started again (InPlaceReuse).
 */
import assert from "node:assert/strict";
import { waitFor } from "./env.ts";
import {
  applySeed,
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
import { EXPORTERS, SECRETS } from "../src/kube/resources.ts";
import type { Exporter, Secret } from "../src/api/types.ts";

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
      await sh(
        w.host,
        `rm /etc/containers/systemd/${name}-exporter.container && systemctl daemon-reload && ` +
          `systemctl stop ${name}-runtime.service ${name}-exporter.service`,
      );
      assert.match(await unitStates(w.host, name), /^(inactive|failed) (inactive|failed)$/);
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
  name: "e2e: ExitAndReplace: an exporter that ended after its lease is torn down and replaced by a fresh one",
  ...opts,
  async fn() {
    // A long resync: the replacement must follow Jumpstarter's report that the exporter went offline, not a timer.
    const w = await world({ resyncMs: 600_000 });
    try {
      await applySeed(w);
      const [e] = await waitReady(w, 1);
      const name = e.metadata.name!;
      await waitStandinUp(w.host, name);

      // The exporter exits cleanly (exitOnLeaseEnd), as the stand-in does on SIGTERM; Jumpstarter notices it offline.
      const t0 = performance.now();
      await sh(w.host, `podman stop ${name}-exporter >/dev/null`);
      await waitFor(async () => (await unitStates(w.host, name)).endsWith(" inactive"), {
        what: "the exporter unit inactive after its clean exit",
        timeoutMs: 20_000,
      });
      await markOffline(w, name);

      const [fresh] = await waitFor(async () => {
        const es = await exporters(w);
        return es.length === 1 && es[0].metadata.name !== name ? es : undefined;
      }, { what: "a fresh exporter replacing the exited one", timeoutMs: 60_000 });
      await waitReady(w, 1);
      await waitStandinUp(w.host, fresh.metadata.name!);
      console.log(`  exited exporter replaced and the replacement up after ${seconds(t0)}`);
      assert.equal(await hostHas(w.host, name), false, "the exited instance is gone from the host");
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: ExitAndReplace without any report from Jumpstarter: the exited exporter is found at the next resync",
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

/** What Jumpstarter does when an exporter's connection ends: Online goes False, exporterStatus Offline. */
async function markOffline(w: World, name: string): Promise<void> {
  const now = new Date().toISOString();
  await w.client.mergePatch<Exporter>(EXPORTERS, w.ns, name, {
    status: {
      exporterStatus: "Offline",
      conditions: [{ type: "Online", status: "False", reason: "Disconnected", message: "", lastTransitionTime: now }],
    },
  }, "status");
}
