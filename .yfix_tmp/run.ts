import fc from "fast-check";
import { parse } from "yaml";
import { renderYaml } from "./cand.ts";
import { configOnHost, intendedConfig, renderCase, tryRender } from "../src/host/render_property_test.ts";
const PY = await Deno.readTextFile(".yfix_tmp/py.py");
const child = new Deno.Command("python3", { args: ["-c", PY], stdin: "piped", stdout: "piped" }).spawn();
const n = Number(Deno.args[0] ?? 3000);
const reqs: string[] = [];
const metas: unknown[] = [];
const tag = (x: number) => ({ $num: Number.isNaN(x) ? "nan" : x > 0 ? "inf" : "-inf" });
const wire = (v: unknown) => JSON.stringify(v, (_k, x) => typeof x === "number" && !Number.isFinite(x) ? tag(x) : x).replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
let npmBad = 0;
for (const inst of fc.sample(renderCase, { numRuns: n, seed: Number(Deno.args[1] ?? 7) })) {
  const r = tryRender(inst); if (!r) continue;
  const obj = parse(configOnHost(r, inst));
  const text = renderYaml(obj);
  const exp = intendedConfig(inst);
  try { (await import("node:assert/strict")).deepStrictEqual(parse(text), exp); (await import("node:assert/strict")).deepStrictEqual(parse(text, { version: "1.1" }), exp); } catch (e) { npmBad++; if (npmBad < 3) console.log("npm mismatch", String(e).slice(0, 400)); }
  reqs.push(wire({ yaml: text, expected: exp })); metas.push(text);
}
const w = child.stdin.getWriter();
const enc = new TextEncoder();
(async () => { for (const r of reqs) await w.write(enc.encode(r + "\n")); await w.close(); })();
const out = new TextDecoder().decode((await child.output()).stdout).trim().split("\n");
let bad = 0;
const kinds = new Map<string, number>();
out.forEach((l, i) => { const o = JSON.parse(l); if (!o.ok) { bad++; const k = (o.error ?? "mismatch").slice(0, 90); kinds.set(k, (kinds.get(k) ?? 0) + 1); if (bad < 4) console.log(JSON.stringify(metas[i]).slice(0, 600), "\n  ->", o.error ?? o.got); } });
console.log(`cases ${reqs.length}, pyyaml failures ${bad}, npm failures ${npmBad}`, kinds);
