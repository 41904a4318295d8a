/**
 * CPU by process group over a phase, from /proc: which of the programs sharing this machine's cores spent them (the
 * control plane, the controller, the lab hosts' sshd and the scripts they ran, the bench). Each live process counts
 * its own time and that of its children it has reaped (stat's cutime and cstime), so a script that ran and ended
 * under a host's sshd is that host's, and nothing is counted twice. A process that ended during the phase without a
 * live parent reaping it is lost: the split is a lower bound per group, the machine's total the reference.
 */
import { ticksPerSecond } from "./controller.ts";

/** By "pid/starttime", so a pid reused during the phase is another process. */
export type CpuSnapshot = Map<string, { group: string; seconds: number }>;

/** Names a process's group from its pid and its command name (stat's comm, at most 15 characters). */
export type Grouping = (pid: number, comm: string) => string;

async function cpuSnapshot(groupOf: Grouping): Promise<CpuSnapshot> {
  const ticks = await ticksPerSecond();
  const snap: CpuSnapshot = new Map();
  for await (const entry of Deno.readDir("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    let stat: string;
    try {
      stat = await Deno.readTextFile(`/proc/${entry.name}/stat`);
    } catch {
      continue; // ended since the listing
    }
    const comm = stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")"));
    // fields after the command name: utime is field 14, stime 15, cutime 16, cstime 17, starttime 22
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const used = Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14]);
    const pid = Number(entry.name);
    snap.set(`${pid}/${f[19]}`, { group: groupOf(pid, comm), seconds: used / ticks });
  }
  return snap;
}

/** The processes' and the machine's CPU at one moment. */
export interface CpuReading {
  procs: CpuSnapshot;
  /** /proc/stat: jiffies busy and total, all CPUs. */
  busy: number;
  jiffies: number;
}

export async function readCpu(groupOf: Grouping): Promise<CpuReading> {
  return { ...await machineCpu(), procs: await cpuSnapshot(groupOf) };
}

/** CPU seconds per group between two readings, largest first, then the whole machine's as "machine". */
export async function cpuSplit(a: CpuReading, b: CpuReading): Promise<Record<string, number>> {
  const tenth = (x: number) => Math.round(x * 10) / 10;
  const out: Record<string, number> = {};
  for (const [key, { group, seconds }] of b.procs) {
    out[group] = (out[group] ?? 0) + seconds - (a.procs.get(key)?.seconds ?? 0);
  }
  const groups = Object.entries(out).map(([g, x]) => [g, tenth(x)] as const).sort((x, y) => y[1] - x[1]);
  return { ...Object.fromEntries(groups), machine: tenth((b.busy - a.busy) / await ticksPerSecond()) };
}

/** Seconds all CPUs have been busy since boot: a timeline's cheap reading (one file, not a thousand). */
export async function machineBusySeconds(): Promise<number> {
  return (await machineCpu()).busy / await ticksPerSecond();
}

async function machineCpu(): Promise<{ busy: number; jiffies: number }> {
  const line = (await Deno.readTextFile("/proc/stat")).split("\n")[0].split(/\s+/).slice(1).map(Number);
  const [user, nice, system, idle, iowait, irq, softirq, steal] = line;
  const busy = user + nice + system + irq + softirq + (steal ?? 0);
  return { busy, jiffies: busy + idle + iowait };
}
