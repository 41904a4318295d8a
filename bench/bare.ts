/**
 * The host's own share of a deploy, as a deployer: the same files, volumes, /disk images and units as the others, by
 * one shell command per host over one connection of the system ssh client, with one daemon-reload and every unit
 * started (stopped) by one systemctl call that returns when they are up (down). Nothing is checked, recorded or
 * reported, so no deployer that does the same work can be faster: the floor the others are compared with.
 */
import { hostExec } from "../test/labhost/labhost.ts";
import { shQuote as q } from "../src/host/remote.ts";
import { type Deployer, type Layout, layout, type SshCounts } from "./deployer.ts";
import type { Placement } from "./fleet.ts";
import { deleteCommands, writeCommands } from "./naive.ts";

async function perHost(p: Placement, command: (ls: Layout[], units: string) => string[]): Promise<SshCounts> {
  await Promise.all(p.map(async ({ host, instances }) => {
    const ls = instances.map(layout);
    const cmd = command(ls, ls.flatMap((l) => l.units).map(q).join(" ")).join(" && ");
    const r = await hostExec(host, cmd);
    if (r.code !== 0) throw new Error(`bare on ${host.name}: exit ${r.code}: ${r.stderr}`);
  }));
  return { sshRoundTrips: p.length };
}

export const bareDeployer: Deployer = {
  name: "bare host work: one command per host, nothing checked",
  deploy: (p) =>
    perHost(p, (ls, units) => [...ls.flatMap(writeCommands), "systemctl daemon-reload", `systemctl start ${units}`]),
  teardown: (p) =>
    perHost(p, (ls, units) => [`systemctl stop ${units}`, ...ls.flatMap(deleteCommands), "systemctl daemon-reload"]),
};
