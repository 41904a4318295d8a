/**
 * The controller as in production (`deno run $(sh scripts/permissions.sh) main.ts run ...`: `deno task run:prod`,
 * heap bound included), or, to take V8
 * CPU profiles of its phases, the same command line on the main thread (bench/scale/entry.ts: main.ts runs it in a
 * Worker, which the inspector does not profile) with Deno's inspector on a local port (Profiler domain over the
 * DevTools protocol; sampling every 1 ms). CPU time and memory come from /proc (utime + stime, VmRSS, VmHWM).
 */
import type { Sample } from "../prom.ts";
import { getFrom, metricsFrom, procOf, type ProcSample } from "../controller.ts";
import { launcherFlags } from "../../test/env.ts";

const ROOT = new URL("../../", import.meta.url).pathname;
const READY_TIMEOUT_MS = 120_000;

function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = l.addr.port;
  l.close();
  return port;
}

export interface ProfileSummary {
  seconds: number;
  sampledMs: number;
  /** Self time by function (name file:line), largest first. */
  top: { fn: string; selfMs: number; pct: number }[];
  /** Self time by source file (node_modules and internals grouped by package/area), largest first. */
  byFile: { file: string; selfMs: number; pct: number }[];
}

export interface LiveHeap {
  usedMiB: number;
  totalMiB: number;
  rssMiB: number;
  sampledLiveMiB: number;
  byFunction: { k: string; mib: number }[];
  byFile: { k: string; mib: number }[];
}

interface HeapNode {
  callFrame: { functionName: string; url: string; lineNumber: number };
  selfSize: number;
  children: HeapNode[];
}

interface CpuProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  hitCount?: number;
}

/** Controllers started and not yet stopped, so an interrupted run can stop them (see bench/scale.ts). */
export const liveControllers = new Set<ScaleController>();

export class ScaleController {
  #ws?: WebSocket;
  #nextId = 1;
  #pending = new Map<number, (v: { result?: unknown; error?: unknown }) => void>();

  private constructor(
    private readonly child: Deno.ChildProcess,
    private readonly port: number,
    private readonly inspectPort: number | undefined,
    private readonly logDone: Promise<void>,
  ) {}

  get pid(): number {
    return this.child.pid;
  }

  static async start(opts: {
    kubeconfig: string;
    namespace: string;
    logPath: string;
    args?: string[];
    inspect?: boolean;
    /** Extra `deno run` flags, e.g. --v8-flags=... */
    denoFlags?: string[];
  }): Promise<ScaleController> {
    const port = freePort();
    const inspectPort = opts.inspect ? freePort() : undefined;
    const child = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        // as production runs it (heap bound included); the profiled entry runs everything on the main thread
        ...inspectPort ? ["-A"] : await launcherFlags(),
        ...opts.denoFlags ?? [],
        ...inspectPort ? [`--inspect=127.0.0.1:${inspectPort}`, "bench/scale/entry.ts"] : ["main.ts"],
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
    const open = () => Deno.open(opts.logPath, { write: true, create: true, append: true });
    const logDone = Promise.all([
      open().then((f) => child.stdout.pipeTo(f.writable)),
      open().then((f) => child.stderr.pipeTo(f.writable)),
    ]).then(() => {});
    const c = new ScaleController(child, port, inspectPort, logDone);
    liveControllers.add(c);
    let exited = false;
    child.status.then(() => exited = true);
    const deadline = Date.now() + READY_TIMEOUT_MS;
    while (!await c.#get("/readyz").then((r) => r.ok, () => false)) {
      if (exited || Date.now() > deadline) {
        await c.stop();
        throw new Error(`controller did not become ready (${exited ? "it exited" : "timeout"}); see ${opts.logPath}`);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    return c;
  }

  #get(path: string): Promise<Response> {
    return getFrom(this.port, path);
  }

  metrics(): Promise<Sample[]> {
    return metricsFrom(this.port);
  }

  proc(): Promise<ProcSample> {
    return procOf(this.pid);
  }

  async #send(method: string, params: Record<string, unknown> = {}): Promise<unknown> {
    if (!this.#ws) {
      const list = await (await fetch(`http://127.0.0.1:${this.inspectPort}/json/list`)).json();
      const ws = new WebSocket(list[0].webSocketDebuggerUrl);
      await new Promise((ok, fail) => {
        ws.onopen = ok;
        ws.onerror = fail;
      });
      ws.onmessage = (m) => {
        const msg = JSON.parse(m.data);
        if (msg.id !== undefined) this.#pending.get(msg.id)?.(msg);
      };
      this.#ws = ws;
    }
    const id = this.#nextId++;
    const reply = new Promise<{ result?: unknown; error?: unknown }>((r) => this.#pending.set(id, r));
    this.#ws.send(JSON.stringify({ id, method, params }));
    const msg = await reply;
    this.#pending.delete(id);
    if (msg.error) throw new Error(`${method}: ${JSON.stringify(msg.error)}`);
    return msg.result;
  }

  get profiling(): boolean {
    return this.inspectPort !== undefined;
  }

  async startProfile(): Promise<void> {
    if (!this.profiling) return;
    await this.#send("Profiler.enable");
    await this.#send("Profiler.setSamplingInterval", { interval: 1000 });
    await this.#send("Profiler.start");
    await this.#send("HeapProfiler.enable");
    await this.#send("HeapProfiler.startSampling", { samplingInterval: 16384 });
  }

  /**
   * After a full GC: the V8 heap in use, RSS, and what the objects still alive were allocated by (the sampling heap
   * profiler started with the CPU profile keeps only samples of objects that survived), by function and by file.
   */
  async liveHeap(): Promise<LiveHeap | undefined> {
    if (!this.profiling) return undefined;
    await this.#send("HeapProfiler.collectGarbage");
    const usage = await this.#send("Runtime.getHeapUsage") as { usedSize: number; totalSize: number };
    const { profile } = await this.#send("HeapProfiler.stopSampling") as { profile: { head: HeapNode } };
    const byFn = new Map<string, number>();
    const byFile = new Map<string, number>();
    const walk = (n: HeapNode) => {
      if (n.selfSize) {
        const fn = `${n.callFrame.functionName || "(anonymous)"} ${area(n.callFrame.url)}:${
          n.callFrame.lineNumber + 1
        }`;
        byFn.set(fn, (byFn.get(fn) ?? 0) + n.selfSize);
        byFile.set(area(n.callFrame.url), (byFile.get(area(n.callFrame.url)) ?? 0) + n.selfSize);
      }
      n.children.forEach(walk);
    };
    walk(profile.head);
    const mib = (b: number) => b / 1048576;
    const rank = (m: Map<string, number>) =>
      [...m].sort((a, b) => b[1] - a[1]).slice(0, 20).map(([k, v]) => ({ k, mib: mib(v) }));
    return {
      usedMiB: mib(usage.usedSize),
      totalMiB: mib(usage.totalSize),
      rssMiB: (await this.proc()).rssMiB,
      sampledLiveMiB: mib([...byFile.values()].reduce((a, b) => a + b, 0)),
      byFunction: rank(byFn),
      byFile: rank(byFile),
    };
  }

  /** Stops the profile; writes the raw .cpuprofile to `path` and returns a summary. */
  async stopProfile(path: string): Promise<ProfileSummary | undefined> {
    if (!this.profiling) return undefined;
    const { profile } = await this.#send("Profiler.stop") as {
      profile: { nodes: CpuProfileNode[]; startTime: number; endTime: number; samples: number[] };
    };
    await Deno.writeTextFile(path, JSON.stringify(profile));
    return summarize(profile);
  }

  async stop(): Promise<void> {
    liveControllers.delete(this);
    try {
      this.#ws?.close();
    } catch {
      // gone
    }
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

function area(url: string): string {
  if (!url) return "(native/idle/gc)";
  const nm = /node_modules\/(?:\.deno\/)?((?:@[^/]+\/)?[^/@]+)/.exec(url);
  if (nm) return `npm:${nm[1]}`;
  const m = /\/work\/main\/(.*)$/.exec(url) ?? /file:\/\/\/.*\/((?:src|bench|test)\/.*)$/.exec(url);
  if (m) return m[1];
  if (url.startsWith("ext:") || url.startsWith("node:")) return url.split("/").slice(0, 2).join("/");
  return url;
}

export function summarize(
  profile: { nodes: CpuProfileNode[]; startTime: number; endTime: number; samples: number[] },
): ProfileSummary {
  const seconds = (profile.endTime - profile.startTime) / 1e6;
  const msPerSample = profile.samples.length ? (seconds * 1000) / profile.samples.length : 1;
  const hits = new Map<number, number>();
  for (const s of profile.samples) hits.set(s, (hits.get(s) ?? 0) + 1);
  const byFn = new Map<string, number>();
  const byFile = new Map<string, number>();
  let busy = 0;
  for (const n of profile.nodes) {
    const h = hits.get(n.id) ?? n.hitCount ?? 0;
    if (!h) continue;
    const name = n.callFrame.functionName || "(anonymous)";
    if (name === "(idle)" || name === "(program)") continue;
    busy += h;
    const fn = `${name} ${area(n.callFrame.url)}:${n.callFrame.lineNumber + 1}`;
    byFn.set(fn, (byFn.get(fn) ?? 0) + h);
    const file = name === "(garbage collector)" ? "(garbage collector)" : area(n.callFrame.url);
    byFile.set(file, (byFile.get(file) ?? 0) + h);
  }
  const rank = (m: Map<string, number>, n: number) =>
    [...m].sort((a, b) => b[1] - a[1]).slice(0, n).map(([k, h]) => ({
      k,
      selfMs: h * msPerSample,
      pct: (100 * h) / Math.max(busy, 1),
    }));
  return {
    seconds,
    sampledMs: busy * msPerSample,
    top: rank(byFn, 25).map(({ k, selfMs, pct }) => ({ fn: k, selfMs, pct })),
    byFile: rank(byFile, 20).map(({ k, selfMs, pct }) => ({ file: k, selfMs, pct })),
  };
}
