import assert from "node:assert/strict";
import { KubeClient, KubeError } from "./kube/client.ts";
import { readClusterId } from "./run.ts";

/** A client whose only read, of namespace kube-system, answers `answer`. */
const answering = (answer: () => Promise<unknown>): Pick<KubeClient, "find" | "server"> => ({
  server: "https://api.example.com:6443",
  find: <T>() => answer() as Promise<T>,
});

Deno.test("readClusterId: --cluster-id, else the kube-system namespace's uid, else a startup error naming the fix", async () => {
  const unread = answering(() => Promise.reject(new Error("must not be read")));
  assert.equal(await readClusterId(unread, "staging"), "staging");
  const uid = "3f0c1e2a-0000-4000-8000-000000000001";
  assert.equal(await readClusterId(answering(() => Promise.resolve({ metadata: { uid } })), undefined), uid);
  const forbidden = answering(() => Promise.reject(new KubeError(403, "Forbidden", "namespaces is forbidden")));
  await assert.rejects(
    readClusterId(forbidden, undefined),
    /forbidden to read namespace kube-system.*manifests\/clusterrole\.yaml.*--cluster-id/,
  );
  await assert.rejects(readClusterId(answering(() => Promise.resolve(undefined)), undefined), /--cluster-id/);
});
