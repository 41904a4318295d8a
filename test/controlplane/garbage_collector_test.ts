/**
 * The run's control plane runs the real garbage collector and namespace controller (kube-controller-manager), so
 * deletion behaves as in a cluster: background, foreground and orphan propagation, a custom resource owner (an
 * Exporter and its token Secret, as Jumpstarter writes it), and a deleted namespace emptied and removed.
 */
import assert from "node:assert/strict";
import type { ConfigMap, Exporter, KubeObject, ObjectMeta, OwnerReference, Secret } from "../../src/api/types.ts";
import { KubeClient, type Resource, resourcePath } from "../../src/kube/client.ts";
import { CONFIG_MAPS, EXPORTERS, NAMESPACES, SECRETS } from "../../src/kube/resources.ts";
import { freshNamespace, testEnv, waitFor } from "../env.ts";

// A finalizer nobody serves: it keeps a dependent around, being deleted, for as long as the test wants.
const HOLD = "qsp.test/hold";

const ownerRef = (o: KubeObject, extra: Partial<OwnerReference> = {}): OwnerReference => ({
  apiVersion: o.apiVersion!,
  kind: o.kind!,
  name: o.metadata.name!,
  uid: o.metadata.uid!,
  ...extra,
});

Deno.test("garbage collector: background, foreground and orphan deletion; namespace deletion", async () => {
  const client = await KubeClient.load((await testEnv()).kubeconfig);
  const ns = await freshNamespace(client, "gc");
  const configMap = (name: string, meta: Partial<ObjectMeta> = {}) =>
    client.create<ConfigMap>(CONFIG_MAPS, { metadata: { name, namespace: ns, ...meta } });
  const remove = (r: Resource, name: string, propagationPolicy: "Background" | "Foreground" | "Orphan") =>
    client.request("DELETE", resourcePath(r, { namespace: ns, name }), {
      body: { kind: "DeleteOptions", apiVersion: "v1", propagationPolicy },
    });
  const gone = async (r: Resource, name: string) => {
    const t0 = performance.now();
    await waitFor(async () => !await client.find(r, ns, name), { what: `${name} deleted` });
    console.log(`  ${name} gone after ${Math.round(performance.now() - t0)} ms`);
  };
  try {
    const bg = await configMap("bg-owner");
    await configMap("bg-dependent", { ownerReferences: [ownerRef(bg)] });
    await remove(CONFIG_MAPS, "bg-owner", "Background");
    await gone(CONFIG_MAPS, "bg-dependent");

    const exporter = await client.create<Exporter>(EXPORTERS, {
      metadata: { name: "e1", namespace: ns },
      spec: { enabled: true },
    });
    await client.create<Secret>(SECRETS, {
      metadata: { name: "e1-exporter", namespace: ns, ownerReferences: [ownerRef(exporter, { controller: true })] },
      data: {},
    });
    await remove(EXPORTERS, "e1", "Background");
    await gone(SECRETS, "e1-exporter");

    const fg = await configMap("fg-owner");
    await configMap("fg-dependent", {
      ownerReferences: [ownerRef(fg, { blockOwnerDeletion: true })],
      finalizers: [HOLD],
    });
    await remove(CONFIG_MAPS, "fg-owner", "Foreground");
    const held = await waitFor(async () => {
      const d = await client.get<ConfigMap>(CONFIG_MAPS, ns, "fg-dependent");
      return d.metadata.deletionTimestamp ? d : undefined;
    }, { what: "the collector to delete fg-dependent" });
    const waiting = await client.get<ConfigMap>(CONFIG_MAPS, ns, "fg-owner");
    assert.ok(waiting.metadata.deletionTimestamp);
    assert.deepEqual(waiting.metadata.finalizers, ["foregroundDeletion"], "the owner waits for its dependent");
    await client.mergePatch(CONFIG_MAPS, ns, "fg-dependent", {
      metadata: { finalizers: held.metadata.finalizers!.filter((f) => f !== HOLD) },
    });
    await gone(CONFIG_MAPS, "fg-owner");
    assert.equal(await client.find(CONFIG_MAPS, ns, "fg-dependent"), undefined);

    const orphan = await configMap("orphan-owner");
    await configMap("orphan-dependent", { ownerReferences: [ownerRef(orphan)] });
    await remove(CONFIG_MAPS, "orphan-owner", "Orphan");
    await gone(CONFIG_MAPS, "orphan-owner");
    const kept = await client.get<ConfigMap>(CONFIG_MAPS, ns, "orphan-dependent");
    assert.deepEqual(kept.metadata.ownerReferences ?? [], []);

    // Not empty (orphan-dependent is left): the namespace controller must delete what is in it first.
    await client.delete(NAMESPACES, undefined, ns);
    await waitFor(async () => !await client.find(NAMESPACES, undefined, ns), { what: `namespace ${ns} deleted` });
  } finally {
    client.close();
  }
});
