/** EventRecorder against the real API server: what lands is a core/v1 Event about the object, and repeats count up. */
import assert from "node:assert/strict";
import { freshNamespace, testEnv } from "./env.ts";
import { KubeClient } from "../src/kube/client.ts";
import { EventRecorder } from "../src/kube/events.ts";
import { CONFIG_MAPS, EVENTS } from "../src/kube/resources.ts";
import type { ConfigMap, KubeObject } from "../src/api/types.ts";
import { silentLogger } from "../src/observe/log.ts";

interface CoreEvent extends KubeObject {
  involvedObject: { apiVersion?: string; kind?: string; name?: string; namespace?: string; uid?: string };
  type: string;
  reason: string;
  message: string;
  count: number;
  source: { component: string };
  firstTimestamp: string;
  lastTimestamp: string;
}

Deno.test("events: core/v1 Events about the object; a repeat within the window bumps count; later ones start anew", async () => {
  const env = await testEnv();
  const client = await KubeClient.load(env.kubeconfig);
  try {
    const ns = await freshNamespace(client, "kev");
    const cm = await client.create<ConfigMap>(CONFIG_MAPS, { metadata: { name: "subject", namespace: ns } });
    let now = new Date("2030-01-01T00:00:00Z");
    const recorder = new EventRecorder(client, "qsp-test", silentLogger, () => now);
    const events = async () => {
      const list = await client.list<CoreEvent>(EVENTS, ns);
      return await Promise.all(list.items.map((e) => client.get<CoreEvent>(EVENTS, ns, e.metadata.name!)));
    };

    recorder.event(cm, "Warning", "HostUnreachable", "ssh: connect timed out");
    await recorder.flush();
    const [first, ...others] = await events();
    assert.equal(others.length, 0);
    assert.equal(first.apiVersion, "v1");
    assert.equal(first.kind, "Event");
    assert.deepEqual(
      { ...first.involvedObject, resourceVersion: undefined },
      {
        apiVersion: "v1",
        kind: "ConfigMap",
        name: "subject",
        namespace: ns,
        uid: cm.metadata.uid,
        resourceVersion: undefined,
      },
    );
    assert.equal(first.type, "Warning");
    assert.equal(first.reason, "HostUnreachable");
    assert.equal(first.message, "ssh: connect timed out");
    assert.equal(first.source.component, "qsp-test");
    assert.equal(first.count, 1);

    now = new Date(now.getTime() + 60_000);
    recorder.event(cm, "Warning", "HostUnreachable", "ssh: connect timed out");
    recorder.event(cm, "Warning", "HostUnreachable", "ssh: connect timed out");
    await recorder.flush();
    const [bumped, ...none] = await events();
    assert.equal(none.length, 0, "a repeat must not create a new Event");
    assert.equal(bumped.metadata.name, first.metadata.name);
    assert.equal(bumped.count, 3);
    assert.equal(bumped.firstTimestamp, first.firstTimestamp);
    assert.equal(bumped.lastTimestamp, "2030-01-01T00:01:00Z");

    recorder.event(cm, "Normal", "Provisioned", "ready");
    await recorder.flush();
    assert.equal((await events()).length, 2, "another reason is another Event");

    // Past the window (10 min) a repeat starts a new series, as it does when the Event has expired meanwhile.
    now = new Date(now.getTime() + 11 * 60_000);
    recorder.event(cm, "Warning", "HostUnreachable", "ssh: connect timed out");
    await recorder.flush();
    assert.equal((await events()).filter((e) => e.reason === "HostUnreachable").length, 2);

    await client.delete(EVENTS, ns, first.metadata.name!);
    const ready = (await events()).find((e) => e.reason === "Provisioned")!;
    await client.delete(EVENTS, ns, ready.metadata.name!);
    recorder.event(cm, "Normal", "Provisioned", "ready");
    await recorder.flush();
    const again = (await events()).filter((e) => e.reason === "Provisioned");
    assert.equal(again.length, 1, "an Event deleted under the recorder (TTL) is recreated, not lost");
    assert.equal(again[0].count, 1);
  } finally {
    client.close();
  }
});
