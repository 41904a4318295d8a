/** `deno task crds`: writes `crds/*.yaml` from the TypeScript schemas. */
import { crdFiles } from "./crds.ts";

const dir = new URL("../../crds/", import.meta.url);
for (const f of crdFiles()) {
  await Deno.writeTextFile(new URL(f.name, dir), f.yaml);
  console.log(`wrote crds/${f.name}`);
}
