/**
 * A naive deployer shaped like the upstream Go provisioner's weak point: a fresh SSH connection (the system ssh
 * client, strict host key checking) for every command, about ten sequential commands per instance. Hosts are worked
 * on in parallel and the instances of one host one after the other (one reconcile per ExporterSet at a time), which
 * is kinder than upstream's single reconcile worker.
 */
import { Buffer } from "node:buffer";
import { hostExec, type LabHost } from "../test/labhost/labhost.ts";
import { shQuote as q } from "../src/host/remote.ts";
import { type Deployer, type Layout, layout, type SshCounts } from "./deployer.ts";
import type { Placement } from "./fleet.ts";

/** The instance's directories, files, links, shared volume and /disk, as plain commands, in order. */
export function writeCommands(l: Layout): string[] {
  const b64 = (s: string) => Buffer.from(s, "utf8").toString("base64");
  return [
    `mkdir -p ${l.dirs.map((d) => q(d.path)).join(" ")} && ${
      l.dirs.map((d) => `chmod ${d.mode} ${q(d.path)} && chown ${d.owner}:${d.owner} ${q(d.path)}`).join(" && ")
    }`,
    ...l.files.map((f) =>
      `umask 077 && printf %s ${q(b64(f.content))} | base64 -d >${q(f.path)} && chmod ${f.mode} ${q(f.path)} && ` +
      `chown ${f.owner}:${f.owner} ${q(f.path)}`
    ),
    ...l.links.map((k) => `ln -f ${q(k.src)} ${q(k.dest)}`),
    `podman volume create --ignore ${l.volumeOptions.map(q).join(" ")} ${q(l.volume)}`,
    l.diskCommand,
  ];
}

/** What teardown deletes once the units are stopped: the files, then the volumes. */
export function deleteCommands(l: Layout): string[] {
  return [`rm -rf ${l.remove.map(q).join(" ")}`, `podman volume rm -f ${q(l.volume)} ${q(l.diskVolume)}`];
}

function deployCommands(l: Layout): string[] {
  return [
    ...writeCommands(l),
    "systemctl daemon-reload",
    ...l.units.map((u) => `systemctl start ${q(u)}`),
    `systemctl is-active ${l.units.map(q).join(" ")}`,
  ];
}

function teardownCommands(l: Layout): string[] {
  return [
    ...[...l.units].reverse().map((u) => `systemctl stop ${q(u)}`),
    ...deleteCommands(l),
    "systemctl daemon-reload",
  ];
}

async function runAll(p: Placement, commands: (l: Layout) => string[]): Promise<SshCounts> {
  let n = 0;
  const run = async (host: LabHost, cmd: string) => {
    n++;
    const r = await hostExec(host, cmd);
    if (r.code !== 0) throw new Error(`naive on ${host.name}: \`${cmd.slice(0, 60)}\` exit ${r.code}: ${r.stderr}`);
  };
  await Promise.all(p.map(async ({ host, instances }) => {
    for (const r of instances) for (const cmd of commands(layout(r))) await run(host, cmd);
  }));
  return { sshRoundTrips: n };
}

export const naiveDeployer: Deployer = {
  name: "naive: new ssh connection per command",
  deploy: (p) => runAll(p, deployCommands),
  teardown: (p) => runAll(p, teardownCommands),
};
