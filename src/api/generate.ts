/** `deno task crds`: writes `crds/*.yaml` (ours) and `test/crds/*.yaml` (Jumpstarter's, for tests) from the schemas. */
import { crdFiles, crdKustomization, JUMPSTARTER_CRDS } from "./crds.ts";

async function write(dir: URL, files: { name: string; yaml: string }[]) {
  for (const f of files) {
    await Deno.writeTextFile(new URL(f.name, dir), f.yaml);
    console.log(`wrote ${new URL(f.name, dir).pathname}`);
  }
}

await write(new URL("../../crds/", import.meta.url), [
  ...crdFiles(),
  { name: "kustomization.yaml", yaml: crdKustomization() },
]);
await write(new URL("../../test/crds/", import.meta.url), crdFiles(JUMPSTARTER_CRDS));
