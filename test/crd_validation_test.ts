/**
 * The CRDs on the real API server: the feature description's examples are accepted exactly as written (defaults
 * applied), and invalid objects are refused with the API server's own validation message.
 */
import assert from "node:assert/strict";
import { freshNamespace, seedExample, testEnv } from "./env.ts";
import { KubeClient, KubeError } from "../src/kube/client.ts";
import { EXPORTER_SETS, VIRTUAL_TARGET_CLASSES } from "../src/kube/resources.ts";
import type { ExporterSet, KubeObject, VirtualTargetClass } from "../src/api/types.ts";

async function rejection(p: Promise<unknown>): Promise<KubeError> {
  try {
    await p;
  } catch (e) {
    if (e instanceof KubeError) return e;
    throw e;
  }
  assert.fail("the API server accepted an invalid object");
}

Deno.test("crds: the seed's class and set are accepted as written, with upstream's defaults", async () => {
  const client = await KubeClient.load((await testEnv()).kubeconfig);
  try {
    const ns = await freshNamespace(client, "crd");
    const cls = await client.create(VIRTUAL_TARGET_CLASSES, await seedExample("virtualtargetclass.yaml", ns));
    assert.equal((cls as VirtualTargetClass).spec.provisioner, "qemu-ssh.jumpstarter.dev");
    assert.deepEqual((cls as VirtualTargetClass).spec.parameters?.resources, { cpu: 4, memory: "4Gi" });
    const seed = await seedExample("exporterset.yaml", ns) as ExporterSet;
    const set = await client.create(EXPORTER_SETS, seed as KubeObject) as ExporterSet;
    assert.deepEqual(set.spec, seed.spec, "stored exactly as written (every defaulted field was given)");

    const minimal = await client.create(EXPORTER_SETS, {
      metadata: { name: "minimal", namespace: ns },
      spec: { virtualTargetClassName: "qemu-ssh-aarch64" },
    } as KubeObject) as ExporterSet;
    assert.deepEqual(
      [minimal.spec.minReplicas, minimal.spec.maxReplicas, minimal.spec.minAvailableReplicas],
      [0, 4, 0],
    );
    assert.equal(minimal.spec.scaleDownCooldown, "5m");
    assert.equal(minimal.spec.recycleStrategy, "ExitAndReplace");
  } finally {
    client.close();
  }
});

Deno.test("crds: invalid ExporterSets are refused with the API server's validation message", async () => {
  const client = await KubeClient.load((await testEnv()).kubeconfig);
  try {
    const ns = await freshNamespace(client, "crd");
    const seed = await seedExample("exporterset.yaml", ns) as ExporterSet;
    const invalid: [string, (s: ExporterSet) => void, RegExp][] = [
      ["min > max", (s) => s.spec.minReplicas = 5, /minReplicas must be <= maxReplicas/],
      ["minAvailable > max", (s) => s.spec.minAvailableReplicas = 9, /minAvailableReplicas must be <= maxReplicas/],
      [
        "no class name",
        (s) => delete (s.spec as Partial<ExporterSet["spec"]>).virtualTargetClassName,
        /spec.virtualTargetClassName: Required value/,
      ],
      [
        "driver with type and ref",
        (s) => s.spec.template!.spec!.drivers![0].ref = "shared-qemu",
        /set exactly one of type or ref/,
      ],
      ["bad cooldown", (s) => s.spec.scaleDownCooldown = "5 minutes", /spec.scaleDownCooldown/],
      [
        "bad strategy",
        (s) => (s.spec as { recycleStrategy: string }).recycleStrategy = "Sometimes",
        /Unsupported value/,
      ],
    ];
    for (const [what, mutate, message] of invalid) {
      const obj = structuredClone(seed);
      obj.metadata.name = `bad-${invalid.findIndex(([w]) => w === what)}`;
      mutate(obj);
      const e = await rejection(client.create(EXPORTER_SETS, obj as KubeObject));
      assert.equal(e.status, 422, `${what}: ${e.message}`);
      assert.match(e.message, message, what);
    }
    // max 0 means unbounded: the min <= max rules do not apply.
    const unbounded = structuredClone(seed);
    unbounded.metadata.name = "unbounded";
    Object.assign(unbounded.spec, { minReplicas: 5, maxReplicas: 0 });
    await client.create(EXPORTER_SETS, unbounded as KubeObject);
  } finally {
    client.close();
  }
});

Deno.test("crds: a class's setOverrides is stored with its defaults; a device pattern outside /dev is refused", async () => {
  const client = await KubeClient.load((await testEnv()).kubeconfig);
  try {
    const ns = await freshNamespace(client, "crd");
    const cls = await seedExample("virtualtargetclass.yaml", ns) as VirtualTargetClass;
    cls.spec.setOverrides = { devices: ["/dev/ttyUSB*"] };
    const stored = await client.create(VIRTUAL_TARGET_CLASSES, cls as KubeObject) as VirtualTargetClass;
    assert.deepEqual(stored.spec.setOverrides, { host: true, user: false, port: false, devices: ["/dev/ttyUSB*"] });
    const bad = structuredClone(cls);
    bad.metadata.name = "bad-devices";
    bad.spec.setOverrides = { devices: ["/etc/*"] };
    const e = await rejection(client.create(VIRTUAL_TARGET_CLASSES, bad as KubeObject));
    assert.equal(e.status, 422, e.message);
    assert.match(e.message, /spec\.setOverrides\.devices\[0\]/);
  } finally {
    client.close();
  }
});
