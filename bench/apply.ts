/**
 * `deno task bench:apply`: one apply, a no-op re-apply and one remove of the seed's instance on an idle lab host,
 * over the product's own LabHosts + SshPool, ROUNDS times; prints medians, the SSH round trips per operation and the
 * connections opened.
 */
import { join } from "node:path";
import { type LabNet, startLabHosts, stopLabHosts } from "../test/labhost/labhost.ts";
import { seedInstance } from "../test/fixtures.ts";
import { renderInstance } from "../src/host/render.ts";
import { LabHosts } from "../src/host/lab.ts";
import { SshPool } from "../src/host/ssh.ts";
import { directTarget } from "../test/e2e_world.ts";
import { percentile, round } from "./stats.ts";
import { RESULTS_DIR } from "./report.ts";

const ROUNDS = Number(Deno.env.get("ROUNDS") ?? 7);
const LAB: LabNet = { dir: "/tmp/qsp-bench-apply-lab", bridge: "qsplaba", subnet: "10.92.0" };

const [host] = await startLabHosts(LAB, 1);
const pool = new SshPool();
const lab = new LabHosts(pool);
const times: Record<"connect" | "apply" | "noop" | "remove", number[]> = {
  connect: [],
  apply: [],
  noop: [],
  remove: [],
};
let commands = 0;
try {
  const target = await directTarget(host);
  const timed = async (k: keyof typeof times, f: () => Promise<unknown>) => {
    const t0 = performance.now();
    await f();
    times[k].push(performance.now() - t0);
  };
  await timed("connect", () => pool.exec(target, "true"));
  // learned as the controller does on first contact, before the count starts
  const { facts } = await lab.inspect(target);
  const before = pool.stats().commands;
  for (let i = 0; i < ROUNDS; i++) {
    const r = renderInstance(seedInstance({ name: `bench-apply-${i}`, uid: crypto.randomUUID() }), facts);
    await timed("apply", () => lab.apply(target, r, { kvmRequired: true, keepExited: true }));
    await timed("noop", () => lab.apply(target, r, { kvmRequired: true, keepExited: true }));
    await timed("remove", () => lab.remove(target, r.name));
  }
  commands = pool.stats().commands - before;
} finally {
  await pool.close();
  await stopLabHosts(LAB);
}

const med = (k: keyof typeof times) => round(percentile(times[k], 50), 0);
const md = [
  `# One instance on an idle lab host (${ROUNDS} rounds, medians, ms)`,
  "",
  "| first connect + exec | apply (cold) | apply (no change) | remove | SSH round trips per operation | connections |",
  "|--:|--:|--:|--:|--:|--:|",
  `| ${med("connect")} | ${med("apply")} | ${med("noop")} | ${med("remove")} | ${commands / (3 * ROUNDS)} | ` +
  `${pool.stats().connectionsOpened} |`,
  "",
].join("\n");
await Deno.writeTextFile(join(RESULTS_DIR, "apply.md"), md);
await Deno.writeTextFile(join(RESULTS_DIR, "apply.json"), JSON.stringify({ rounds: ROUNDS, times }, null, 2) + "\n");
console.log(md);
