/**
 * The feature description's examples, end to end: real API server, real lab host, the real controller (in this
 * process), the FakeJumpstarterController issuing credentials. Every step of "How it works" is checked where it
 * lands: in the API and on the host.
 */
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { hostExec } from "./labhost/labhost.ts";
import { EXPORTER_SETS, EXPORTERS, SECRETS } from "../src/kube/resources.ts";
import type { Secret } from "../src/api/types.ts";
import { FINALIZER, HOST_ANNOTATION, SET_LABEL } from "../src/provision/marks.ts";
import { waitFor } from "./env.ts";
import {
  applySeed,
  cond,
  createClass,
  createKeySecret,
  createSet,
  events,
  exporters,
  getSet,
  hostHas,
  ownedBy,
  SEED_HOST,
  SET,
  unitStates,
  waitReady,
  type World,
  world,
} from "./e2e_world.ts";

async function onHost(w: World, name: string) {
  const r = await hostExec(
    w.host,
    `systemctl is-active ${name}-runtime.service ${name}-exporter.service; ` +
      `ls /etc/containers/systemd/${name}-runtime.container /etc/containers/systemd/${name}-exporter.container ` +
      `/etc/jumpstarter/exporters/${name}.yaml 2>&1; podman volume exists jumpstarter-${name}-shared && echo volume; ` +
      `journalctl -o cat --no-pager -u ${name}-exporter.service | grep 'standin-exporter: name=' | tail -n 1`,
  );
  return r.stdout;
}

Deno.test({
  name: "e2e: the seed's ExporterSet deploys one warm exporter on the lab host, and deletion leaves nothing",
  sanitizeOps: false,
  sanitizeResources: false,
  async fn() {
    const w = await world();
    try {
      const t0 = performance.now();
      await applySeed(w);
      const set = await waitFor(async () => {
        const s = await getSet(w);
        return cond(s, "Available")?.status === "True" && s.status?.readyReplicas === 1 ? s : undefined;
      }, { what: "ExporterSet Available with 1 ready exporter", timeoutMs: 90_000 });
      console.log(`  seed set Available after ${((performance.now() - t0) / 1000).toFixed(1)}s`);
      assert.equal(set.status?.replicas, 1);
      assert.equal(set.status?.selector, `arch=aarch64,board=aarch64-qemu,${SET_LABEL}=${SET},virtual=true`);
      assert.equal(cond(set, "Degraded")?.status, "False");

      const [e] = await exporters(w);
      assert.match(e.metadata.name!, /^aarch64-ssh-pool-/);
      assert.deepEqual(
        { board: e.metadata.labels?.board, virtual: e.metadata.labels?.virtual, arch: e.metadata.labels?.arch },
        { board: "aarch64-qemu", virtual: "true", arch: "aarch64" },
      );
      assert.equal(e.spec?.enabled, true);
      assert.ok(e.metadata.finalizers?.includes(FINALIZER));
      assert.equal(e.metadata.annotations?.[HOST_ANNOTATION], SEED_HOST);
      assert.equal(e.metadata.ownerReferences?.[0].name, SET);

      const name = e.metadata.name!;
      const seen = await waitFor(async () => {
        const out = await onHost(w, name);
        return /launcher=ok tcp=ok kvm=present/.test(out) ? out : undefined;
      }, { what: "the exporter stand-in to reach its runtime", timeoutMs: 60_000 });
      assert.match(seen, /^active\nactive\n/);
      assert.match(seen, /volume/);
      assert.match(seen, /exitOnLeaseEnd=true/);
      assert.match(seen, /token=<set>/);

      // The feature description's troubleshooting commands show the instance on the host, as written there.
      const ps = await hostExec(w.host, `podman ps -a --filter "name=-(runtime|exporter)$" --format '{{.Names}}'`);
      assert.deepEqual(ps.stdout.trim().split("\n").filter((n) => n.startsWith(name)).sort(), [
        `${name}-exporter`,
        `${name}-runtime`,
      ]);
      const ls = await hostExec(
        w.host,
        "ls /etc/containers/systemd/*.container; cat /etc/jumpstarter/exporters/*.yaml",
      );
      assert.match(ls.stdout, new RegExp(`/etc/containers/systemd/${name}-runtime.container`));
      assert.match(ls.stdout, new RegExp(`name: ${name}\n`));

      // TOFU: the seed's Secret has no known_hosts, so the host key was pinned.
      const pinned = await w.client.get<Secret>(SECRETS, w.ns, "qemu-ssh-known-hosts");
      assert.match(Buffer.from(pinned.data!.known_hosts, "base64").toString(), new RegExp(`^${SEED_HOST} ssh-`, "m"));

      await w.client.delete(EXPORTER_SETS, w.ns, SET);
      await waitFor(async () => (await exporters(w)).length === 0, { what: "exporters gone", timeoutMs: 60_000 });
      assert.ok(!(await hostHas(w.host, name)), "no unit, container, volume or file left on the host");
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: a lease asks for another warm exporter; after the lease the surplus drains after the cooldown",
  sanitizeOps: false,
  sanitizeResources: false,
  async fn() {
    const w = await world();
    try {
      await applySeed(w, (s) => s.spec.scaleDownCooldown = "2s");
      const [first] = await waitReady(w, 1);
      // Jumpstarter marks a leased exporter in its status.
      await w.client.mergePatch(
        EXPORTERS,
        w.ns,
        first.metadata.name!,
        { status: { leaseRef: { name: "lease-1" } } },
        "status",
      );
      await waitFor(async () => {
        const s = await getSet(w);
        return s.status?.replicas === 2 && s.status?.leasedReplicas === 1 && s.status?.readyReplicas === 2;
      }, { what: "a second, ready exporter next to the leased one", timeoutMs: 90_000 });

      await w.client.mergePatch(EXPORTERS, w.ns, first.metadata.name!, { status: { leaseRef: null } }, "status");
      const left = await waitFor(async () => {
        const es = await exporters(w);
        return es.length === 1 ? es : undefined;
      }, { what: "scale down to one exporter after the cooldown", timeoutMs: 90_000 });
      assert.equal(left[0].metadata.name, first.metadata.name, "the older, warm exporter stays");
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: `kubectl scale` sets maxReplicas through the scale subresource; a lease over the cap is ScalingLimited",
  sanitizeOps: false,
  sanitizeResources: false,
  async fn() {
    const w = await world();
    try {
      await applySeed(w);
      const [first] = await waitReady(w, 1);
      // What `kubectl scale exportersets/aarch64-ssh-pool --replicas=1` sends.
      const path = `/apis/virtualtarget.jumpstarter.dev/v1alpha1/namespaces/${w.ns}/exportersets/${SET}/scale`;
      const scale = await w.client.request<
        { spec: { replicas: number }; status: { replicas: number; selector: string } }
      >(
        "GET",
        path,
      );
      assert.equal(scale.spec.replicas, 4);
      assert.equal(scale.status.selector, `arch=aarch64,board=aarch64-qemu,${SET_LABEL}=${SET},virtual=true`);
      await w.client.request("PATCH", path, {
        body: { spec: { replicas: 1 } },
        contentType: "application/merge-patch+json",
      });
      assert.equal((await getSet(w)).spec.maxReplicas, 1);
      await w.client.mergePatch(
        EXPORTERS,
        w.ns,
        first.metadata.name!,
        { status: { leaseRef: { name: "l" } } },
        "status",
      );
      const limited = await waitFor(async () => {
        const s = await getSet(w);
        return cond(s, "ScalingLimited")?.status === "True" ? s : undefined;
      }, { what: "ScalingLimited once a lease wants a second exporter over maxReplicas 1", timeoutMs: 60_000 });
      assert.equal(cond(limited, "ScalingLimited")?.reason, "AtMaxReplicas");
      assert.match(cond(limited, "ScalingLimited")!.message!, /raise maxReplicas/);
      assert.equal((await exporters(w)).length, 1, "no exporter beyond the cap");
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: reclaimPolicy Retain leaves the instances running when the set is deleted, and says so",
  sanitizeOps: false,
  sanitizeResources: false,
  async fn() {
    const w = await world();
    let name = "";
    try {
      await createKeySecret(w);
      await createClass(w, (c) => c.spec.reclaimPolicy = "Retain");
      await createSet(w);
      // a second set on the same host keeps that host in the orphan sweep
      await createSet(w, (s) => Object.assign(s.metadata, { name: "idle-pool" }) && (s.spec.minAvailableReplicas = 0));
      name = (await waitReady(w, 1))[0].metadata.name!;
      await w.client.delete(EXPORTER_SETS, w.ns, SET);
      await waitFor(async () => (await exporters(w)).every((e) => !ownedBy(e, SET)), {
        what: "the set's Exporters gone",
        timeoutMs: 60_000,
      });
      assert.equal(await w.controller.sweep(), 0, "the sweep leaves a retained instance alone");
      assert.equal(await unitStates(w.host, name), "active active", "still running on the host");
      // and so is its /disk, the guest's disks on it
      await hostExec(w.host, `podman volume exists jumpstarter-${name}-disk`).then((r) => assert.equal(r.code, 0));
      await hostExec(w.host, `test -f /var/lib/qemu-ssh.jumpstarter.dev/disks/${name}.img`).then((r) =>
        assert.equal(r.code, 0)
      );
      const retained = (await events(w)).find((e) => e.reason === "Retained");
      assert.match(retained?.message ?? "", new RegExp(`${name} keeps running on root@${SEED_HOST}:22`));
    } finally {
      await w.stop();
      if (name) {
        await hostExec(
          w.host,
          `systemctl stop ${name}-exporter ${name}-runtime; rm -rf /etc/containers/systemd/${name}-* /etc/jumpstarter/exporters/${name}*; podman rm -f ${name}-exporter ${name}-runtime; podman volume rm -f jumpstarter-${name}-shared jumpstarter-${name}-disk; rm -f /var/lib/qemu-ssh.jumpstarter.dev/disks/${name}.img; systemctl daemon-reload`,
        );
      }
    }
  },
});
