import assert from "node:assert/strict";
import { resourceOfPath } from "./client.ts";

Deno.test("resourceOfPath: the resource, and its subresource, a request path names", () => {
  const cases: [string, string][] = [
    ["/apis/virtualtarget.jumpstarter.dev/v1alpha1/namespaces/lab/exportersets/pool/status", "exportersets/status"],
    ["/apis/jumpstarter.dev/v1alpha1/exporters?watch=1&resourceVersion=5", "exporters"],
    ["/api/v1/namespaces/lab/events/pool.1", "events"],
    ["/api/v1/namespaces/lab", "namespaces"],
    ["/api/v1/namespaces", "namespaces"],
    ["/apis/coordination.k8s.io/v1/namespaces/lab/leases", "leases"],
  ];
  for (const [path, want] of cases) assert.equal(resourceOfPath(path), want, path);
});
