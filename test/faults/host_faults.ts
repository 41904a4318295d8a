/**
 * Faults of a lab host while the controller works on it: sshd stopped in the middle of a deploy (and started again),
 * the host's network cut at the bridge (its veth's outer side down) and restored, and the host rebooted. Each trial
 * scales the set the other way (1 -> 3-4 or back) just before the fault, so faults hit deploys and teardowns.
 */
import { checkInvariants, type Checks, trial } from "./invariants.ts";
import { FaultWorld, type Outcome, outer, outerVeth, randomBetween, SEED_HOST, sh, sleep } from "./world.ts";
import { waitFor } from "../env.ts";

/** Reasons the set may show while its host cannot be reached over SSH. */
const UNREACHABLE = /^(HostUnreachable|DeployFailed|TeardownFailed)$/;

export async function hostScenario(reps: number, full: boolean): Promise<Outcome[]> {
  const w = await FaultWorld.create({ prefix: "host" });
  const results: Outcome[] = [];
  const host = w.hosts.find((h) => h.address === w.aliases[SEED_HOST])!;
  const veth = await outerVeth(w.env.labNet.bridge, host);
  try {
    await w.seed((s) => Object.assign(s.spec, FaultWorld.LOW));
    await w.controller.start();
    const base = await checkInvariants(w);
    if (!base.ok) throw new Error(`baseline did not hold: ${base.violations.join("; ")}`);

    for (let rep = 1; rep <= reps; rep++) {
      results.push(
        await trial(w, "host", `sshd stopped #${rep}`, async (checks) => {
          const scale = await w.toggleScale();
          const delay = randomBetween(200, 3_000);
          await sleep(delay);
          const t0 = performance.now();
          try {
            // sessions too (the process is named sshd-session; -f would match this very shell's command line)
            await w.inHost(host, "systemctl stop ssh.service; pkill -x sshd-session || true");
            const c = await noticed(w, checks, 60_000);
            await sleep(Math.max(0, 8_000 - (performance.now() - t0))); // down for 8 s at least: retries, backoff
            return {
              fault: `${scale}, sshd down @${(delay / 1000).toFixed(1)}s for ${secs(t0)}s`,
              note: c && `${c.reason}: ${c.message}`,
            };
          } finally {
            await w.inHost(host, "systemctl start ssh.service");
          }
        }),
      );

      results.push(
        await trial(w, "host", `network cut #${rep}`, async (checks) => {
          const scale = await w.toggleScale();
          const delay = randomBetween(200, 3_000);
          await sleep(delay);
          const t0 = performance.now();
          try {
            await outer("ip", "link", "set", veth, "down");
            // An open SSH connection takes the keepalive's time to be declared dead: the full form waits for the
            // set to show it, the bounded one only keeps the cable out for a while.
            if (!full) {
              await sleep(10_000);
              return { fault: `${scale}, ${veth} down @${(delay / 1000).toFixed(1)}s for ${secs(t0)}s` };
            }
            const c = await noticed(w, checks, 120_000);
            return {
              fault: `${scale}, ${veth} down @${(delay / 1000).toFixed(1)}s for ${secs(t0)}s`,
              note: c && `${c.reason}: ${c.message}`,
            };
          } finally {
            await outer("ip", "link", "set", veth, "up");
          }
        }),
      );

      results.push(
        await trial(w, "host", `reboot #${rep}`, async () => {
          const bootId = (await sh(host, "cat /proc/sys/kernel/random/boot_id")).trim();
          const before = new Set((await w.exporters()).map((e) => e.metadata.name));
          const scale = await w.toggleScale();
          const delay = randomBetween(200, 3_000);
          await sleep(delay);
          const t0 = performance.now();
          await w.inHost(host, "systemctl reboot --no-block");
          await waitFor(async () => {
            const r = await sh(host, "cat /proc/sys/kernel/random/boot_id").catch(() => bootId);
            return r.trim() !== bootId;
          }, { what: `${host.name} to come back with a new boot id`, timeoutMs: 180_000, intervalMs: 1_000 });
          return {
            fault: `${scale}, reboot @${(delay / 1000).toFixed(1)}s, sshd back after ${secs(t0)}s`,
            after: async () => {
              const after = (await w.exporters()).map((e) => e.metadata.name);
              return `${
                after.filter((n) => before.has(n)).length
              } of ${after.length} Exporters are from before the reboot`;
            },
          };
        }),
      );
    }
  } finally {
    await outer("ip", "link", "set", veth, "up").catch(() => {});
    await w.inHost(host, "systemctl start ssh.service").catch(() => {});
    await w.stop({ keepLogs: results.some((r) => !r.ok) });
  }
  return results;
}

const secs = (t0: number) => ((performance.now() - t0) / 1000).toFixed(0);

/** Waits until the set's status says the host cannot be reached; records it as a check if it never does. */
async function noticed(w: FaultWorld, checks: Checks, timeoutMs: number) {
  try {
    return await w.waitCondition("Degraded", (c) => c.status === "True" && UNREACHABLE.test(c.reason ?? ""), timeoutMs);
  } catch {
    const c = (await w.set())?.status?.conditions?.find((x) => x.type === "Degraded");
    checks.expect(false, `the set never showed the host unreachable (Degraded: ${c?.reason}: ${c?.message})`);
    return undefined;
  }
}
