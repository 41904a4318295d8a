import assert from "node:assert/strict";
import { crdFiles, crdKustomization, CRDS, JUMPSTARTER_CRDS } from "./crds.ts";
import type { ExporterSetSpec } from "./types.ts";

Deno.test("crds/ and test/crds/ are what `deno task crds` generates", async () => {
  const expected = [
    ...[...crdFiles(), { name: "kustomization.yaml", yaml: crdKustomization() }].map((f) => ({ ...f, dir: "crds" })),
    ...crdFiles(JUMPSTARTER_CRDS).map((f) => ({ ...f, dir: "test/crds" })),
  ];
  for (const f of expected) {
    const onDisk = await Deno.readTextFile(new URL(`../../${f.dir}/${f.name}`, import.meta.url));
    assert.equal(onDisk, f.yaml, `${f.dir}/${f.name} is out of date: run \`deno task crds\``);
  }
});

Deno.test("ExporterSet has the upstream scale subresource and defaults", () => {
  const es = CRDS.find((c) => c.metadata.name === "exportersets.virtualtarget.jumpstarter.dev")!;
  // deno-lint-ignore no-explicit-any
  const v = (es.spec.versions as any[])[0];
  assert.deepEqual(v.subresources.scale, {
    specReplicasPath: ".spec.maxReplicas",
    statusReplicasPath: ".status.replicas",
    labelSelectorPath: ".status.selector",
  });
  const spec = v.schema.openAPIV3Schema.properties.spec;
  assert.equal(spec.properties.maxReplicas.default, 4);
  assert.equal(spec.properties.scaleDownCooldown.default, "5m");
  assert.deepEqual(spec.required, ["virtualTargetClassName"]);
});

Deno.test("schema-derived types accept the seed's ExporterSet", () => {
  const spec: ExporterSetSpec = {
    minReplicas: 0,
    maxReplicas: 4,
    minAvailableReplicas: 1,
    scaleDownCooldown: "5m",
    recycleStrategy: "ExitAndReplace",
    virtualTargetClassName: "qemu-ssh-aarch64",
    selector: { matchLabels: { board: "aarch64-qemu", virtual: "true" } },
    template: {
      metadata: { labels: { board: "aarch64-qemu", arch: "aarch64", virtual: "true" } },
      spec: { drivers: [{ name: "qemu", type: "jumpstarter_driver_qemu.driver.Qemu" }] },
    },
  };
  assert.equal(spec.template?.spec?.drivers?.[0].name, "qemu");
});
