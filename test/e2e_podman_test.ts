/**
 * End to end on lab hosts whose Podman is not Debian 13's 5.4, each booted by the test on a lab network of its own: a
 * host with Podman 4.9.3 built from source (test/podman/build.sh; Ubuntu 24.04's version) gets the 4.4-5.3 quadlet
 * dialect (`Network=container:<runtime>`) from the facts the controller learns, and the seed's exporter reaches its
 * runtime's 127.0.0.1:2222 there; a Debian 12 host (Podman 4.3.1, no quadlet) is refused before anything is written,
 * with a condition naming the host, its version and the fix.
 */
import assert from "node:assert/strict";
import { privateLabNet, waitFor } from "./env.ts";
import { type LabHost, type LabNet, startLabHosts, stopLabHosts } from "./labhost/labhost.ts";
import {
  applySeed,
  cond,
  getSet,
  hostHas,
  seconds,
  SEED_HOST,
  SET,
  sh,
  waitReady,
  waitStandinUp,
  type World,
  world,
} from "./e2e_world.ts";
import { EXPORTER_SETS } from "../src/kube/resources.ts";

const opts = { sanitizeOps: false, sanitizeResources: false };

/** A world whose seed host is `host`: the alias points there and the key Secret holds that host's key. */
async function worldOn(net: LabNet): Promise<{ w: World; host: LabHost }> {
  const t0 = performance.now();
  const [host] = await startLabHosts(net, 1);
  console.log(`  lab host (${net.podman ? `podman ${net.podman}` : net.suite}) up in ${seconds(t0)}`);
  const w = await world();
  w.aliases[SEED_HOST] = host.address;
  return { w: { ...w, host }, host };
}

Deno.test({
  name: "e2e: Podman 4.9.3: the seed deploys with Network=container:, the exporter reaches its runtime, removal cleans",
  ...opts,
  async fn() {
    const net = { ...await privateLabNet(6), podman: "4.9.3" };
    let w: World | undefined;
    try {
      const on = await worldOn(net);
      w = on.w;
      const host = on.host;
      assert.match(await sh(host, "podman --version"), /^podman version 4\.9\.3$/m);
      const t0 = performance.now();
      await applySeed(w);
      const [e] = await waitReady(w, 1);
      const name = e.metadata.name!;
      // the stand-in exporter checks the launcher socket and the runtime's 127.0.0.1:2222 from its own container
      assert.match(await waitStandinUp(host, name), /launcher=ok tcp=ok/);
      console.log(`  ready and reaching its runtime after ${seconds(t0)}`);
      assert.equal(
        await sh(host, `grep -E '^(Network|Requires)=' /etc/containers/systemd/${name}-exporter.container`),
        `Requires=${name}-runtime.service\nNetwork=container:${name}-runtime\n`,
      );
      const nsOf = (c: string) => sh(host, `readlink /proc/$(podman inspect -f '{{.State.Pid}}' ${c})/ns/net`);
      assert.equal(await nsOf(`${name}-exporter`), await nsOf(`${name}-runtime`));
      assert.notEqual(
        cond(await getSet(w), "Degraded")?.status,
        "True",
        JSON.stringify(cond(await getSet(w), "Degraded")),
      );

      await w.client.delete(EXPORTER_SETS, w.ns, SET);
      await waitFor(async () => !(await hostHas(host, name)), {
        what: `${name} gone from the 4.9.3 host`,
        timeoutMs: 60_000,
      });
    } finally {
      await w?.stop();
      await stopLabHosts(net);
    }
  },
});

Deno.test({
  name:
    "e2e: Debian 12 (Podman 4.3.1, no quadlet): refused before anything is written, PodmanTooOld names host and fix",
  ...opts,
  async fn() {
    const net = { ...await privateLabNet(7), suite: "bookworm" };
    let w: World | undefined;
    try {
      const on = await worldOn(net);
      w = on.w;
      const host = on.host;
      const version = (await sh(host, "podman --version")).trim().split(" ").at(-1)!;
      assert.match(version, /^4\.3\.1/);
      await applySeed(w);
      const degraded = await waitFor(async () => {
        const c = cond(await getSet(w!), "Degraded");
        return c?.reason === "PodmanTooOld" ? c : undefined;
      }, { what: "the set to report PodmanTooOld", timeoutMs: 90_000 });
      console.log(`  Degraded: ${degraded.message}`);
      assert.match(
        degraded.message ?? "",
        new RegExp(
          `^${SET}-[a-z0-9]+: on ${SEED_HOST.replaceAll(".", "\\.")}: podman-too-old: podman ${
            version.replace(/[.+]/g, "\\$&")
          } ` +
            "is older than 4\\.4 and has no quadlet.*; upgrade podman to 4\\.4 or later",
        ),
      );
      // nothing of the instance, and not even the directories the apply would make
      assert.equal(
        await sh(host, "ls -A /etc/containers/systemd; test ! -e /etc/jumpstarter && echo no-jumpstarter-dir"),
        "no-jumpstarter-dir\n",
      );
      assert.equal(await sh(host, "podman volume ls -q"), "");
    } finally {
      await w?.stop();
      await stopLabHosts(net);
    }
  },
});
