import fc from "fast-check";
import { parse, stringify } from "yaml";
import { renderYaml } from "./cand.ts";
import { configOnHost, renderCase, tryRender } from "../src/host/render_property_test.ts";
let diff = 0, n = 0;
const reasons = new Map<string, number>();
for (const inst of fc.sample(renderCase, { numRuns: 2000, seed: 3 })) {
  const r = tryRender(inst); if (!r) continue; n++;
  const obj = parse(configOnHost(r, inst));
  const a = stringify(obj, { lineWidth: 0, aliasDuplicateObjects: false });
  const b = renderYaml(obj);
  if (a !== b) { diff++; const al = a.split("\n"), bl = b.split("\n"); const i = al.findIndex((l, j) => l !== bl[j]); const k = JSON.stringify(al[i]).slice(0,60) + " => " + JSON.stringify(bl[i]).slice(0,60); if (diff < 15) console.log(k); }
}
console.log({ n, diff });
