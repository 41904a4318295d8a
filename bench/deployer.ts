/**
 * The host-side deployers compared in the bench (ours in process, Ansible, a naive one-connection-per-command one, the
 * bare host work):
 * one interface, one way to time them, and the plain file/directory/unit layout of an instance that the
 * non-provisioner deployers put in place by their own means.
 */
import { configMountDir, EXPORTER_UID, type RenderedInstance } from "../src/host/render.ts";
import { shQuote as q } from "../src/host/remote.ts";
import type { Placement } from "./fleet.ts";
import type { HostProbe } from "./hosts.ts";

export interface SshCounts {
  /** Commands run over SSH (sessions / exec requests), each one round trip at least; counted by the deployer. */
  sshRoundTrips: number;
}

export interface PhaseResult extends SshCounts {
  seconds: number;
  /** SSH connections (TCP + handshake + auth) the hosts' sshd accepted during the phase. */
  sshConnections: number;
}

export interface Deployer {
  name: string;
  deploy(p: Placement): Promise<SshCounts>;
  teardown(p: Placement): Promise<SshCounts>;
}

export interface DeployerResult {
  deployer: string;
  deploy: PhaseResult;
  teardown: PhaseResult;
}

/** Times deploy and teardown from clean hosts; checks (untimed) that the files and units are right, then gone. */
export async function measure(d: Deployer, p: Placement, probe: HostProbe): Promise<DeployerResult> {
  const hosts = p.map((x) => x.host);
  const timed = async (phase: () => Promise<SshCounts>): Promise<PhaseResult> => {
    const [from, t0] = [Date.now(), performance.now()];
    const counts = await phase();
    const seconds = (performance.now() - t0) / 1000;
    return { seconds, ...counts, sshConnections: await probe.sshLogins(hosts, from, Date.now()) };
  };
  const deploy = await timed(() => d.deploy(p));
  await probe.assertDeployed(p, d.name);
  const teardown = await timed(() => d.teardown(p));
  await probe.assertClean(hosts, `${d.name} teardown`);
  return { deployer: d.name, deploy, teardown };
}

/** One instance as plain filesystem and systemd work, in the order a person would do it. */
export interface Layout {
  /**
   * Directories to create, with their modes and owners (the config's directory is private, and the exporter's user's:
   * it holds the token and the container mounts it).
   */
  dirs: { path: string; mode: string; owner: number }[];
  files: { path: string; content: string; mode: string; owner: number }[];
  /** Hard links to files (the config's top-level name). */
  links: { src: string; dest: string }[];
  volume: string;
  /** `podman volume create` options: the shared volume belongs to the exporter's user, like a pod's emptyDir. */
  volumeOptions: string[];
  /** The /disk volume: an ext4 image of the instance's size, loop-mounted by Podman, as the controller makes it. */
  diskVolume: string;
  /** One shell command creating the /disk image and its volume (the controller's apply does the same). */
  diskCommand: string;
  /** Start order: runtime, then exporter. */
  units: string[];
  /** Everything teardown deletes (files, links, the instance's config directory). */
  remove: string[];
}

const octal = (mode: number) => `0${mode.toString(8)}`;
const dirOf = (p: string) => p.slice(0, p.lastIndexOf("/"));

export function layout(r: RenderedInstance): Layout {
  const dirs = new Map<string, { mode: string; owner: number }>();
  for (const f of r.files) {
    for (const p of [f.path, ...f.links]) {
      if (f.secret || !dirs.has(dirOf(p))) {
        dirs.set(dirOf(p), f.secret ? { mode: "0700", owner: p === f.path ? f.owner : 0 } : { mode: "0755", owner: 0 });
      }
    }
  }
  const links = r.files.flatMap((f) => f.links.map((dest) => ({ src: f.path, dest })));
  return {
    dirs: [...dirs].map(([path, d]) => ({ path, ...d })),
    files: r.files.map((f) => ({ path: f.path, content: f.content, mode: octal(f.mode), owner: f.owner })),
    links,
    volume: r.volume,
    volumeOptions: ["--opt", `o=uid=${EXPORTER_UID},gid=${EXPORTER_UID}`],
    diskVolume: r.disk.volume,
    diskCommand: [
      `mkdir -p ${q(dirOf(r.disk.image))}`,
      `truncate -s ${r.disk.bytes} ${q(r.disk.image)}`,
      `mkfs.ext4 -F -q -m 0 -E root_owner=${EXPORTER_UID}:${EXPORTER_UID},lazy_itable_init=1,lazy_journal_init=1 ${
        q(r.disk.image)
      }`,
      `podman volume create --ignore --opt type=ext4 --opt device=${q(r.disk.image)} --opt o=loop ${q(r.disk.volume)}`,
    ].join(" && "),
    units: [r.units.runtime, r.units.exporter],
    remove: [
      ...r.files.filter((f) => !f.secret).map((f) => f.path),
      ...links.map((l) => l.dest),
      configMountDir(r.name),
      r.disk.image,
    ],
  };
}
