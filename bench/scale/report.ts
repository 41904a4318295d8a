/** The scale benchmark's results: bench/results/scale.{json,md}, the fitted model, and the closing line. */
import { join } from "node:path";
import { RESULTS_DIR } from "../report.ts";
import { type LinearFit, linearFit, round } from "../stats.ts";
import type { SizeResult, TimelineSample } from "./run.ts";

export interface ScaleResults {
  startedAt: string;
  wallSeconds: number;
  machine: {
    cpus: number;
    loadavg: { start: string; end: string };
    commit: string;
    /** src/ or main.ts had uncommitted changes (others edit the tree while the bench runs). */
    dirty: boolean;
    deno: string;
  };
  perHost: number;
  /** How the controller was started. */
  entry: string;
  resyncSeconds: number;
  hostStartSeconds: Record<number, number>;
  idleHostMemory: Record<number, { pssKiB: number; tmpfsKiB: number; processes: number }>;
  sizes: SizeResult[];
  model?: Record<string, LinearFit & { at2000: number; at500: number }>;
  failed?: string;
}

export const scaleLine = (s: SizeResult) =>
  `scale hosts=${s.hosts} instances=${s.instances} converge=${s.converge.seconds.toFixed(1)}s ` +
  `floor=${s.floor.deploySeconds.toFixed(1)}s teardown=${s.teardown.seconds.toFixed(1)}s ` +
  `rss-peak=${s.rssMiB.peak.toFixed(0)}MiB cpu=${s.converge.cpuSeconds.toFixed(1)}s ` +
  `ssh-connections=${s.converge.sshConnections}`;

/** Linear fits against hosts (the instance count is hosts x perHost in every run), projected to 500 and 2000 hosts. */
export function model(sizes: SizeResult[]): ScaleResults["model"] {
  if (new Set(sizes.map((s) => s.hosts)).size < 2) return undefined;
  const xs = sizes.map((s) => s.hosts);
  const series: Record<string, number[]> = {
    convergeSeconds: sizes.map((s) => s.converge.seconds),
    floorSeconds: sizes.map((s) => s.floor.deploySeconds),
    teardownSeconds: sizes.map((s) => s.teardown.seconds),
    teardownFloorSeconds: sizes.map((s) => s.floor.teardownSeconds),
    convergeCpuSeconds: sizes.map((s) => s.converge.cpuSeconds),
    teardownCpuSeconds: sizes.map((s) => s.teardown.cpuSeconds),
    peakRssMiB: sizes.map((s) => s.rssMiB.peak),
    convergedRssMiB: sizes.map((s) => s.rssMiB.converged),
    convergeApiRequests: sizes.map((s) => s.converge.apiRequests),
    teardownApiRequests: sizes.map((s) => s.teardown.apiRequests),
    convergeSshCommands: sizes.map((s) => s.converge.sshCommands),
  };
  const out: NonNullable<ScaleResults["model"]> = {};
  for (const [k, ys] of Object.entries(series)) {
    const fit = linearFit(xs, ys);
    out[k] = { ...fit, at500: fit.intercept + fit.slope * 500, at2000: fit.intercept + fit.slope * 2000 };
  }
  return out;
}

const TIMELINE_ROW_S = 20;

/** The timeline in rows of about `every` seconds: the cumulative figures as of the row's end, rates over the row. */
export function timelineRows(samples: TimelineSample[], every: number) {
  const out = [];
  let from = samples[0];
  for (const [i, x] of samples.entries()) {
    if (i === 0 || (x.t - from.t < every - 0.5 && i < samples.length - 1)) continue;
    out.push({
      t: x.t,
      cores: (x.busyCoreSeconds - from.busyCoreSeconds) / (x.t - from.t),
      credentials: x.credentials,
      available: x.available,
      queueDepth: x.queueDepth,
      sshCommands: x.sshCommands - from.sshCommands,
      apiRequests: x.apiRequests - from.apiRequests,
    });
    from = x;
  }
  return out;
}

const f = (v: number | undefined | null, d = 1) =>
  v === undefined || v === null || Number.isNaN(v) ? "–" : String(round(v, d));
const row = (cells: (string | number)[]) => `| ${cells.join(" | ")} |`;

export function markdown(r: ScaleResults): string {
  const L: string[] = [
    `# Scale benchmark: N lab hosts x ${r.perHost} instances (issue 12)`,
    "",
    `${r.startedAt}, commit ${r.machine.commit.slice(0, 12)}${
      r.machine.dirty ? " (src/ had uncommitted changes)" : ""
    }, ` +
    `${r.machine.cpus} CPUs shared with other work (load average ${r.machine.loadavg.start} at start, ` +
    `${r.machine.loadavg.end} at the end), ${r.machine.deno}; total ${f(r.wallSeconds, 0)} s.` +
    (r.failed ? ` **The run failed: ${r.failed}**` : ""),
    "",
    "World: `test/scalehost/scalehost.sh` (one real OpenSSH sshd per host address in its own mount namespace, the " +
    "project's host scripts run by the machine's sh and coreutils, systemd/Podman/journald replaced by recording " +
    "fakes), `test/controlplane` (kube-apiserver, etcd, kube-controller-manager with its garbage collector), the " +
    "fake Jumpstarter (`test/fake_jumpstarter.ts`), the controller as `deno task run:prod run` " +
    `(--resync=${r.resyncSeconds} --sweep-interval=${r.resyncSeconds}; started as ${r.entry}). Everything on the ` +
    "same 2 CPUs.",
    "",
    "## Converge and delete",
    "",
    row([
      "hosts",
      "inst.",
      "converge s",
      "floor s",
      "conv/floor",
      "set avail p50/p95 s",
      "creds s",
      "delete s",
      "del floor s",
      "del/floor",
      "left",
    ]),
    row(["---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:"]),
  ];
  for (const s of r.sizes) {
    L.push(row([
      s.hosts,
      s.instances,
      f(s.converge.seconds),
      f(s.floor.deploySeconds),
      f(s.converge.seconds / s.floor.deploySeconds, 2),
      `${f(s.converge.setAvailable.p50)} / ${f(s.converge.setAvailable.p95)}`,
      f(s.converge.credentialsSeconds),
      f(s.teardown.seconds),
      f(s.floor.teardownSeconds),
      f(s.teardown.seconds / s.floor.teardownSeconds, 2),
      s.teardown.leftovers.length,
    ]));
  }
  L.push(
    "",
    "floor: the same apply (remove) scripts for every instance sent at once by the project's LabHosts over an " +
      "SshPool whose connections were opened beforehand (6 channels per host, as the controller). creds: until " +
      "every Exporter had its token from the fake Jumpstarter. left: hosts with any file, generated unit, active " +
      "unit, container or volume left, read from the fakes' state.",
    "",
    "## The controller's cost",
    "",
    row([
      "hosts",
      "CPU conv/del s",
      "RSS idle/conv/peak MiB",
      "KiB/inst above idle",
      "API req conv/del",
      "(server side)",
      "SSH conn",
      "SSH cmds conv/del",
      "reconciles conv/del",
      "host PSS KiB",
    ]),
    row(["---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:"]),
  );
  for (const s of r.sizes) {
    L.push(row([
      s.hosts,
      `${f(s.converge.cpuSeconds)} / ${f(s.teardown.cpuSeconds)}`,
      `${f(s.rssMiB.idle, 0)} / ${f(s.rssMiB.converged, 0)} / ${f(s.rssMiB.peak, 0)}`,
      f(s.kibPerInstanceAboveIdle, 0),
      `${s.converge.apiRequests} / ${s.teardown.apiRequests}`,
      `${s.converge.apiRequestsServerSide} / ${s.teardown.apiRequestsServerSide}`,
      `${s.converge.sshConnections} (+${s.teardown.sshConnections})`,
      `${s.converge.sshCommands} / ${s.teardown.sshCommands}`,
      `${s.converge.reconciles} / ${s.teardown.reconciles}`,
      f(s.hostMemory.pssKiBPerHost, 0),
    ]));
  }
  L.push(
    "",
    "CPU: the controller process's utime+stime. API req: the controller's rest_client_requests_total (server side: " +
      "apiserver_request_total minus the bench's and the fake Jumpstarter's own counts; includes the garbage " +
      "collector). SSH conn: accepted by the hosts' sshd (the controller's own metric agrees unless noted in the " +
      "JSON). SSH cmds: recorded by the hosts (session-recorder). host PSS: all sshd processes of a host with the " +
      "controller connected, per host; the hosts' tmpfs state is in the JSON.",
  );
  const kinds = (k: Record<string, number> | undefined) =>
    Object.entries(k ?? {}).sort((a, b) => b[1] - a[1]).map(([kind, v]) => `${kind} ${v}`).join(", ") || "-";
  for (const s of r.sizes) {
    L.push(
      "",
      `SSH commands by script at ${s.hosts} x ${s.perHost}: converge ${kinds(s.converge.sshCommandsByKind)}; ` +
        `delete ${kinds(s.teardown.sshCommandsByKind)}.`,
    );
  }
  for (const s of r.sizes) {
    L.push(
      "",
      `Waits for the controller's API token bucket at ${s.hosts} x ${s.perHost}, summed over requests ` +
        `(rest_client_rate_limiter_wait_seconds_total): converge ${f(s.converge.apiRateLimitedSeconds)} s over ` +
        `${s.converge.apiRequests} requests, delete ${f(s.teardown.apiRateLimitedSeconds)} s over ` +
        `${s.teardown.apiRequests}.`,
    );
  }
  const groups = (g: Record<string, number> | undefined) =>
    Object.entries(g ?? {}).map(([k, v]) => `${k} ${f(v)}`).join(", ") || "-";
  for (const s of r.sizes) {
    L.push(
      "",
      `CPU seconds by process group at ${s.hosts} x ${s.perHost} (/proc; a live process counts its ended children, ` +
        "machine: all CPUs busy): floor deploy " + groups(s.floor.cpuByGroup?.deploy) + "; converge " +
        groups(s.converge.cpuByGroup) + "; floor remove " + groups(s.floor.cpuByGroup?.teardown) + "; delete " +
        groups(s.teardown.cpuByGroup) + ".",
    );
  }
  for (const s of r.sizes) {
    const rows = timelineRows(s.converge.timeline ?? [], TIMELINE_ROW_S);
    if (!rows.length) continue;
    L.push(
      "",
      `Converge timeline at ${s.hosts} x ${s.perHost}, every ${TIMELINE_ROW_S} s from the first create (cores: the ` +
        "machine's, busy on average over the row; SSH commands and API requests: the controller's, in the row):",
      "",
      row(["t s", "cores busy", "credentials", "sets available", "queue depth", "SSH cmds", "API req"]),
      row(["--:", "--:", "--:", "--:", "--:", "--:", "--:"]),
      ...rows.map((x) =>
        row([f(x.t, 0), f(x.cores, 2), x.credentials, x.available, x.queueDepth, x.sshCommands, x.apiRequests])
      ),
    );
  }
  const steady = r.sizes.find((s) => s.steady);
  if (steady?.steady) {
    const st = steady.steady;
    L.push(
      "",
      `## Steady state (${steady.hosts} x ${steady.perHost}, ${f(st.minutes)} min, resync ${st.resyncSeconds} s)`,
      "",
      `SSH commands per host per resync: ${
        Object.entries(st.perHostPerResync).map(([k, v]) => `${k} ${f(v, 2)}`).join(", ")
      }; API requests ${f(st.apiRequestsPerMinute)} per minute (${st.apiRequests} in the window: ${
        Object.entries(st.apiRequestsByCall ?? {}).sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k} ${v}`).join(", ")
      }); controller CPU ${f(st.cpuSeconds / st.minutes, 2)} s per minute; SSH connections opened ` +
        `${st.sshConnections}.`,
    );
  }
  if (r.model) {
    L.push(
      "",
      "## Fitted model (least squares against hosts; instances = hosts x " + r.perHost + ")",
      "",
      row(["quantity", "per host", `per instance`, "fixed", "r2", "at 500", "at 2000"]),
      row(["---", "---:", "---:", "---:", "---:", "---:", "---:"]),
    );
    for (const [k, m] of Object.entries(r.model)) {
      L.push(
        row([
          k,
          f(m.slope, 3),
          f(m.slope / r.perHost, 4),
          f(m.intercept, 1),
          f(m.r2, 3),
          f(m.at500, 0),
          f(m.at2000, 0),
        ]),
      );
    }
  }
  for (const s of r.sizes) {
    for (
      const [what, p] of [["converge", s.converge.profile], ["steady", s.steady?.profile], [
        "delete",
        s.teardown.profile,
      ]] as const
    ) {
      if (!p) continue;
      L.push(
        "",
        `## CPU profile: ${s.hosts} hosts, ${what} (${f(p.sampledMs / 1000)} s on the main thread of ${
          f(p.seconds)
        } s)`,
        "",
        row(["self ms", "%", "file / area"]),
        row(["---:", "---:", "---"]),
        ...p.byFile.slice(0, 12).map((x) => row([f(x.selfMs, 0), f(x.pct), `\`${x.file}\``])),
        "",
        row(["self ms", "%", "function"]),
        row(["---:", "---:", "---"]),
        ...p.top.slice(0, 15).map((x) => row([f(x.selfMs, 0), f(x.pct), `\`${x.fn}\``])),
      );
    }
    for (
      const [what, h] of [["converged", s.converge.heap], ["steady", s.steady?.heap], [
        "deleted",
        s.teardown.heap,
      ]] as const
    ) {
      if (!h) continue;
      L.push(
        "",
        `## Live heap: ${s.hosts} hosts, ${what} (after a full GC: V8 heap ${f(h.usedMiB)} MiB used of ${
          f(h.totalMiB)
        }; ` +
          `RSS ${f(h.rssMiB)} MiB; sampled live ${f(h.sampledLiveMiB)} MiB)`,
        "",
        row(["MiB", "allocated in (file)"]),
        row(["---:", "---"]),
        ...h.byFile.slice(0, 10).map((x) => row([f(x.mib, 2), `\`${x.k}\``])),
        "",
        row(["MiB", "allocated by (function)"]),
        row(["---:", "---"]),
        ...h.byFunction.slice(0, 12).map((x) => row([f(x.mib, 2), `\`${x.k}\``])),
      );
    }
  }
  L.push("", scaleLine(r.sizes[r.sizes.length - 1]), "");
  return L.join("\n");
}

export async function writeScaleResults(r: ScaleResults, name = "scale"): Promise<string[]> {
  r.model = model(r.sizes);
  await Deno.mkdir(RESULTS_DIR, { recursive: true });
  const out: string[] = [];
  const json = JSON.stringify(r, (_k, v) => typeof v === "number" ? round(v, 3) : v, 2) + "\n";
  for (const [ext, text] of [["json", json], ["md", markdown(r)]]) {
    const path = join(RESULTS_DIR, `${name}.${ext}`);
    await Deno.writeTextFile(`${path}.tmp`, await denoFmt(text, ext));
    await Deno.rename(`${path}.tmp`, path);
    out.push(path);
  }
  return out;
}

async function denoFmt(text: string, ext: string): Promise<string> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["fmt", `--config=${join(import.meta.dirname!, "..", "..", "deno.json")}`, `--ext=${ext}`, "-"],
    stdin: "piped",
    stdout: "piped",
  }).spawn();
  const w = child.stdin.getWriter();
  await w.write(new TextEncoder().encode(text));
  await w.close();
  const out = await child.output();
  return out.success ? new TextDecoder().decode(out.stdout) : text;
}
