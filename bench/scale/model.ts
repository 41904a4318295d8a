/**
 * `deno run -A bench/scale/model.ts`: one model over every scale run written so far (bench/results/scale*.json, but
 * not the profiled ones, nor those with extra controller flags or without a floor): cost = fixed + perHost x hosts + perInstance x instances, by least squares, and what it
 * projects for 500 x 8 and 2000 x 8. Needs runs with different instances per host to tell the two slopes apart.
 * Writes bench/results/scale-model.{json,md}.
 */
import { join } from "node:path";
import { RESULTS_DIR } from "../report.ts";
import { round } from "../stats.ts";
import type { ScaleResults } from "./report.ts";
import type { SizeResult } from "./run.ts";

/** Least squares for y = b0 + b1 x1 + b2 x2 (normal equations, 3x3, Cramer's rule). */
export function fit2(x1: number[], x2: number[], y: number[]): { b: [number, number, number]; r2: number } {
  const n = y.length;
  const s = (f: (i: number) => number) => Array.from({ length: n }, (_, i) => f(i)).reduce((a, c) => a + c, 0);
  const A = [
    [n, s((i) => x1[i]), s((i) => x2[i])],
    [s((i) => x1[i]), s((i) => x1[i] ** 2), s((i) => x1[i] * x2[i])],
    [s((i) => x2[i]), s((i) => x1[i] * x2[i]), s((i) => x2[i] ** 2)],
  ];
  const v = [s((i) => y[i]), s((i) => x1[i] * y[i]), s((i) => x2[i] * y[i])];
  const det = (m: number[][]) =>
    m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0]) +
    m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]);
  const d = det(A);
  const b = [0, 1, 2].map((k) => det(A.map((row, r) => row.map((c, j) => j === k ? v[r] : c))) / d) as [
    number,
    number,
    number,
  ];
  const mean = v[0] / n;
  const ssTot = s((i) => (y[i] - mean) ** 2);
  const ssRes = s((i) => (y[i] - (b[0] + b[1] * x1[i] + b[2] * x2[i])) ** 2);
  return { b, r2: ssTot === 0 ? 1 : 1 - ssRes / ssTot };
}

const QUANTITIES: Record<string, (s: SizeResult) => number> = {
  convergeSeconds: (s) => s.converge.seconds,
  floorSeconds: (s) => s.floor.deploySeconds,
  deleteSeconds: (s) => s.teardown.seconds,
  deleteFloorSeconds: (s) => s.floor.teardownSeconds,
  convergeCpuSeconds: (s) => s.converge.cpuSeconds,
  deleteCpuSeconds: (s) => s.teardown.cpuSeconds,
  peakRssMiB: (s) => s.rssMiB.peak,
  convergedRssMiB: (s) => s.rssMiB.converged,
  convergeApiRequests: (s) => s.converge.apiRequests,
  deleteApiRequests: (s) => s.teardown.apiRequests,
};

if (import.meta.main) {
  const runs: SizeResult[] = [];
  const sources: string[] = [];
  for await (const e of Deno.readDir(RESULTS_DIR)) {
    if (!/^scale.*\.json$/.test(e.name) || e.name.includes("profile") || e.name.includes("model")) continue;
    const r = JSON.parse(await Deno.readTextFile(join(RESULTS_DIR, e.name))) as ScaleResults;
    // profiled runs (controller on the main thread, inspector on) and runs with extra controller flags are other setups
    if (r.entry?.startsWith("bench/scale/entry.ts") || r.entry?.includes(" with ")) continue;
    if (r.sizes.some((s) => s.floor.deploySeconds === null || Number.isNaN(s.floor.deploySeconds))) continue;
    runs.push(...r.sizes);
    sources.push(`${e.name} (${r.sizes.map((s) => `${s.hosts}x${s.perHost}`).join(", ")})`);
  }
  const hosts = runs.map((s) => s.hosts);
  const instances = runs.map((s) => s.instances);
  const model: Record<
    string,
    { fixed: number; perHost: number; perInstance: number; r2: number; at500x8: number; at2000x8: number }
  > = {};
  for (const [k, q] of Object.entries(QUANTITIES)) {
    const { b, r2 } = fit2(hosts, instances, runs.map(q));
    model[k] = {
      fixed: b[0],
      perHost: b[1],
      perInstance: b[2],
      r2,
      at500x8: b[0] + b[1] * 500 + b[2] * 4000,
      at2000x8: b[0] + b[1] * 2000 + b[2] * 16000,
    };
  }
  const f = (v: number, d = 3) => String(round(v, d));
  const md = [
    "# Scale model: cost = fixed + perHost x hosts + perInstance x instances",
    "",
    `Least squares over ${runs.length} runs: ${sources.join("; ")}.`,
    "",
    "| quantity | fixed | per host | per instance | r2 | at 500 x 8 | at 2000 x 8 |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ...Object.entries(model).map(([k, m]) =>
      `| ${k} | ${f(m.fixed, 1)} | ${f(m.perHost)} | ${f(m.perInstance, 4)} | ${f(m.r2)} | ${f(m.at500x8, 0)} | ${
        f(m.at2000x8, 0)
      } |`
    ),
    "",
  ].join("\n");
  await Deno.writeTextFile(join(RESULTS_DIR, "scale-model.md"), md);
  await Deno.writeTextFile(
    join(RESULTS_DIR, "scale-model.json"),
    JSON.stringify({ sources, model }, (_k, v) => typeof v === "number" ? round(v, 4) : v, 2) + "\n",
  );
  console.log(md);
}
