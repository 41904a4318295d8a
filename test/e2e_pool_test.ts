/**
 * End to end, one ExporterSet over a pool of three real lab hosts (parameters.hosts, slots 2, 2 and 4): the
 * instances spread by free slots; a host powered off loses its idle instances to the others within
 * hostFailureTimeout + 30 s while its leased one stays; back on, it is cleaned and nothing moves back; with every slot
 * taken the set is ScalingLimited, naming the hosts.
 */
import assert from "node:assert/strict";
import { privateLabNet, waitFor } from "./env.ts";
import {
  cond,
  createClass,
  createKeySecret,
  createSet,
  exporters,
  getSet,
  hostHas,
  lease,
  SET,
  unitStates,
  type World,
  world,
} from "./e2e_world.ts";
import { type LabHost, powerOffLabHost, powerOnLabHost, startLabHosts, stopLabHosts } from "./labhost/labhost.ts";
import { EXPORTER_SETS } from "../src/kube/resources.ts";
import type { Exporter } from "../src/api/types.ts";
import { HOST_ANNOTATION } from "../src/provision/marks.ts";
import { TARGET_ANNOTATION } from "../src/provision/targets.ts";

const opts = { sanitizeOps: false, sanitizeResources: false };
const FAILOVER_S = 20;

const live = async (w: World) => (await exporters(w)).filter((e) => !e.metadata.deletionTimestamp);
const hostOf = (e: Exporter) => /@(.+):\d+$/.exec(e.metadata.annotations?.[TARGET_ANNOTATION] ?? "")?.[1];
/** Live instances per host address, in the pool's order. */
const spread = async (w: World, hosts: LabHost[]) => {
  const es = await live(w);
  return hosts.map((h) => es.filter((e) => hostOf(e) === h.address).length);
};

Deno.test({
  name: "e2e: a pool of 3 lab hosts: spread by slots, failover of idle instances, nothing moves back, slots full",
  ...opts,
  async fn() {
    const net = await privateLabNet(5);
    let w: World | undefined;
    try {
      const hosts = await startLabHosts(net, 3);
      const base = await world({ resyncMs: 2_000, teardownGraceMs: 600_000 });
      w = { ...base, host: hosts[0] };
      await createKeySecret(w);
      await createClass(w, (c) => {
        const { host: _host, ...rest } = c.spec.parameters!;
        c.spec.parameters = {
          ...rest,
          hosts: [2, 2, 4].map((slots, i) => ({ name: hosts[i].address, slots })),
          hostFailureTimeout: `${FAILOVER_S}s`,
        };
      });
      await createSet(w, (s) => Object.assign(s.spec, { minReplicas: 6, minAvailableReplicas: 0, maxReplicas: 6 }));

      // 6 over slots 2, 2, 4 by most free slots (ties by name): 2, 1, 3
      const ready = await waitFor(async () => {
        const s = await getSet(w!);
        const es = await live(w!);
        return s.status?.readyReplicas === 6 && es.length === 6 &&
            es.every((e) => e.metadata.annotations?.[HOST_ANNOTATION])
          ? es
          : undefined;
      }, { what: "6 ready exporters over the pool", timeoutMs: 180_000 });
      assert.deepEqual(await spread(w, hosts), [2, 1, 3]);
      const s0 = await getSet(w);
      assert.deepEqual(s0.status?.hosts?.map((h) => [h.name, h.instances, h.slots, h.reachable]), [
        [hosts[0].address, 2, 2, true],
        [hosts[1].address, 1, 2, true],
        [hosts[2].address, 3, 4, true],
      ]);
      for (const e of ready) {
        const on = hosts.find((h) => h.address === hostOf(e))!;
        assert.equal(await unitStates(on, e.metadata.name!), "active active", `${e.metadata.name} on ${on.name}`);
      }

      // h1 powered off with one of its two instances leased
      const [leased, idle] = ready.filter((e) => hostOf(e) === hosts[0].address).map((e) => e.metadata.name!);
      await lease(w, leased);
      await powerOffLabHost(net, hosts[0].name);
      const off = Date.now();
      // replaced: deployed on another host, which the controller marks once it applied the instance there
      const replaced = await waitFor(async () => {
        const es = await live(w!);
        const others = es.filter((e) => hostOf(e) !== hosts[0].address);
        return !es.some((e) => e.metadata.name === idle) && others.length === 5 &&
          others.every((e) => e.metadata.annotations?.[HOST_ANNOTATION]) && es;
      }, { what: `the idle instance of ${hosts[0].name} replaced on the others`, timeoutMs: (FAILOVER_S + 30) * 1000 });
      const took = (Date.now() - off) / 1000;
      // the apply queued their starts and did not wait for them
      for (const e of replaced.filter((x) => hostOf(x) !== hosts[0].address)) {
        const on = hosts.find((h) => h.address === hostOf(e))!;
        await waitFor(async () => await unitStates(on, e.metadata.name!) === "active active", {
          what: `${e.metadata.name} up on ${on.name}`,
        });
      }
      console.log(`  replaced ${took.toFixed(1)}s after the power-off`);
      assert.ok(replaced.some((e) => e.metadata.name === leased), "the leased instance is kept");
      assert.deepEqual(await spread(w, hosts), [1, 2, 3], "the replacement went where there was room");
      const s1 = await waitFor(async () => {
        const s = await getSet(w!);
        return s.status?.hosts?.[0].reachable === false && cond(s, "Progressing")?.message?.includes(leased) && s;
      }, { what: "the set to report h1 unreachable and the leased instance held", timeoutMs: 30_000 });
      assert.match(cond(s1, "Progressing")!.message!, new RegExp(`${leased}: stays on ${hosts[0].address}`));
      assert.ok(s1.status?.hosts?.[0].lastError, "the host's last error is shown");

      // h1 back: the instance that left is removed there, the leased one stays, nothing moves back
      const placed = new Map(replaced.map((e) => [e.metadata.name!, hostOf(e)]));
      await powerOnLabHost(net, hosts[0]);
      await waitFor(async () => !(await hostHas(hosts[0], idle)), {
        what: `${idle} cleaned from ${hosts[0].name} once it is back`,
        timeoutMs: 90_000,
      });
      await waitFor(async () => (await getSet(w!)).status?.hosts?.[0].reachable === true, {
        what: `${hosts[0].name} reachable again in the status`,
        timeoutMs: 60_000,
      });
      const after = await live(w);
      assert.deepEqual(new Map(after.map((e) => [e.metadata.name!, hostOf(e)])), placed, "nothing moved back");

      // 9 wanted, 8 slots in the pool: 8 run, ScalingLimited names the hosts
      await w.client.mergePatch(EXPORTER_SETS, w.ns, SET, { spec: { minReplicas: 9, maxReplicas: 9 } });
      const limited = await waitFor(async () => {
        const s = await getSet(w!);
        return cond(s, "ScalingLimited")?.reason === "HostSlotsFull" && s;
      }, { what: "ScalingLimited HostSlotsFull", timeoutMs: 60_000 });
      const message = cond(limited, "ScalingLimited")!.message!;
      for (const h of hosts) assert.ok(message.includes(h.address), `${h.address} named in: ${message}`);
      await waitFor(async () => (await live(w!)).length === 8, {
        what: "8 exporters, the pool's slots",
        timeoutMs: 60_000,
      });
      assert.deepEqual(await spread(w, hosts), [2, 2, 4]);
    } finally {
      await w?.stop();
      await stopLabHosts(net);
    }
  },
});
