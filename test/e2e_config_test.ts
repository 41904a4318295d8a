/**
 * End to end, what the controller does with what people write: broken parameters and wrong host keys stop it with
 * a status that says what to fix (and it proceeds once fixed, without a restart), WaitForFirstConsumer waits for a
 * Lease, and the status tells the truth without churning (no re-sends, no status writes, stable transition times).
 */
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { waitFor } from "./env.ts";
import {
  applySeed,
  b64,
  cond,
  createClass,
  createKeySecret,
  createSet,
  events,
  exporters,
  getSet,
  hostHas,
  knownHostsAs,
  reconciles,
  seconds,
  SEED_HOST,
  SET,
  waitReady,
  waitStandinUp,
  type World,
  world,
} from "./e2e_world.ts";
import { CONFIG_MAPS, EXPORTER_SETS, EXPORTERS, JUMPSTARTER_LEASES, SECRETS } from "../src/kube/resources.ts";
import type { Condition, ExporterSet, Lease } from "../src/api/types.ts";
import { fingerprint } from "../src/host/known_hosts.ts";

const opts = { sanitizeOps: false, sanitizeResources: false };

const patchSet = (w: World, spec: Record<string, unknown>) =>
  w.client.mergePatch<ExporterSet>(EXPORTER_SETS, w.ns, SET, { spec });

/** Waits until the set's status reflects its current generation and `pred` holds. */
async function settledStatus(w: World, what: string, pred: (s: ExporterSet) => boolean): Promise<ExporterSet> {
  return await waitFor(async () => {
    const s = await getSet(w);
    return s.status?.observedGeneration === s.metadata.generation && pred(s) ? s : undefined;
  }, { what, timeoutMs: 60_000 });
}

const degraded = (reason: string) => (s: ExporterSet) =>
  cond(s, "Degraded")?.status === "True" && cond(s, "Degraded")?.reason === reason;

Deno.test({
  name: "e2e: invalid parameters degrade the set naming object and field, create nothing, and proceed once fixed",
  ...opts,
  async fn() {
    const w = await world();
    try {
      await createKeySecret(w);
      await createClass(w);
      await createSet(w, (s) => s.spec.parameters = { host: { port: "abc" } });
      let s = await settledStatus(w, "Degraded InvalidParameters", degraded("InvalidParameters"));
      assert.match(
        cond(s, "Degraded")!.message!,
        /^ExporterSet aarch64-ssh-pool: spec\.parameters\.host\.port: expected an integer from 1 to 65535, got string "abc"/,
      );
      await w.controller.recorder.flush();
      assert.ok(
        (await events(w)).some((e) =>
          e.type === "Warning" && e.reason === "InvalidParameters" && e.involvedObject.kind === "ExporterSet" &&
          e.message.includes("spec.parameters.host.port")
        ),
        "a Warning event on the ExporterSet",
      );

      // A hostile host name is refused just the same, before anything reaches a shell.
      await patchSet(w, { parameters: { host: { port: null, name: "x; rm -rf /" } } });
      s = await settledStatus(
        w,
        "Degraded naming host.name",
        (x) => /host\.name/.test(cond(x, "Degraded")?.message ?? ""),
      );
      assert.match(cond(s, "Degraded")!.message!, /spec\.parameters\.host\.name: "x; rm -rf \/" is not a DNS name/);
      assert.equal(cond(s, "Available")?.status, "False");
      assert.equal((await exporters(w)).length, 0, "no Exporter created");
      assert.equal(w.pool.stats().commands, 0, "no command ran on any host");

      const t0 = performance.now();
      await patchSet(w, { parameters: null });
      await waitReady(w, 1);
      console.log(`  fixed set ready after ${seconds(t0)}`);
      s = await settledStatus(w, "Degraded False", (x) => cond(x, "Degraded")?.status === "False");
      assert.equal(cond(s, "Available")?.status, "True");
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: a wrong known_hosts entry is refused naming host and both fingerprints; a fixed Secret deploys",
  ...opts,
  async fn() {
    const w = await world();
    try {
      // The second lab host's key, recorded under the first one's name: a host key mismatch.
      const wrong = await knownHostsAs(w.host2, SEED_HOST);
      const right = await knownHostsAs(w.host, SEED_HOST);
      await createKeySecret(w, { known_hosts: wrong });
      await createClass(w);
      await createSet(w);
      const s = await settledStatus(w, "Degraded HostKeyRejected", degraded("HostKeyRejected"));
      const message = cond(s, "Degraded")!.message!;
      assert.ok(message.includes(SEED_HOST), `names the host: ${message}`);
      for (const line of [wrong, right]) {
        const fp = fingerprint(Buffer.from(line.trim().split(" ")[2], "base64"));
        assert.ok(message.includes(fp), `names fingerprint ${fp}: ${message}`);
      }
      const [e] = await exporters(w);
      const name = e.metadata.name!;
      assert.equal(await hostHas(w.host, name), false, "nothing deployed");
      assert.equal(e.metadata.annotations?.["qemu-ssh.jumpstarter.dev/host"], SEED_HOST, "marked with where it goes");
      await w.controller.recorder.flush();
      assert.ok(
        (await events(w)).some((ev) => ev.type === "Warning" && ev.reason === "HostKeyRejected"),
        "a Warning event says why",
      );
      assert.equal(
        await w.client.find(SECRETS, w.ns, "qemu-ssh-known-hosts"),
        undefined,
        "a Strict policy pins nothing",
      );

      const t0 = performance.now();
      await w.client.mergePatch(SECRETS, w.ns, "lab-ssh-key", { data: { known_hosts: b64(right) } });
      const [deployed] = await waitReady(w, 1);
      console.log(`  deployed ${seconds(t0)} after known_hosts was fixed`);
      assert.equal(deployed.metadata.name, name, "the same Exporter, now deployed");
      await waitStandinUp(w.host, name);
      await settledStatus(w, "Degraded False", (x) => cond(x, "Degraded")?.status === "False");
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: WaitForFirstConsumer creates no exporter until a matching pending Lease appears",
  ...opts,
  async fn() {
    const w = await world();
    try {
      await createKeySecret(w);
      await createClass(w, (c) => c.spec.bindingMode = "WaitForFirstConsumer");
      await createSet(w, (s) => {
        s.spec.minAvailableReplicas = 0;
        s.spec.scaleDownCooldown = "1s";
      });
      const s = await settledStatus(w, "Available NoReplicasRequired", (x) => cond(x, "Available")?.status === "True");
      assert.equal(cond(s, "Available")?.reason, "NoReplicasRequired");
      // A pending Lease for other boards is no demand for this set.
      const before = reconciles(w);
      await createLease(w, "other", { board: "x86-qemu" });
      await waitFor(() => reconciles(w) > before, { what: "a reconcile after the unrelated Lease" });
      assert.equal((await exporters(w)).length, 0);

      const t0 = performance.now();
      await createLease(w, "lease-1", { board: "aarch64-qemu", virtual: "true" });
      const [e] = await waitReady(w, 1);
      console.log(`  exporter ready ${seconds(t0)} after the Lease appeared`);
      const name = e.metadata.name!;

      // Jumpstarter binds the Lease: still one exporter, now leased.
      await w.client.mergePatch(JUMPSTARTER_LEASES, w.ns, "lease-1", { status: { exporterRef: { name } } }, "status");
      await w.client.mergePatch(EXPORTERS, w.ns, name, { status: { leaseRef: { name: "lease-1" } } }, "status");
      await waitFor(async () => (await getSet(w)).status?.leasedReplicas === 1, { what: "leasedReplicas 1" });
      assert.equal((await exporters(w)).length, 1);

      // The Lease ends: no demand is left, so the exporter goes after the cooldown.
      await w.client.mergePatch(EXPORTERS, w.ns, name, { status: { leaseRef: null } }, "status");
      await w.client.mergePatch(JUMPSTARTER_LEASES, w.ns, "lease-1", { status: { ended: true } }, "status");
      await waitFor(async () => (await exporters(w)).length === 0, { what: "scaled back to zero", timeoutMs: 60_000 });
      assert.equal(await hostHas(w.host, name), false);
    } finally {
      await w.stop();
    }
  },
});

Deno.test({
  name: "e2e: status tells the truth: generation, counts, actionable conditions; quiet events change nothing",
  ...opts,
  async fn() {
    const w = await world();
    try {
      await applySeed(w);
      await waitReady(w, 1);
      let s = await settledStatus(w, "Available", (x) => cond(x, "Progressing")?.reason === "AllReplicasReady");
      assert.deepEqual(counts(s), {
        replicas: 1,
        readyReplicas: 1,
        availableReplicas: 1,
        unavailableReplicas: 0,
        leasedReplicas: 0,
        updatedReplicas: 1,
        exportersActive: 0,
        exportersIdle: 1,
        exportersDisabled: 0,
        exportersOffline: 0,
      });
      assert.deepEqual(reasons(s), {
        Available: "True/MinimumReplicasAvailable",
        Progressing: "False/AllReplicasReady",
        Degraded: "False/AllReplicasHealthy",
        ScalingLimited: "False/WithinLimits",
      });
      for (const c of s.status!.conditions!) assert.equal(c.observedGeneration, s.metadata.generation, c.type);
      const since = transitions(s);

      // Events that change nothing for this set: no command to the host, no status write. The exporter is young and
      // never reported Online here, so its host is looked at every 5 s (deploy.ts FAST_CHECK_MS) whatever happens:
      // the events go right after one of those looks, not into the next.
      const looked = w.pool.stats().commands;
      await waitFor(() => w.pool.stats().commands > looked, { what: "the next close look at the host" });
      const commands = w.pool.stats().commands;
      await w.client.mergePatch(EXPORTER_SETS, w.ns, SET, { metadata: { annotations: { touched: "1" } } });
      const quiet = await getSet(w);
      const before = reconciles(w);
      await w.client.create(CONFIG_MAPS, { metadata: { name: "unrelated", namespace: w.ns }, data: { a: "b" } });
      await createLease(w, "unrelated", { board: "other" });
      await waitFor(() => reconciles(w) >= before + 2, { what: "reconciles after the quiet events" });
      assert.equal(w.pool.stats().commands, commands, "no SSH command for a quiet set");
      s = await getSet(w);
      assert.equal(
        s.metadata.resourceVersion,
        quiet.metadata.resourceVersion,
        `no status write: ${JSON.stringify(quiet.status)} -> ${JSON.stringify(s.status)}`,
      );

      // A spec change moves observedGeneration but flips nothing.
      await patchSet(w, { maxReplicas: 3 });
      s = await settledStatus(w, "the new generation observed", () => true);
      assert.equal(cond(s, "ScalingLimited")?.message, "within maxReplicas 3");
      assert.deepEqual(transitions(s), since, "lastTransitionTime moves only on flips");
      assert.equal(w.pool.stats().commands, commands, "a scaling-only change sends nothing to the host");

      // A flip: broken parameters degrade the set. The running exporter keeps serving, but with no target the
      // controller cannot look at it: its last known state counts, and Available says so instead of guessing.
      await patchSet(w, { parameters: { host: { port: "abc" } } });
      s = await settledStatus(w, "Degraded InvalidParameters", degraded("InvalidParameters"));
      assert.notEqual(transitions(s).Degraded, since.Degraded, "Degraded flipped");
      assert.equal(reasons(s).Available, "Unknown/InstancesUnseen", `${JSON.stringify(s.status)}`);
      assert.equal(s.status?.readyReplicas, 1, "its last known state, not 0");
      await patchSet(w, { parameters: null });
      s = await settledStatus(w, "Degraded False", (x) => cond(x, "Degraded")?.status === "False");
      assert.equal(cond(s, "Degraded")?.reason, "AllReplicasHealthy");
    } finally {
      await w.stop();
    }
  },
});

async function createLease(w: World, name: string, matchLabels: Record<string, string>): Promise<void> {
  await w.client.create<Lease>(JUMPSTARTER_LEASES, {
    metadata: { name, namespace: w.ns },
    spec: { selector: { matchLabels }, clientRef: { name: "developer" }, duration: "1h" },
  });
}

function counts(s: ExporterSet): Record<string, number | undefined> {
  const {
    conditions: _c,
    selector: _s,
    observedGeneration: _g,
    surplusSince: _x,
    hosts: _h,
    hostSummary: _hs,
    ...rest
  } = s.status ?? {};
  return rest;
}

const reasons = (s: ExporterSet): Record<string, string> =>
  Object.fromEntries((s.status?.conditions ?? []).map((c: Condition) => [c.type, `${c.status}/${c.reason}`]));
const transitions = (s: ExporterSet): Record<string, string | undefined> =>
  Object.fromEntries((s.status?.conditions ?? []).map((c: Condition) => [c.type, c.lastTransitionTime]));
