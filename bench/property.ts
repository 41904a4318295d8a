/**
 * `deno task bench:property [--runs N] [--seed S] [--only TEXT]`: every bad-input property of the unit suite
 * (src/provision/params_property_test.ts, src/host/render_property_test.ts) at 10,000 cases or more, with a fresh seed
 * unless given, plus one the unit suite cannot have because it needs python3 with PyYAML: that the exporter's own
 * YAML reader loads the rendered ExporterConfig as intended.
 *
 * A failing property is shrunk once to a minimal counterexample; the rest of its budget still runs, unshrunk, to
 * count how often it fails and how many distinct errors there are. Prints a table and the counterexamples; exits 1
 * when any property failed.
 */
import assert from "node:assert/strict";
import { parseArgs } from "node:util";
import fc from "fast-check";
import { type NamedProperty, PARAMS_PROPERTIES } from "../src/provision/params_property_test.ts";
import {
  configOnHost,
  intendedConfig,
  RENDER_PROPERTIES,
  renderCase,
  tryRender,
} from "../src/host/render_property_test.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: { runs: { type: "string", default: "10000" }, seed: { type: "string" }, only: { type: "string" } },
});
const RUNS = Number(values.runs);
const SEED = values.seed !== undefined ? Number(values.seed) : Math.floor(Math.random() * 2 ** 31);

// ---------------------------------------------------------------- PyYAML, the reader of `jmp run`

const PY = String.raw`
import json, math, sys, yaml
def same(a, b):
    if isinstance(b, dict) and list(b) == ["$num"]:
        return isinstance(a, float) and (math.isnan(a) if b["$num"] == "nan" else a == float(b["$num"]))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b
for line in sys.stdin:
    req = json.loads(line)
    try:
        got = yaml.safe_load(req["yaml"])
        out = {"ok": same(got, req["expected"]), "got": repr(got)[:300]}
    except Exception as e:
        out = {"ok": False, "error": type(e).__name__ + ": " + str(e).splitlines()[0]}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
`;

/** ASCII-only JSON, non-finite numbers tagged: the pipe's encoding and JSON's gaps stay out of the comparison. */
function wire(v: unknown): string {
  const tag = (x: number) => ({ $num: Number.isNaN(x) ? "nan" : x > 0 ? "inf" : "-inf" });
  return JSON.stringify(v, (_k, x) => typeof x === "number" && !Number.isFinite(x) ? tag(x) : x)
    .replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

class PyYaml {
  #child: Deno.ChildProcess;
  #writer: WritableStreamDefaultWriter<Uint8Array>;
  #lines: AsyncIterator<string>;

  private constructor(child: Deno.ChildProcess) {
    this.#child = child;
    this.#writer = child.stdin.getWriter();
    let rest = "";
    this.#lines = child.stdout.pipeThrough(new TextDecoderStream()).pipeThrough(
      new TransformStream<string, string>({
        transform(chunk, out) {
          const parts = (rest + chunk).split("\n");
          rest = parts.pop()!;
          for (const p of parts) out.enqueue(p);
        },
      }),
    )[Symbol.asyncIterator]();
  }

  static async start(): Promise<PyYaml | undefined> {
    try {
      const probe = await new Deno.Command("python3", { args: ["-c", "import yaml"], stderr: "null" }).output();
      if (!probe.success) return undefined;
    } catch {
      return undefined;
    }
    const env = { PYTHONIOENCODING: "utf-8" };
    return new PyYaml(new Deno.Command("python3", { args: ["-c", PY], env, stdin: "piped", stdout: "piped" }).spawn());
  }

  async load(yaml: string, expected: unknown): Promise<{ ok: boolean; error?: string; got?: string }> {
    await this.#writer.write(new TextEncoder().encode(`${wire({ yaml, expected })}\n`));
    const line = await this.#lines.next();
    if (line.done) throw new Error("python3 exited");
    return JSON.parse(line.value);
  }

  async close() {
    await this.#writer.close();
    await this.#child.status;
  }
}

function pyYamlProperty(py: PyYaml): NamedProperty {
  return {
    name: "(4p) PyYAML, as `jmp run` reads it, loads the ExporterConfig to exactly the intended object",
    runs: 0,
    property: () =>
      fc.asyncProperty(renderCase, async (inst) => {
        const r = tryRender(inst);
        if (!r) return;
        const out = await py.load(configOnHost(r, inst), intendedConfig(inst));
        assert.ok(out.ok, out.error ?? `read back differently:\n${out.got}`);
      }),
  };
}

// ---------------------------------------------------------------- running

interface Row {
  name: string;
  cases: number;
  seconds: number;
  failures: number;
  distinct: Map<string, number>;
  report?: string;
}

/** An error's kind: its first line with quoted values elided (plus the first differing line of a deep-equal). */
function kind(e: unknown): string {
  const lines = String(e instanceof Error ? e.message : e).split("\n");
  const diff = lines.find((l) => /^[+-] /.test(l.trim()))?.trim();
  const head = lines[0].replace(/"(?:[^"\\]|\\.)*"/g, '"…"').slice(0, 120);
  return diff ? `${head} ${diff.slice(0, 80)}` : head;
}

async function bench(p: NamedProperty, seed: number): Promise<Row> {
  const t0 = performance.now();
  const row: Row = { name: p.name, cases: 0, seconds: 0, failures: 0, distinct: new Map() };
  const details = await fc.check(p.property(), { numRuns: RUNS, seed });
  row.cases = details.numRuns;
  if (details.failed) {
    row.failures = 1;
    row.report = fc.defaultReportMessage(details);
    row.distinct.set(kind(details.errorInstance), 1);
    // the rest of the budget, unshrunk: how often, and in how many ways, it fails
    const prop = p.property();
    for (const v of fc.sample(prop, { numRuns: Math.max(0, RUNS - row.cases), seed: seed + 1 })) {
      const out = await prop.run(v);
      // a case whose precondition failed was not run, as fast-check does not count it either
      if (out && !("error" in out)) continue;
      row.cases++;
      if (out) {
        row.failures++;
        const key = kind(out.error);
        row.distinct.set(key, (row.distinct.get(key) ?? 0) + 1);
      }
    }
  }
  row.seconds = (performance.now() - t0) / 1000;
  return row;
}

const py = await PyYaml.start();
// each property's seed follows from its place in the full list, so --only reproduces a run
const props = [...PARAMS_PROPERTIES, ...RENDER_PROPERTIES, ...(py ? [pyYamlProperty(py)] : [])]
  .map((p, i) => ({ p, seed: SEED + 1000 * i }))
  .filter(({ p }) => !values.only || p.name.includes(values.only));
console.log(`bench:property: ${props.length} properties, ${RUNS} cases each, seed ${SEED}`);
if (!py) console.log("(4p) skipped: python3 with PyYAML not found");

const rows: Row[] = [];
try {
  for (const { p, seed } of props) {
    const row = await bench(p, seed);
    rows.push(row);
    const verdict = row.failures ? `${row.failures} failures, ${row.distinct.size} distinct` : "ok";
    console.error(`  ${row.name}: ${row.cases} cases, ${row.seconds.toFixed(1)}s, ${verdict}`);
  }
} finally {
  await py?.close();
}

const pad = (s: string | number, n: number) => String(s).padStart(n);
console.log(`\n${"property".padEnd(100)} ${pad("cases", 7)} ${pad("time", 8)} ${pad("failures", 9)}`);
for (const r of rows) {
  console.log(
    `${r.name.slice(0, 100).padEnd(100)} ${pad(r.cases, 7)} ${pad(`${r.seconds.toFixed(1)}s`, 8)} ${
      pad(r.failures, 9)
    }`,
  );
}
const total = rows.reduce((a, r) => ({ cases: a.cases + r.cases, seconds: a.seconds + r.seconds }), {
  cases: 0,
  seconds: 0,
});
console.log(`${"total".padEnd(100)} ${pad(total.cases, 7)} ${pad(`${total.seconds.toFixed(1)}s`, 8)}`);

for (const r of rows.filter((r) => r.failures)) {
  console.log(`\n== ${r.name}: ${r.failures} of ${r.cases} cases failed`);
  for (const [msg, n] of [...r.distinct].sort((a, b) => b[1] - a[1]).slice(0, 8)) console.log(`  ${pad(n, 6)}x ${msg}`);
  console.log(`  minimal counterexample (reproduce: --seed ${SEED} --only '${r.name.slice(0, 4)}'):`);
  console.log(r.report!.split("\n").filter((l) => !l.startsWith("Hint:")).map((l) => `    ${l}`).join("\n"));
}
const failed = rows.filter((r) => r.failures).length;
console.log(`\n${failed ? `${failed} of ${rows.length} properties failed` : "all properties held"}; seed ${SEED}`);
Deno.exit(failed ? 1 : 0);
