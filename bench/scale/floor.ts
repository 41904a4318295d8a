/**
 * The floor: what the hosts themselves need. The very scripts the controller sends (the project's LabHosts over its
 * SshPool, rendered by the project's own code), for every instance at once, over connections opened beforehand, so
 * nothing but the hosts (and the SSH transport) is timed: no Kubernetes, no queue, no handshakes.
 */
import process from "node:process";
import { drift } from "../../src/host/drift.ts";
import { HostScriptError, LabHosts } from "../../src/host/lab.ts";
import { SshPool } from "../../src/host/ssh.ts";
import type { Placement } from "../fleet.ts";
import { sshTargetOf } from "../fleet.ts";
import type { SshTarget } from "../../src/host/ssh.ts";
import type { LabHost } from "../../test/labhost/labhost.ts";
import { cpuSplit, type Grouping, readCpu } from "../proc_cpu.ts";

export interface FloorResult {
  deploySeconds: number;
  teardownSeconds: number;
  /** Commands the pool ran per phase (one per instance when nothing failed). */
  deployCommands: number;
  teardownCommands: number;
  /** Connections opened while timing (0: all were open before). */
  connectionsDuringPhases: number;
  /** Applies and removes refused for the host lock and sent again (included in the commands). */
  hostBusy: number;
  /** CPU seconds of this process (ssh2 client side) per phase. */
  clientCpu: { deploy: number; teardown: number };
  /** CPU seconds by process group per phase (proc_cpu.ts), the whole machine's as "machine". */
  cpuByGroup: { deploy: Record<string, number>; teardown: Record<string, number> };
}

const cpuSeconds = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
};

export async function measureFloor(placement: Placement, groupOf: Grouping): Promise<FloorResult> {
  const pool = new SshPool({ commandTimeoutMs: 600_000, connectTimeoutMs: 60_000 });
  const lab = new LabHosts(pool);
  const targets = new Map<LabHost, SshTarget>();
  try {
    // every connection opened before the clock starts
    await Promise.all(placement.map(async ({ host }) => {
      const t = await sshTargetOf(host);
      targets.set(host, t);
      const r = await pool.exec(t, "true");
      if (r.code !== 0) throw new Error(`${host.name}: warm-up exit ${r.code}`);
    }));
    const opened = pool.stats().connectionsOpened;
    const c0 = pool.stats().commands;
    // read outside the timed phases: /proc of a thousand processes takes a while
    let before = await readCpu(groupOf);
    let cpu = cpuSeconds();
    let t = performance.now();
    let hostBusy = 0;
    await Promise.all(placement.flatMap(({ host, instances }) =>
      instances.map(async (r) => {
        // a refusal for the host lock (8 scripts queued on a host of a saturated machine can wait past its 60 s) is
        // tried again at once, as the controller retries it: the hosts' throughput is what the floor is
        for (;;) {
          const out = await lab.apply(targets.get(host)!, r, { kvmRequired: true, keepExited: true });
          if (out.errorCode === "host-busy") {
            hostBusy++;
            continue;
          }
          if (!out.ready) throw new Error(`floor: ${host.name}/${r.name} not ready: ${out.errors.join("; ")}`);
          break;
        }
      })
    ));
    const deploySeconds = (performance.now() - t) / 1000;
    const deployCpu = cpuSeconds() - cpu;
    const deployGroups = await cpuSplit(before, await readCpu(groupOf));
    const deployCommands = pool.stats().commands - c0;
    // untimed: the fakes must report what was applied as a real host would, or the controller's resync checks would
    // see drift that is not there (test/scalehost_test.ts checks the same on one host)
    await Promise.all(placement.map(async ({ host, instances }) => {
      const seen = (await lab.inspect(targets.get(host)!)).instances;
      for (const r of instances) {
        const d = drift(r, seen.find((i) => i.name === r.name));
        if (d.length) throw new Error(`floor: ${host.name}/${r.name} drifted right after its apply: ${d.join("; ")}`);
      }
    }));
    const c1 = pool.stats().commands;
    before = await readCpu(groupOf);
    cpu = cpuSeconds();
    t = performance.now();
    await Promise.all(
      placement.flatMap(({ host, instances }) =>
        instances.map(async (r) => {
          for (;;) {
            try {
              return await lab.remove(targets.get(host)!, r.name, r.uid);
            } catch (e) {
              if (!(e instanceof HostScriptError && e.code === "host-busy")) throw e;
              hostBusy++;
            }
          }
        })
      ),
    );
    const teardownSeconds = (performance.now() - t) / 1000;
    const teardownCpu = cpuSeconds() - cpu;
    const teardownGroups = await cpuSplit(before, await readCpu(groupOf));
    return {
      deploySeconds,
      teardownSeconds,
      deployCommands,
      hostBusy,
      teardownCommands: pool.stats().commands - c1,
      connectionsDuringPhases: pool.stats().connectionsOpened - opened,
      clientCpu: { deploy: deployCpu, teardown: teardownCpu },
      cpuByGroup: { deploy: deployGroups, teardown: teardownGroups },
    };
  } finally {
    await pool.close();
  }
}
