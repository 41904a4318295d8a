/**
 * `kubectl apply -k manifests` as kustomize builds it: Kubernetes' recommended app.kubernetes.io labels on every object
 * beside the operator's own, and neither in the Deployment's selector (immutable on upgrade) beyond what the operator
 * selects. The files themselves keep exactly the operator's labels (test/rbac_test.ts compares them).
 */
import assert from "node:assert/strict";
import { parse, parseAllDocuments } from "yaml";
import { MANIFESTS } from "./rbac.ts";

const OPERATOR_LABELS = {
  component: "exporterset-controller",
  provisioner: "qemu-ssh-jumpstarter-dev",
  controller: "jumpstarter",
};
const RECOMMENDED = {
  "app.kubernetes.io/name": "qemu-ssh-provisioner",
  "app.kubernetes.io/instance": "jumpstarter-exporterset-qemu-ssh-jumpstarter-dev",
  "app.kubernetes.io/component": "exporterset-controller",
  "app.kubernetes.io/part-of": "jumpstarter",
  "app.kubernetes.io/managed-by": "kustomize",
};

/** The first of these on PATH, with the arguments that build a kustomization directory. */
function kustomizer(): string[] | undefined {
  const dirs = (Deno.env.get("PATH") ?? "").split(":").filter(Boolean);
  for (const [bin, ...args] of [["kustomize", "build"], ["kubectl", "kustomize"]]) {
    for (const d of dirs) {
      try {
        if (Deno.statSync(`${d}/${bin}`).isFile) return [`${d}/${bin}`, ...args];
      } catch {
        // not in this directory
      }
    }
  }
  return undefined;
}
const build = kustomizer();

Deno.test("manifests: kustomization.yaml adds the recommended labels, never to selectors", async () => {
  // deno-lint-ignore no-explicit-any
  const k = parse(await Deno.readTextFile(new URL("kustomization.yaml", MANIFESTS))) as any;
  assert.deepEqual(k.labels, [{ pairs: RECOMMENDED, includeSelectors: false, includeTemplates: true }]);
  assert.equal(k.commonLabels, undefined, "commonLabels would change the Deployment's selector");
});

Deno.test({
  name: "manifests: kustomize puts the recommended labels on every object and the Pod template, not the selector",
  ignore: build === undefined,
  async fn() {
    const [cmd, ...args] = build!;
    const out = await new Deno.Command(cmd, { args: [...args, MANIFESTS.pathname], stdout: "piped", stderr: "piped" })
      .output();
    assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
    // deno-lint-ignore no-explicit-any
    const objects = parseAllDocuments(new TextDecoder().decode(out.stdout)).map((d) => d.toJS() as any);
    assert.deepEqual(objects.map((o) => o.kind).sort(), [
      "ClusterRole",
      "ClusterRoleBinding",
      "Deployment",
      "Role",
      "RoleBinding",
      "Secret",
      "ServiceAccount",
    ]);
    for (const o of objects) {
      assert.deepEqual(o.metadata.labels, { ...OPERATOR_LABELS, ...RECOMMENDED }, o.kind);
    }
    const d = objects.find((o) => o.kind === "Deployment");
    assert.deepEqual(d.spec.selector, { matchLabels: OPERATOR_LABELS }, "the operator's selector, exactly");
    assert.deepEqual(d.spec.template.metadata.labels, { ...OPERATOR_LABELS, ...RECOMMENDED });
  },
});
