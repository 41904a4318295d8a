/**
 * End to end, more than one lab host and the ways instances leave one: a second ExporterSet on another host, a set
 * moved between hosts, the orphan sweep, an Exporter deleted by hand, and teardown while a host is unreachable.
 */
import assert from "node:assert/strict";
import { waitFor } from "./env.ts";
import {
  applySeed,
  CLASS,
  cond,
  createClass,
  createKeySecret,
  createSet,
  events,
  exporters,
  getSet,
  hostHas,
  knownHostsAs,
  ownedBy,
  plugIn,
  SECOND_HOST,
  seconds,
  SEED_HOST,
  SET,
  unplug,
  waitReady,
  waitStandinUp,
  type World,
  world,
} from "./e2e_world.ts";
import { EXPORTER_SETS, EXPORTERS } from "../src/kube/resources.ts";
import type { Exporter, ExporterSet } from "../src/api/types.ts";
import { renderInstance } from "../src/host/render.ts";
import { applyForFacts } from "../src/host/lab.ts";
import { resolveParams } from "../src/provision/params.ts";
import type { LabTarget } from "../src/provision/credentials.ts";
import { HOST_ANNOTATION } from "../src/provision/marks.ts";

const opts = { sanitizeOps: false, sanitizeResources: false };
const SET2 = "aarch64-ssh-pool-h2";

/** A second set over the same class, on another host (step 4's "create additional ExporterSets"). */
const secondSet = (w: World, host: string) =>
  createSet(w, (s) => {
    s.metadata.name = SET2;
    s.spec.parameters = { host: { name: host } };
  });

Deno.test({
  name: "e2e: a second ExporterSet deploys to another host; changing a set's host moves its instances",
  ...opts,
  async fn() {
    const w = await world();
    try {
      await applySeed(w);
      await secondSet(w, w.host2.address);
      const [a] = await waitReady(w, 1, SET);
      const [b] = await waitReady(w, 1, SET2);
      await waitStandinUp(w.host, a.metadata.name!);
      await waitStandinUp(w.host2, b.metadata.name!);
      assert.equal(b.metadata.annotations?.[HOST_ANNOTATION], w.host2.address);
      assert.equal(await hostHas(w.host, b.metadata.name!), false, "the second set's instance is not on host 1");
      assert.equal(await hostHas(w.host2, a.metadata.name!), false, "the first set's instance is not on host 2");

      const t0 = performance.now();
      await w.client.mergePatch(EXPORTER_SETS, w.ns, SET2, { spec: { parameters: { host: { name: SEED_HOST } } } });
      await waitFor(async () => {
        const e = (await exporters(w)).find((x) => x.metadata.name === b.metadata.name);
        return e?.metadata.annotations?.[HOST_ANNOTATION] === SEED_HOST;
      }, { what: "the instance deployed on the new host", timeoutMs: 60_000 });
      await waitStandinUp(w.host, b.metadata.name!);
      console.log(`  instance moved to the other host in ${seconds(t0)}`);
      assert.equal(await hostHas(w.host2, b.metadata.name!), false, "removed from the old host");
      assert.deepEqual(
        (await exporters(w)).map((e) => e.metadata.name).sort(),
        [a, b].map((e) => e.metadata.name).sort(),
      );
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: the orphan sweep removes instances no Exporter owns, and leaves other namespaces alone",
  ...opts,
  async fn() {
    const w = await world();
    const target = await labTarget(w);
    const foreign = instance(w, `t-${crypto.randomUUID().slice(0, 8)}`, "ghost-foreign");
    try {
      await applySeed(w);
      const [e] = await waitReady(w, 1);
      const ghost = instance(w, w.ns, `ghost-${crypto.randomUUID().slice(0, 6)}`);
      let t0 = performance.now();
      for (const i of [ghost, foreign]) {
        const opts = { kvmRequired: false, keepExited: false };
        const r = await applyForFacts(w.hosts, target, (f) => renderInstance(i, f), undefined, opts);
        assert.deepEqual(r.outcome.errors, []);
      }
      console.log(`  two instances applied directly in ${seconds(t0)}`);
      t0 = performance.now();
      assert.equal(await w.controller.sweep(), 1);
      console.log(`  sweep took ${seconds(t0)}`);
      assert.equal(await hostHas(w.host, ghost.name), false, "the ghost is gone");
      assert.equal(await hostHas(w.host, foreign.name), true, "another namespace's instance is not ours to judge");
      assert.equal(await hostHas(w.host, e.metadata.name!), true, "the set's own instance stays");

      // An Exporter deleted behind the controller's back (finalizer stripped): its instance is left on the host.
      const name = e.metadata.name!;
      await w.client.mergePatch(EXPORTERS, w.ns, name, { metadata: { finalizers: null } });
      await w.client.delete(EXPORTERS, w.ns, name);
      await waitFor(() => !w.controller.caches.exporters.get(w.ns, name), { what: "the Exporter gone from the cache" });
      const [replacement] = await waitReady(w, 1);
      assert.notEqual(replacement.metadata.name, name);
      assert.equal(await hostHas(w.host, name), true, "left behind");
      assert.equal(await w.controller.sweep(), 1);
      assert.equal(await hostHas(w.host, name), false, "swept");
      assert.equal(await hostHas(w.host, replacement.metadata.name!), true, "the replacement stays");
    } finally {
      await w.hosts.remove(target, foreign.name).catch(() => {});
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: an Exporter deleted by hand is torn down on the host first, then replaced",
  ...opts,
  async fn() {
    const w = await world();
    try {
      await applySeed(w);
      const [e] = await waitReady(w, 1);
      const name = e.metadata.name!;
      await waitStandinUp(w.host, name);
      const t0 = performance.now();
      await w.client.delete(EXPORTERS, w.ns, name);
      const [fresh] = await waitFor(async () => {
        const es = await exporters(w);
        return es.length === 1 && es[0].metadata.name !== name ? es : undefined;
      }, { what: "the old Exporter gone and a replacement created", timeoutMs: 60_000 });
      console.log(`  torn down and replaced in ${seconds(t0)}`);
      assert.equal(await hostHas(w.host, name), false, "nothing of the old instance is left");
      await waitReady(w, 1);
      await waitStandinUp(w.host, fresh.metadata.name!);
      await w.controller.recorder.flush();
      const evs = await events(w);
      const tornDown = evs.find((x) => x.reason === "TornDown" && x.message.includes(name));
      assert.ok(tornDown, "a TornDown event");
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: teardown waits for an unreachable host (finalizer kept, Degraded) without holding up other hosts",
  ...opts,
  async fn() {
    // Short keepalives so that the test notices the dead connection in seconds (production: 15 s x 3).
    const w = await world({ pool: { keepaliveIntervalMs: 1_000, keepaliveCountMax: 2, connectTimeoutMs: 3_000 } });
    try {
      await applySeed(w);
      await secondSet(w, SECOND_HOST);
      const [a] = await waitReady(w, 1, SET);
      const [b] = await waitReady(w, 1, SET2);
      const name = b.metadata.name!;
      await waitStandinUp(w.host2, name);

      await unplug(w.host2);
      try {
        // By hand, while the host is away: the Exporter stays, the set says why.
        const t0 = performance.now();
        await w.client.delete(EXPORTERS, w.ns, name);
        const s = await waitFor(async () => {
          const s = await getSet(w, SET2);
          return cond(s, "Degraded")?.reason === "TeardownFailed" ? s : undefined;
        }, { what: `${SET2} Degraded TeardownFailed`, timeoutMs: 60_000 });
        console.log(`  teardown failure reported after ${seconds(t0)}`);
        assert.match(cond(s, "Degraded")!.message!, new RegExp(`teardown of ${name} on root@${SECOND_HOST}:22 failed`));
        const kept = await w.client.get<Exporter>(EXPORTERS, w.ns, name);
        assert.ok(kept.metadata.deletionTimestamp && kept.metadata.finalizers?.length, "kept by its finalizer");

        // Meanwhile the set on the healthy host still follows its spec promptly.
        const t1 = performance.now();
        await w.client.mergePatch(EXPORTER_SETS, w.ns, SET, { spec: { minAvailableReplicas: 2 } });
        await waitReady(w, 2, SET, 30_000);
        console.log(`  the healthy host's set scaled up in ${seconds(t1)} while the other host was away`);

        // Then the whole set goes, still while the host is away: nothing is forgotten.
        await w.client.delete(EXPORTER_SETS, w.ns, SET2);
        await waitFor(async () => {
          const mine = (await exporters(w)).filter((e) => ownedBy(e, SET2));
          return mine.length > 0 && mine.every((e) => e.metadata.deletionTimestamp);
        }, { what: `${SET2}'s Exporters marked for deletion`, timeoutMs: 30_000 });
        await waitFor(async () => {
          await w.controller.recorder.flush();
          return (await events(w)).some((e) => e.type === "Warning" && e.reason === "TeardownFailed");
        }, { what: "a TeardownFailed Warning event", timeoutMs: 30_000 });
        assert.ok((await exporters(w)).some((e) => e.metadata.name === name), "still kept by its finalizer");
        const t3 = performance.now();
        assert.equal(await w.controller.sweep(), 0, "the sweep gets past the unreachable host");
        console.log(`  orphan sweep with one host away took ${seconds(t3)}`);
      } finally {
        await plugIn(w.host2);
      }
      const t2 = performance.now();
      await waitFor(async () => !(await exporters(w)).some((e) => ownedBy(e, SET2)), {
        what: `${SET2}'s Exporters gone once the host is back`,
        timeoutMs: 60_000,
      });
      console.log(`  teardown completed ${seconds(t2)} after the host came back`);
      assert.equal(await hostHas(w.host2, name), false, "nothing left on the host");
      assert.equal(await hostHas(w.host, a.metadata.name!), true, "the other host is untouched");
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: a set moved off an unreachable host starts a fresh exporter on the new one; the old goes when back",
  ...opts,
  async fn() {
    const w = await world({ pool: { keepaliveIntervalMs: 1_000, keepaliveCountMax: 2, connectTimeoutMs: 3_000 } });
    try {
      await createKeySecret(w);
      await createClass(w);
      await secondSet(w, SECOND_HOST);
      const [b] = await waitReady(w, 1, SET2);
      const name = b.metadata.name!;
      await waitStandinUp(w.host2, name);

      await unplug(w.host2);
      try {
        const t0 = performance.now();
        await w.client.mergePatch(EXPORTER_SETS, w.ns, SET2, { spec: { parameters: { host: { name: SEED_HOST } } } });
        const [fresh] = await waitFor(async () => {
          const mine = (await exporters(w)).filter((e) => ownedBy(e, SET2) && !e.metadata.deletionTimestamp);
          return mine.length === 1 && mine[0].metadata.name !== name &&
              mine[0].metadata.annotations?.[HOST_ANNOTATION] === SEED_HOST
            ? mine
            : undefined;
        }, { what: "a fresh exporter deployed on the new host", timeoutMs: 60_000 });
        await waitStandinUp(w.host, fresh.metadata.name!);
        console.log(`  fresh exporter up on the new host ${seconds(t0)} after the move`);
        const old = await w.client.get<Exporter>(EXPORTERS, w.ns, name);
        assert.ok(old.metadata.deletionTimestamp, "the old Exporter is being deleted, kept by its finalizer");
        await w.controller.recorder.flush();
        assert.ok((await events(w)).some((e) => e.reason === "MoveBlocked" && e.message.includes(name)));
      } finally {
        await plugIn(w.host2);
      }
      const t1 = performance.now();
      await waitFor(async () => !(await exporters(w)).some((e) => e.metadata.name === name), {
        what: "the old Exporter gone once its host is back",
        timeoutMs: 60_000,
      });
      console.log(`  old instance removed ${seconds(t1)} after its host came back`);
      assert.equal(await hostHas(w.host2, name), false);
    } finally {
      await w.stop();
    }
  },
});

/** The SSH target of the first lab host, as the controller sees it, for direct LabHosts calls. */
async function labTarget(w: World): Promise<LabTarget> {
  return {
    namespace: w.ns,
    host: SEED_HOST,
    port: 22,
    user: "root",
    privateKey: await Deno.readTextFile(w.host.privateKeyPath),
    knownHosts: await knownHostsAs(w.host, SEED_HOST),
    hostKeyPolicy: "Strict",
  };
}

/** An instance of the seed's class that no Exporter owns. */
function instance(w: World, namespace: string, name: string) {
  const cls = { metadata: { name: CLASS, namespace: w.ns }, spec: { provisioner: "qemu-ssh.jumpstarter.dev" } };
  const set = { metadata: { name: SET, namespace: w.ns }, spec: { virtualTargetClassName: CLASS } } as ExporterSet;
  const resolved = resolveParams({ ...cls, spec: { ...cls.spec, parameters: { host: { name: SEED_HOST } } } }, set);
  if (!resolved.ok) throw new Error(JSON.stringify(resolved.errors));
  return {
    namespace,
    name,
    uid: crypto.randomUUID(),
    setName: SET,
    params: resolved.params,
    drivers: [],
    exitOnLeaseEnd: true,
    endpoint: "grpc.invalid:443",
    token: "not-a-token",
    caBundle: "",
    // written by this controller: the sweep removes only instances that name it
    controller: w.controller.ctx.identity,
  };
}
