/**
 * Simulated lab hosts for tests and the sandbox: a thin wrapper around labhost.sh (systemd-nspawn system containers
 * with sshd, podman/quadlet, /dev/kvm and stand-in images). Needs root.
 *
 * Usage:
 *   const net = { dir: "/tmp/qsp-test-lab", bridge: "qsplab1", subnet: "10.78.0" };
 *   try {
 *     const hosts = await startLabHosts(net, 2);
 *     await hostExec(hosts[0], "podman ps");
 *   } finally {
 *     await stopLabHosts(net); // also cleans up after a partly failed start
 *   }
 *
 * Two sets coexist as long as their dir, bridge and subnet differ.
 *
 * @module
 */

import { resolve } from "node:path";

export interface LabHost {
  name: string;
  address: string;
  port: number;
  user: string;
  privateKeyPath: string;
  knownHostsPath: string;
}

export interface LabNet {
  dir: string;
  bridge: string;
  /** first three octets of a /24, e.g. "10.78.0"; the bridge gets .1, host hN gets .(10+N) */
  subnet: string;
  /**
   * Image tarballs imported under these tags at boot, in place of the stand-ins (labhost.sh's LAB_IMAGES); a host
   * running with other ones is rebooted.
   */
  images?: { tarball: string; tag: string }[];
  /** A Podman 4.x version built from source in place of the suite's (labhost.sh's LAB_PODMAN), e.g. "4.9.3". */
  podman?: string;
  /** The Debian suite of the hosts (labhost.sh's SUITE), default trixie; "bookworm" has Podman 4.3.1, no quadlet. */
  suite?: string;
  /** The mode of each host's own /dev/kvm node, root:kvm (LAB_KVM_MODE): "0660" (the default) or "0666", say. */
  kvmMode?: string;
  /** How long a boot may take until sshd answers (LAB_BOOT_TIMEOUT, default 90 s): images are imported before it. */
  bootTimeoutSeconds?: number;
}

export interface ExecResult {
  code: number;
  stdout: string;
  stderr: string;
}

export const labhostScript: string = `${import.meta.dirname}/labhost.sh`;

/** Environment that points labhost.sh at one set, for running it by hand or from other tools. */
export function labNetEnv(net: LabNet): Record<string, string> {
  return {
    LAB_DIR: net.dir,
    LAB_BRIDGE: net.bridge,
    LAB_BRIDGE_ADDR: `${net.subnet}.1`,
    LAB_PREFIX: "24",
    LAB_IMAGES: (net.images ?? []).map((i) => `${i.tarball}=${i.tag}`).join(" "),
    ...(net.podman ? { LAB_PODMAN: net.podman } : {}),
    ...(net.suite ? { SUITE: net.suite } : {}),
    ...(net.kvmMode ? { LAB_KVM_MODE: net.kvmMode } : {}),
    ...(net.bootTimeoutSeconds ? { LAB_BOOT_TIMEOUT: String(net.bootTimeoutSeconds) } : {}),
  };
}

async function run(cmd: string, args: string[], env?: Record<string, string>): Promise<ExecResult> {
  const out = await new Deno.Command(cmd, { args, env, stdin: "null", stdout: "piped", stderr: "piped" }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

async function labhost(net: LabNet, ...args: string[]): Promise<ExecResult> {
  return await run("bash", [labhostScript, ...args], labNetEnv(net));
}

function check(what: string, r: ExecResult): void {
  if (r.code !== 0) throw new Error(`labhost.sh ${what} failed (exit ${r.code}):\n${r.stderr}${r.stdout}`);
}

/** Boots h1..hN at subnet.11.. in parallel; resolves when sshd answers on every host. */
export async function startLabHosts(net: LabNet, count: number): Promise<LabHost[]> {
  if (!/^\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(net.subnet)) {
    throw new Error(`subnet must look like "10.78.0": ${net.subnet}`);
  }
  // Podman's default network inside every lab host is 10.88.0.0/16: a host address there would be routed into it.
  if (net.subnet.startsWith("10.88.")) throw new Error(`subnet ${net.subnet}.0/24 overlaps Podman's 10.88.0.0/16`);
  if (count < 1 || count > 200) throw new Error(`count out of range: ${count}`);
  // one build up front, so the parallel "up"s below do not all queue on the cache lock with their boot timeouts
  check("base", await labhost(net, "base"));
  const dir = resolve(net.dir);
  const hosts: LabHost[] = [];
  for (let i = 1; i <= count; i++) {
    hosts.push({
      name: `h${i}`,
      address: `${net.subnet}.${10 + i}`,
      port: 22,
      user: "root",
      privateKeyPath: `${dir}/keys/id_ed25519`,
      knownHostsPath: `${dir}/known_hosts`,
    });
  }
  const results = await Promise.all(hosts.map((h) => labhost(net, "up", h.name, h.address)));
  const failed = results.flatMap((r, i) => r.code === 0 ? [] : [`${hosts[i].name}: exit ${r.code}\n${r.stderr}`]);
  if (failed.length > 0) throw new Error(`labhost.sh up failed:\n${failed.join("\n")}`);
  return hosts;
}

// Only hosts with a directory in this set count: netns names alone could belong to another set with the same bridge.
async function hostNames(net: LabNet): Promise<string[]> {
  const names: string[] = [];
  try {
    for await (const e of Deno.readDir(`${net.dir}/hosts`)) if (e.isDirectory) names.push(e.name);
  } catch (e) {
    if (!(e instanceof Deno.errors.NotFound)) throw e;
  }
  return names;
}

/** Destroys every host of the set and its bridge. Safe to call twice and after a failed start. */
export async function stopLabHosts(net: LabNet): Promise<void> {
  const names = await hostNames(net);
  const results = await Promise.all(names.map((n) => labhost(net, "destroy", n)));
  const netDown = await labhost(net, "net-down");
  const failed = results.flatMap((r, i) => r.code === 0 ? [] : [`${names[i]}: exit ${r.code}\n${r.stderr}`]);
  check("net-down", netDown);
  if (failed.length > 0) throw new Error(`labhost.sh destroy failed:\n${failed.join("\n")}`);
}

/** A host of the set by name, or an error naming the hosts there are. */
async function ownHost(net: LabNet, name: string): Promise<void> {
  const names = await hostNames(net);
  if (!names.includes(name)) {
    throw new Error(`no lab host ${name} in ${net.dir}: the hosts there are ${names.sort().join(", ") || "none"}`);
  }
}

/**
 * Powers a host of the set off, as a lab host's power button does (an orderly poweroff, labhost.sh down): its rootfs,
 * disks, host keys and network namespace stay, so powerOnLabHost brings the same host back. While it is off its
 * address refuses connections.
 */
export async function powerOffLabHost(net: LabNet, name: string): Promise<void> {
  await ownHost(net, name);
  check(`down ${name}`, await labhost(net, "down", name));
}

/** Powers a host that powerOffLabHost stopped on again at its address; resolves when its sshd answers. */
export async function powerOnLabHost(net: LabNet, host: Pick<LabHost, "name" | "address">): Promise<void> {
  await ownHost(net, host.name);
  check(`up ${host.name}`, await labhost(net, "up", host.name, host.address));
}

/** The system ssh client's arguments for a lab host, strict host key checking included, before the command. */
export function sshArgs(host: LabHost): string[] {
  return [
    "-F",
    "/dev/null",
    "-i",
    host.privateKeyPath,
    "-p",
    String(host.port),
    "-o",
    "BatchMode=yes",
    "-o",
    "LogLevel=ERROR",
    "-o",
    "ConnectTimeout=5",
    "-o",
    "StrictHostKeyChecking=yes",
    "-o",
    `UserKnownHostsFile=${host.knownHostsPath}`,
    "-o",
    "GlobalKnownHostsFile=/dev/null",
    `${host.user}@${host.address}`,
  ];
}

/**
 * sshd (OpenSSH >= 9.8, PerSourcePenalties) refuses every connection from an address that failed authentication a few
 * times, for seconds to minutes, before its banner. The tests connect from the address the controller uses, so after a
 * fault with a wrong key they are shut out with it.
 */
const REFUSED_BEFORE_BANNER = /kex_exchange_identification: (Connection closed by remote host|read: Connection reset)/;
const REFUSED_WAIT_MS = 90_000;

/**
 * Runs a shell command on a lab host with the system ssh client and strict host key checking. For test assertions
 * only: the product connects with its own SSH code. While sshd shuts the address out before its banner, the command
 * is tried again (bounded): what the test looks at is the host, not sshd's penalty on the controller's address.
 */
export async function hostExec(host: LabHost, command: string): Promise<ExecResult> {
  const deadline = Date.now() + REFUSED_WAIT_MS;
  for (;;) {
    const r = await run("ssh", [...sshArgs(host), command]);
    if (r.code !== 255 || !REFUSED_BEFORE_BANNER.test(r.stderr) || Date.now() > deadline) return r;
    await new Promise((resolve) => setTimeout(resolve, 1_000));
  }
}
