/**
 * LabHosts over the real SSH pool against a real lab host: the costs as counts (connections, round trips), the
 * host's own quadlet generator accepting what we render, instances surviving a host reboot, and sshd going away in
 * the middle of the work.
 */
import assert from "node:assert/strict";
import { hostExec, type LabHost } from "./labhost/labhost.ts";
import { inspectUntilUp, testEnv, waitFor } from "./env.ts";
import { seedInstance } from "./fixtures.ts";
import { directTarget } from "./e2e_world.ts";
import { renderInstance } from "../src/host/render.ts";
import { LabHosts } from "../src/host/lab.ts";
import { SshError, SshPool, type SshTarget } from "../src/host/ssh.ts";
import type { HostFacts } from "../src/host/host_facts.ts";

const instance = (name: string, facts: HostFacts | undefined) =>
  renderInstance(seedInstance({ name, uid: crypto.randomUUID(), token: `token-${crypto.randomUUID()}` }), facts);

/** The host's facts, to render for: over a connection of its own, so the counts below start from nothing. */
async function factsOf(t: SshTarget): Promise<HostFacts | undefined> {
  const pool = new SshPool();
  try {
    return (await new LabHosts(pool).inspect(t)).facts;
  } finally {
    await pool.close();
  }
}

async function sh(host: LabHost, cmd: string): Promise<string> {
  const r = await hostExec(host, cmd);
  assert.equal(r.code, 0, `${cmd}: ${r.stderr}`);
  return r.stdout;
}

Deno.test({
  name: "lab: one connection per host, one round trip per apply/remove/inspect, generator-valid units",
  sanitizeOps: false,
  sanitizeResources: false,
  async fn() {
    const [, host] = (await testEnv()).labhosts;
    const pool = new SshPool();
    const lab = new LabHosts(pool);
    const t = await directTarget(host);
    const facts = await factsOf(t);
    const a = instance("lab-count-a", facts);
    const b = instance("lab-count-b", facts);
    try {
      const before = pool.stats();
      const t0 = performance.now();
      const [ra, rb] = await Promise.all([a, b].map((r) => lab.apply(t, r, { kvmRequired: true, keepExited: true })));
      const applied = performance.now() - t0;
      // the apply queues the starts and does not wait for them
      assert.ok([ra, rb].every((r) => r.ready || r.starting), JSON.stringify([ra, rb]));
      let s = pool.stats();
      assert.equal(s.connectionsOpened - before.connectionsOpened, 1, "one connection for the host");
      assert.equal(s.commands - before.commands, 2, "one round trip per apply");
      // what the controller does next: one look at the host's units, for both, soon and then less often, until up
      const looks = await inspectUntilUp((o) => lab.units(t, o), [a, b]);
      console.log(
        `2-instance deploy: applies done in ${Math.round(applied)} ms (2 round trips), both up after ` +
          `${Math.round(performance.now() - t0)} ms (${looks} looks at the units)`,
      );

      const again = await lab.apply(t, a, { kvmRequired: true, keepExited: true });
      assert.deepEqual(again.changed, [], "a repeated apply changes nothing");
      const inspection = await lab.inspect(t);
      assert.deepEqual(
        inspection.instances.map((i) => i.name).filter((n) => n.startsWith("lab-count-")).sort(),
        ["lab-count-a", "lab-count-b"],
      );
      // The host's own quadlet generator accepts what we rendered (a bad key would silently yield no service).
      const dry = await hostExec(host, "/usr/lib/systemd/system-generators/podman-system-generator --dryrun 2>&1");
      assert.equal(dry.code, 0, dry.stdout);
      assert.match(dry.stdout, /---lab-count-a-exporter.service---/);
      assert.doesNotMatch(dry.stdout, /unsupported key|converting .* failed/i);

      await lab.remove(t, "lab-count-a");
      await lab.remove(t, "lab-count-b");
      s = pool.stats();
      assert.equal(s.connectionsOpened - before.connectionsOpened, 1, "still one connection");
      assert.equal(
        s.commands - before.commands,
        6 + looks,
        "apply x3, inspect, remove x2: one round trip each, and the looks at the units until both were up",
      );
    } finally {
      await lab.remove(t, "lab-count-a").catch(() => {});
      await lab.remove(t, "lab-count-b").catch(() => {});
      await pool.close();
    }
  },
});

Deno.test({
  name: "lab: instances come back after a host reboot; sshd stopped mid-way fails fast and a later apply completes",
  sanitizeOps: false,
  sanitizeResources: false,
  async fn() {
    const [, host] = (await testEnv()).labhosts;
    const pool = new SshPool({ connectTimeoutMs: 3_000, backoffBaseMs: 200, backoffMaxMs: 1_000 });
    const lab = new LabHosts(pool);
    const t = await directTarget(host);
    const facts = await factsOf(t);
    const r = instance("lab-reboot", facts);
    try {
      const first = await lab.apply(t, r, { kvmRequired: true, keepExited: true });
      assert.ok(first.ready || first.starting, JSON.stringify(first));
      await inspectUntilUp(() => lab.inspect(t), [r]);
      const bootId = await sh(host, "cat /proc/sys/kernel/random/boot_id; systemctl reboot >/dev/null 2>&1 &");
      // The harness boots the host again after `reboot`; [Install] WantedBy= brings the units back.
      await waitFor(async () => {
        const out = await hostExec(host, `systemctl is-active ${r.units.runtime} ${r.units.exporter}`);
        return out.code === 0 && out.stdout.trim() === "active\nactive";
      }, { what: "both units active after the reboot", timeoutMs: 120_000, intervalMs: 1_000 });
      assert.notEqual(await sh(host, "cat /proc/sys/kernel/random/boot_id"), bootId.split("\n")[0], "it did reboot");

      // sshd goes away while we work: stop it (and its sessions) and bring it back by itself 8 s later.
      await sh(
        host,
        "systemd-run --no-block sh -c 'sleep 8; systemctl start ssh' >/dev/null; " +
          "(sleep 0.5; systemctl stop ssh; pkill -f sshd-session) >/dev/null 2>&1 &",
      );
      const started = Date.now();
      const failed = await waitFor(async () => {
        try {
          await lab.apply(t, instance("lab-reboot-2", facts), { kvmRequired: true, keepExited: true });
          return undefined;
        } catch (e) {
          return e;
        }
      }, { what: "an apply to fail while sshd is down", timeoutMs: 20_000, intervalMs: 100 });
      assert.ok(failed instanceof SshError, String(failed));
      assert.ok(["connect", "closed"].includes(failed.kind), failed.kind);
      assert.ok(Date.now() - started < 15_000, "a timely error, not a hang");
      const done = await waitFor(async () => {
        try {
          return await lab.apply(t, r, { kvmRequired: true, keepExited: true });
        } catch {
          return undefined;
        }
      }, { what: "an apply after sshd is back", timeoutMs: 60_000, intervalMs: 500 });
      assert.ok((done.ready || done.starting) && done.errors.length === 0, JSON.stringify(done));
    } finally {
      await waitFor(() => lab.remove(t, "lab-reboot").then(() => true, () => false), {
        what: "cleanup",
        timeoutMs: 30_000,
      })
        .catch(() => {});
      await lab.remove(t, "lab-reboot-2").catch(() => {});
      await pool.close();
    }
  },
});
