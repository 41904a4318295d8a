/**
 * The real chain, end to end: the real Jumpstarter controller (v0.7.1) issues the credentials, the real exporter
 * (jumpstarter 0.9.0 with QEMU, adapted only where test/jumpstarter/adapt-0.9.0-* says) runs on a lab host under the
 * production image tag, and a user leases the target with `jmp shell`. The seed's Secret, class and ExporterSet are
 * applied as written, in the seed's namespace.
 */
import { builtPath } from "./built.ts";
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { privateLabNet, seedExample, testEnv, waitFor } from "./env.ts";
import { ourController, SEED_HOST, SET, sh } from "./e2e_world.ts";
import { readClusterId } from "../src/run.ts";
import { hostExec, type LabHost, startLabHosts, stopLabHosts } from "./labhost/labhost.ts";
import { type RealJumpstarter, startRealJumpstarter } from "./jumpstarter/controller.ts";
import { KubeClient } from "../src/kube/client.ts";
import {
  EXPORTER_SETS,
  EXPORTERS,
  JUMPSTARTER_LEASES,
  SECRETS,
  VIRTUAL_TARGET_CLASSES,
} from "../src/kube/resources.ts";
import type { Exporter, ExporterSet, KubeObject, Lease } from "../src/api/types.ts";

const NS = "jumpstarter";
const EXPORTER_IMAGE = "quay.io/jumpstarter-dev/jumpstarter:latest";
const ROOT = new URL("../", import.meta.url).pathname;
const opts = { sanitizeOps: false, sanitizeResources: false, ignore: Deno.uid() !== 0 };
const secs = (t0: number) => `${((performance.now() - t0) / 1000).toFixed(1)} s`;

async function run(cmd: string, args: string[], env: Record<string, string> = {}, timeoutMs = 240_000) {
  const out = await new Deno.Command(cmd, {
    args,
    env,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(timeoutMs),
  }).output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 0, `${cmd} ${args.join(" ")}: exit ${out.code}\n${text}`);
  return text;
}

const online = (e: Exporter | undefined) =>
  e?.status?.conditions?.some((c) => c.type === "Online" && c.status === "True") ?? false;

/** The set's exporters once exactly one is Online as the real controller reports it, and it runs on the host. */
async function oneOnline(client: KubeClient, what: string, except?: string): Promise<Exporter> {
  return await waitFor(async () => {
    const es = (await client.list<Exporter>(EXPORTERS, NS)).items.filter((e) => !e.metadata.deletionTimestamp);
    return es.length === 1 && es[0].metadata.name !== except && online(es[0]) ? es[0] : undefined;
  }, { what, timeoutMs: 180_000 });
}

/** Start time and pid of the runtime container: unchanged means QEMU's container was not restarted. */
const runtimeIdentity = (host: LabHost, name: string) =>
  sh(host, `podman inspect --format '{{.State.StartedAt}} {{.State.Pid}}' ${name}-runtime`);

Deno.test(
  { name: "real chain: the seed as written, leased with jmp shell on the real Jumpstarter", ...opts },
  async (t) => {
    const env = await testEnv();
    const t0 = performance.now();
    const [image, jmp, marker] = await Promise.all([
      builtPath(`${ROOT}test/jumpstarter/image.sh`),
      builtPath(`${ROOT}test/jumpstarter/jmp.sh`),
      Deno.makeTempDir({ prefix: "qsp-real-" }),
    ]);
    console.log(`  images and client ready after ${secs(t0)}`);
    const net = { ...await privateLabNet(4), images: [{ tarball: image, tag: EXPORTER_IMAGE }] };
    const client = await KubeClient.load(env.kubeconfig);
    let js: RealJumpstarter | undefined;
    let ours: ReturnType<typeof ourController> | undefined;
    try {
      let t1 = performance.now();
      const [host] = await startLabHosts(net, 1);
      console.log(`  lab host with the real exporter image up after ${secs(t1)}`);
      t1 = performance.now();
      js = await startRealJumpstarter({
        kubeconfig: env.kubeconfig,
        namespace: NS,
        bridgeAddress: `${net.subnet}.1`,
        dir: `${marker}/jumpstarter`,
      });
      console.log(`  Jumpstarter controller ready after ${secs(t1)}`);
      ours = ourController(client, NS, { [SEED_HOST]: host.address }, {
        resyncMs: 10_000,
        clusterId: await readClusterId(client, undefined),
      });
      await ours.controller.start();
      const realJs = js;

      let exporter!: Exporter;
      await t.step(
        "the seed as written: the real controller issues the token, the real exporter registers",
        async () => {
          const t2 = performance.now();
          const key = await Deno.readTextFile(host.privateKeyPath);
          await client.create(SECRETS, {
            metadata: { name: "lab-ssh-key", namespace: NS },
            type: "Opaque",
            data: { "ssh-privatekey": Buffer.from(key).toString("base64") },
          } as KubeObject);
          await client.create(VIRTUAL_TARGET_CLASSES, await seedExample("virtualtargetclass.yaml", NS));
          await client.create(EXPORTER_SETS, await seedExample("exporterset.yaml", NS));
          exporter = await oneOnline(client, "the exporter Online, as the real controller reports it");
          console.log(`  ExporterSet applied -> exporter ${exporter.metadata.name} Online after ${secs(t2)}`);
          assert.ok(exporter.status?.conditions?.some((c) => c.type === "Registered" && c.status === "True"));
          assert.equal(exporter.status?.endpoint, realJs.endpoint);
          const ps = await sh(host, `podman ps --format '{{.Names}} {{.Image}}'`);
          assert.match(ps, new RegExp(`${exporter.metadata.name}-exporter ${EXPORTER_IMAGE}`));
        },
      );

      await t.step(
        "jmp shell leases it: flash a marker image, power on, the marker on the console, power off",
        async () => {
          const clientConfig = `${marker}/client.yaml`;
          await run(jmp, [
            ...["admin", "create", "client", "qsp-e2e", "-n", NS, "--unsafe", "--out", clientConfig, "--nointeractive"],
            ...["--kubeconfig", env.kubeconfig],
          ]);
          const text = `QSP-MARKER-${crypto.randomUUID().slice(0, 8)}`;
          await run("bash", [`${ROOT}test/jumpstarter/marker-image.sh`, `${marker}/marker.img`, text]);
          await Deno.writeTextFile(`${marker}/lease.py`, LEASE_SCRIPT);
          const t2 = performance.now();
          const out = await run(jmp, [
            ...["shell", "--client-config", clientConfig, "-l", "board=aarch64-qemu,virtual=true", "--"],
            ...[jmp.replace(/jmp$/, "python"), `${marker}/lease.py`, `${marker}/marker.img`, text],
          ]);
          console.log(`  jmp shell: lease, flash, power on, marker on the console, power off in ${secs(t2)}`);
          assert.match(out, new RegExp(`marker ${text} on the console`));
        },
      );

      await t.step("the lease ended: ExitAndReplace replaces the instance with a fresh one", async () => {
        const t2 = performance.now();
        const ended = (await client.list<Lease>(JUMPSTARTER_LEASES, NS)).items.filter((l) =>
          l.status?.exporterRef?.name === exporter.metadata.name
        );
        assert.equal(ended.length, 1, "jmp shell took a real lease of our exporter");
        const old = exporter.metadata.name!;
        exporter = await oneOnline(client, "a fresh exporter Online in place of the leased one", old);
        console.log(`  lease ended -> ${exporter.metadata.name} replaced ${old} and is Online after ${secs(t2)}`);
        await waitFor(
          async () => (await hostExec(host, `ls /etc/containers/systemd/ | grep -c ${old}`)).stdout.trim() === "0",
          {
            what: `${old} removed from the host`,
            timeoutMs: 60_000,
          },
        );
      });

      await t.step("a new token reaches the real exporter, and the runtime keeps running", async () => {
        const name = exporter.metadata.name!;
        const runtimeBefore = await runtimeIdentity(host, name);
        const secret = `${name}-exporter`;
        const before = await tokenOf(client, secret);
        const t2 = performance.now();
        // Jumpstarter issues a new token when its Secret is gone
        await client.delete(SECRETS, NS, secret);
        const token = await waitFor(async () => {
          const now = await tokenOf(client, secret).catch(() => undefined);
          return now && now !== before ? now : undefined;
        }, { what: "a new token issued", timeoutMs: 60_000 });
        // the old token stays valid (same signing key): what shows the new one in use is an exporter process started
        // after the config changed, connected since
        const written = await waitFor(async () => {
          const cfg = await sh(host, `cat /etc/jumpstarter/exporters/${name}.yaml`);
          return cfg.includes(token) ? Date.now() : undefined;
        }, { what: "the new token in the exporter's config", timeoutMs: 60_000 });
        await waitFor(async () => {
          const unix = await sh(host, `podman inspect -f '{{.State.StartedAt.Unix}}' ${name}-exporter`);
          const started = 1000 * Number(unix);
          return started > written - 5_000 && await seenSince(client, name, started);
        }, { what: "the exporter reloaded with the new token and connected", timeoutMs: 120_000 });
        console.log(`  token rotated -> ${name} reloaded and connected again after ${secs(t2)}`);
        assert.equal(await runtimeIdentity(host, name), runtimeBefore, "the runtime container was not restarted");
      });

      await t.step("a restarted Jumpstarter controller (new CA) is survived", async () => {
        const name = exporter.metadata.name!;
        const runtimeBefore = await runtimeIdentity(host, name);
        const caBefore = realJs.caBundle();
        const t2 = performance.now();
        await realJs.restart();
        assert.notEqual(realJs.caBundle(), caBefore);
        await waitFor(async () => {
          const cfg = await sh(host, `cat /etc/jumpstarter/exporters/${name}.yaml`);
          return cfg.includes(Buffer.from(realJs.caBundle()).toString("base64"));
        }, { what: "the new CA in the exporter's config", timeoutMs: 60_000 });
        // the old controller's streams died with it: a stream seen since comes from an exporter that trusts the new CA
        const restarted = Date.now();
        await waitFor(() => seenSince(client, name, restarted + 1_000), {
          what: "the exporter connected again after the controller restart",
          timeoutMs: 150_000,
        });
        console.log(`  Jumpstarter restarted (new CA) -> ${name} Online again after ${secs(t2)}`);
        assert.equal(await runtimeIdentity(host, name), runtimeBefore, "the runtime container was not restarted");
      });

      await t.step("scale-down drains the instance and tears it down; the host is clean", async () => {
        const t2 = performance.now();
        await client.mergePatch<ExporterSet>(EXPORTER_SETS, NS, SET, {
          spec: { minAvailableReplicas: 0, scaleDownCooldown: "0s" },
        });
        await waitFor(async () => (await client.list<Exporter>(EXPORTERS, NS)).items.length === 0, {
          what: "every exporter drained and deleted",
          timeoutMs: 120_000,
        });
        const left = await sh(
          host,
          "ls /etc/containers/systemd/ /etc/jumpstarter/exporters/ 2>/dev/null | grep -c aarch64 || true; " +
            "podman ps -a -q | wc -l; podman volume ls -q | wc -l",
        );
        console.log(`  scaled to 0: drained and torn down after ${secs(t2)}`);
        assert.deepEqual(left.trim().split("\n"), ["0", "0", "0"], "nothing left on the host");
      });
    } finally {
      await ours?.controller.stop();
      await ours?.pool.close();
      await js?.stop();
      await cleanNamespace(client);
      client.close();
      await stopLabHosts(net);
      await Deno.remove(marker, { recursive: true }).catch(() => {});
    }
  },
);

/** Whether the real controller has heard from the exporter since `ms` (status.lastSeen, refreshed every 10 s). */
const seenSince = async (client: KubeClient, name: string, ms: number) => {
  const e = await client.get<Exporter>(EXPORTERS, NS, name);
  return online(e) && Date.parse(e.status?.lastSeen ?? "") > ms;
};

const tokenOf = async (client: KubeClient, secret: string) =>
  Buffer.from((await client.get<{ data?: Record<string, string> }>(SECRETS, NS, secret)).data?.token ?? "", "base64")
    .toString();

/** The seed's objects go, so a later run (or the sandbox) starts from nothing; our finalizers are dropped with them. */
async function cleanNamespace(client: KubeClient): Promise<void> {
  await client.delete(EXPORTER_SETS, NS, SET).catch(() => {});
  for (const e of (await client.list<Exporter>(EXPORTERS, NS)).items) {
    await client.mergePatch(EXPORTERS, NS, e.metadata.name!, { metadata: { finalizers: null } }).catch(() => {});
    await client.delete(EXPORTERS, NS, e.metadata.name!).catch(() => {});
  }
  await client.delete(VIRTUAL_TARGET_CLASSES, NS, "qemu-ssh-aarch64").catch(() => {});
  await client.delete(SECRETS, NS, "lab-ssh-key").catch(() => {});
}

/** Runs inside `jmp shell`: the lease's exporter is at hand through the environment jmp sets up. */
const LEASE_SCRIPT = `import sys, time
from jumpstarter.utils.env import env
image, marker = sys.argv[1], sys.argv[2]
with env() as client:
    client.qemu.flasher.flash(image)
    client.qemu.power.on()
    with client.qemu.console.pexpect() as p:
        p.expect(marker, timeout=180)
    print(f"marker {marker} on the console")
    client.qemu.power.off()
`;
