/**
 * Ours without Kubernetes: the product's LabHosts + SshPool in this process applying (and removing) every instance
 * at once, as the reconciler does, over one fresh pool per phase (so each phase pays for its connections).
 */
import { LabHosts } from "../src/host/lab.ts";
import type { RenderedInstance } from "../src/host/render.ts";
import { SshPool, type SshTarget } from "../src/host/ssh.ts";
import type { Deployer, SshCounts } from "./deployer.ts";
import type { Placement } from "./fleet.ts";
import type { HostProbe } from "./hosts.ts";
import { inspectUntilUp } from "../test/env.ts";

export function hostSideDeployer(probe: HostProbe): Deployer {
  /** Runs `fn` for every instance at once over a fresh pool; the pool's own counters are the SSH cost. */
  const everywhere = async (
    p: Placement,
    fn: (lab: LabHosts, t: SshTarget, r: RenderedInstance) => Promise<void>,
  ): Promise<SshCounts> => {
    const pool = new SshPool();
    try {
      const lab = new LabHosts(pool);
      await Promise.all(
        p.flatMap(({ host, instances }) => instances.map(async (r) => fn(lab, await probe.target(host), r))),
      );
      return { sshRoundTrips: pool.stats().commands };
    } finally {
      await pool.close();
    }
  };
  return {
    name: "ours: LabHosts (in process, no Kubernetes)",
    deploy: (p) =>
      everywhere(p, async (lab, t, r) => {
        const out = await lab.apply(t, r, { kvmRequired: true, keepExited: true });
        if (!out.ready && !out.starting) throw new Error(`${t.host}/${r.name}: not ready: ${out.errors.join("; ")}`);
        // the apply does not wait for the starts it queued: up once a look at the units says so, as for the controller
        if (!out.ready) await inspectUntilUp((o) => lab.units(t, o), [r]);
      }),
    teardown: (p) => everywhere(p, (lab, t, r) => lab.remove(t, r.name)),
  };
}
