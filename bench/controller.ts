/**
 * The controller as a separate process, started exactly as a person would (`deno run -A main.ts run ...`), so its
 * CPU time and memory are its own: read from /proc/<pid>/stat (utime + stime) and /proc/<pid>/status (VmRSS, VmHWM),
 * and its /metrics scraped on the health port.
 */
import { join } from "node:path";
import { parseProm, type Sample } from "./prom.ts";

const ROOT = new URL("../", import.meta.url).pathname;
const READY_TIMEOUT_MS = 60_000;

export interface ProcSample {
  /** User + system CPU time since the process started. */
  cpuSeconds: number;
  rssMiB: number;
  /** Peak resident set size so far. */
  peakRssMiB: number;
}

let clockTicks: number | undefined;
export async function ticksPerSecond(): Promise<number> {
  if (clockTicks === undefined) {
    const out = await new Deno.Command("getconf", { args: ["CLK_TCK"], stdout: "piped" }).output();
    clockTicks = Number(new TextDecoder().decode(out.stdout).trim()) || 100;
  }
  return clockTicks;
}

function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = l.addr.port;
  l.close();
  return port;
}

export class ControllerProcess {
  private constructor(
    private readonly child: Deno.ChildProcess,
    private readonly port: number,
    private readonly logDone: Promise<void>,
  ) {}

  get pid(): number {
    return this.child.pid;
  }

  /** Starts the controller for one namespace and waits until it reports ready (caches synced). */
  static async start(
    opts: { kubeconfig: string; namespace: string; logPath: string; args?: string[] },
  ): Promise<ControllerProcess> {
    const port = freePort();
    const child = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        "main.ts",
        "run",
        "--kubeconfig",
        opts.kubeconfig,
        "--namespace",
        opts.namespace,
        `--health-probe-bind-address=127.0.0.1:${port}`,
        ...opts.args ?? [],
      ],
      cwd: ROOT,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    // both streams appended to one file (a stream can only be piped into one writer, hence two handles)
    const open = () => Deno.open(opts.logPath, { write: true, create: true, append: true });
    const logDone = Promise.all([
      open().then((f) => child.stdout.pipeTo(f.writable)),
      open().then((f) => child.stderr.pipeTo(f.writable)),
    ]).then(() => {});
    const c = new ControllerProcess(child, port, logDone);
    let exited = false;
    child.status.then(() => exited = true);
    const deadline = Date.now() + READY_TIMEOUT_MS;
    while (!await c.get("/readyz").then((r) => r.ok, () => false)) {
      if (exited || Date.now() > deadline) {
        await c.stop();
        throw new Error(`controller did not become ready (${exited ? "it exited" : "timeout"}); see ${opts.logPath}`);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    return c;
  }

  private get(path: string): Promise<Response> {
    return getFrom(this.port, path);
  }

  metrics(): Promise<Sample[]> {
    return metricsFrom(this.port);
  }

  metricsText(): Promise<string> {
    return metricsTextFrom(this.port);
  }

  proc(): Promise<ProcSample> {
    return procOf(this.pid);
  }

  /** SIGTERM (graceful: it finishes in-flight work), SIGKILL after 20 s. */
  async stop(): Promise<void> {
    try {
      this.child.kill("SIGTERM");
    } catch {
      // already gone
    }
    const timer = setTimeout(() => {
      try {
        this.child.kill("SIGKILL");
      } catch {
        // already gone
      }
    }, 20_000);
    await this.child.status;
    clearTimeout(timer);
    await this.logDone.catch(() => {});
  }
}

export const logPath = (dir: string, ns: string) => join(dir, `controller-${ns}.log`);

/** A GET to a controller's health listener, body discarded (readiness and liveness checks). */
export async function getFrom(port: number, path: string): Promise<Response> {
  const res = await fetch(`http://127.0.0.1:${port}${path}`);
  await res.body?.cancel().catch(() => {});
  return res;
}

/** A controller's /metrics, parsed. */
export async function metricsFrom(port: number): Promise<Sample[]> {
  return parseProm(await metricsTextFrom(port));
}

/** A controller's /metrics as it serves it (with the HELP and TYPE lines). */
export async function metricsTextFrom(port: number): Promise<string> {
  const res = await fetch(`http://127.0.0.1:${port}/metrics`);
  if (!res.ok) throw new Error(`controller /metrics: ${res.status}`);
  return await res.text();
}

/** CPU and memory of a process, from /proc. */
export async function procOf(pid: number): Promise<ProcSample> {
  const [stat, status] = await Promise.all([
    Deno.readTextFile(`/proc/${pid}/stat`),
    Deno.readTextFile(`/proc/${pid}/status`),
  ]);
  // fields after the parenthesised command name: state is field 3, utime 14, stime 15
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  const kib = (key: string) => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, "m").exec(status)?.[1] ?? NaN);
  return {
    cpuSeconds: (Number(f[11]) + Number(f[12])) / await ticksPerSecond(),
    rssMiB: kib("VmRSS") / 1024,
    peakRssMiB: kib("VmHWM") / 1024,
  };
}
