import assert from "node:assert/strict";
import type { KubeObject } from "../api/types.ts";
import { silentLogger } from "../observe/log.ts";
import type { KubeApi, Resource } from "./client.ts";
import { EventRecorder } from "./events.ts";
import { FakeKube } from "./fake_client.ts";

Deno.test("events: written several at once behind a slow API server, each object's in order", async () => {
  const kube = new FakeKube();
  let inFlight = 0;
  let most = 0;
  const writes: string[] = [];
  const slow = <T>(what: string, call: () => Promise<T>) => async () => {
    inFlight++;
    most = Math.max(most, inFlight);
    await new Promise((r) => setTimeout(r, 5));
    inFlight--;
    writes.push(what);
    return await call();
  };
  const api: KubeApi = {
    find: (r, ns, name) => kube.find(r, ns, name),
    delete: (r, ns, name, p) => kube.delete(r, ns, name, p),
    create: (r, obj) => slow(`create ${(obj as { reason?: string }).reason}`, () => kube.create(r, obj))(),
    mergePatch: <T>(r: Resource, ns: string | undefined, name: string, patch: unknown, sub?: string) =>
      slow(`patch ${name}`, () => kube.mergePatch<T>(r, ns, name, patch, sub))(),
  };
  const recorder = new EventRecorder(api, "test", silentLogger);
  const objects: KubeObject[] = Array.from({ length: 20 }, (_, i) => ({
    metadata: { name: `o${i}`, namespace: "ns", uid: `u${i}` },
  }));
  for (const o of objects) recorder.event(o, "Normal", "Deployed", "deployed");
  recorder.event(objects[0], "Normal", "Deployed", "deployed"); // a repeat: patches the one just created
  await recorder.flush();
  assert.equal(most, 8, "at most 8 at once, and not one at a time");
  assert.equal(writes.filter((w) => w.startsWith("create")).length, 20);
  assert.equal(writes.filter((w) => w.startsWith("patch")).length, 1, "the repeat waited for its series' create");
});
