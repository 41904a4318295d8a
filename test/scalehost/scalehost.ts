/**
 * Hundreds of cheap lab hosts for the scale benchmark: a thin wrapper around scalehost.sh (one network namespace,
 * one real OpenSSH sshd per address, each in its own mount namespace, systemd/Podman/journald replaced by recording
 * fakes). Needs root. Only one set exists at a time (one namespace, one directory).
 *
 *   const hosts = await startScaleHosts(500);
 *   try { ... } finally { await stopScaleHosts(); }   // also after a partly failed start
 *
 * @module
 */
import type { LabHost } from "../labhost/labhost.ts";

export const SCALE_DIR = "/tmp/qsp-scale";
const SCRIPT = `${import.meta.dirname}/scalehost.sh`;

export interface ScaleHost extends LabHost {
  /** The host's state as this machine sees it: etc-upper/ (its /etc changes), run/ (its /run), sshd.log. */
  stateDir: string;
}

async function sh(...args: string[]): Promise<string> {
  const out = await new Deno.Command("bash", {
    args: [SCRIPT, ...args],
    env: { SCALE_DIR },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  if (!out.success) {
    throw new Error(`scalehost.sh ${args.join(" ")} failed (exit ${out.code}):\n${dec.decode(out.stderr)}`);
  }
  return dec.decode(out.stdout);
}

/** Starts h1..hN; resolves when every sshd listens. */
export async function startScaleHosts(count: number): Promise<ScaleHost[]> {
  await sh("up", String(count));
  return (await sh("hosts")).trim().split("\n").map((line) => {
    const [name, address, stateDir] = line.split(" ");
    return {
      name,
      address,
      port: 22,
      user: "root",
      privateKeyPath: `${SCALE_DIR}/keys/id_ed25519`,
      knownHostsPath: `${SCALE_DIR}/known_hosts`,
      stateDir,
    };
  });
}

/** Kills every process in the namespace (by pid), deletes it, unmounts and removes the state. Safe to repeat. */
export async function stopScaleHosts(): Promise<void> {
  await sh("down");
}

/** Hosts with anything of an instance left (files, generated units, active units, containers, volumes). */
export async function leftovers(): Promise<string[]> {
  return (await sh("leftovers")).split("\n").filter((l) => l.trim());
}

/** PSS of all the hosts' processes, the tmpfs they write to, and how many processes there are. */
export async function hostMemory(): Promise<{ pssKiB: number; tmpfsKiB: number; processes: number }> {
  const [pss, tmpfs, n] = (await sh("mem")).trim().split(" ").map(Number);
  return { pssKiB: pss, tmpfsKiB: tmpfs, processes: n };
}

/** Each host's record of SSH commands: [uptime seconds, first script line], from session-recorder. */
export interface Session {
  at: number;
  what: string;
}

export async function sessions(h: ScaleHost): Promise<Session[]> {
  const text = await Deno.readTextFile(`${h.stateDir}/run/fake-host/sessions`);
  return text.split("\n").filter((l) => l).map((l) => {
    const sp = l.indexOf(" ");
    return { at: Number(l.slice(0, sp)), what: l.slice(sp + 1) };
  });
}

/** Connections the host's sshd accepted so far (its log's "Accepted publickey" lines). */
export async function acceptedConnections(h: ScaleHost): Promise<number> {
  const text = await Deno.readTextFile(`${h.stateDir}/sshd.log`);
  return text.split("\n").filter((l) => l.startsWith("Accepted publickey")).length;
}

/** Number of calls each fake received so far. */
export async function fakeCalls(h: ScaleHost): Promise<{ systemctl: number; podman: number; reloads: number }> {
  const lines = async (p: string) => {
    try {
      return (await Deno.readTextFile(`${h.stateDir}/run/${p}`)).split("\n").filter((l) => l).length;
    } catch (e) {
      if (e instanceof Deno.errors.NotFound) return 0;
      throw e;
    }
  };
  return {
    systemctl: await lines("fake-systemd/calls"),
    podman: await lines("fake-podman/calls"),
    reloads: await lines("fake-systemd/reloads"),
  };
}

/** This machine's uptime in seconds: the clock session-recorder stamps with (hosts share it). */
export async function uptime(): Promise<number> {
  return Number((await Deno.readTextFile("/proc/uptime")).split(" ")[0]);
}
