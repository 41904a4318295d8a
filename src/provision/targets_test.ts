import assert from "node:assert/strict";
import type { ExporterSet, Secret, VirtualTargetClass } from "../api/types.ts";
import { PROVISIONER } from "../api/types.ts";
import type { LabTarget } from "./credentials.ts";
import { CREDENTIALS_ANNOTATION, deployedTargets, parseTarget, setTarget, targetString } from "./targets.ts";
import { PINNED_HOST_KEYS_SECRET } from "./credentials.ts";
import { ed25519Key } from "../../test/fixtures.ts";
import { Buffer } from "node:buffer";

const like: LabTarget = {
  namespace: "lab",
  user: "root",
  host: "a.example.com",
  port: 22,
  privateKey: "k",
  knownHosts: "",
  hostKeyPolicy: "AcceptNew",
};

Deno.test("targets: the ssh-target annotation round-trips, credentials kept", () => {
  const moved = { ...like, user: "lab", host: "b.example.com", port: 2222 };
  assert.equal(targetString(moved), "lab@b.example.com:2222");
  assert.deepEqual(parseTarget(targetString(moved), like), moved);
  assert.deepEqual(parseTarget("not a target", like), like);
});

Deno.test("targets: setTarget says which stage fails", () => {
  const cls: VirtualTargetClass = {
    metadata: { name: "c", namespace: "lab" },
    spec: { provisioner: PROVISIONER, credentialsSecretRef: { name: "key" }, parameters: { host: { name: "h" } } },
  };
  const set: ExporterSet = { metadata: { name: "s", namespace: "lab" }, spec: { virtualTargetClassName: "c" } };
  const none = (_: string): Secret | undefined => undefined;
  const noCred = setTarget(cls, set, none);
  assert.ok(!noCred.ok && noCred.stage === "credentials" && noCred.problem.reason === "CredentialsNotFound");
  const bad = setTarget({ ...cls, spec: { ...cls.spec, parameters: { host: { name: "-bad-" } } } }, set, none);
  assert.ok(!bad.ok && bad.stage === "parameters");
});

Deno.test("targets: with no class left, the Secret an Exporter recorded reaches its host, strictly", async () => {
  const key = await ed25519Key("test");
  const b64 = (s: string) => Buffer.from(s).toString("base64");
  const secrets = new Map<string, Secret>([
    ["key", { metadata: { name: "key", namespace: "lab" }, data: { "ssh-privatekey": b64(key) } }],
    [PINNED_HOST_KEYS_SECRET, {
      metadata: { name: PINNED_HOST_KEYS_SECRET, namespace: "lab" },
      data: { known_hosts: b64("a.example.com ssh-ed25519 AAAApinned") },
    }],
  ]);
  const caches = {
    classes: { list: () => [] as VirtualTargetClass[] },
    secrets: { get: (_ns: string | undefined, name: string) => secrets.get(name) },
  } as unknown as Parameters<typeof deployedTargets>[0];
  const exporter = (annotations: Record<string, string>) => ({ metadata: { namespace: "lab", annotations } });
  const [t, ...more] = deployedTargets(
    caches,
    PROVISIONER,
    exporter({ "qemu-ssh.jumpstarter.dev/ssh-target": "ops@a.example.com:2222", [CREDENTIALS_ANNOTATION]: "key" }),
  );
  assert.deepEqual(more, []);
  assert.deepEqual([t.user, t.host, t.port, t.privateKey, t.hostKeyPolicy], [
    "ops",
    "a.example.com",
    2222,
    key,
    "Strict",
  ]);
  assert.match(t.knownHosts, /AAAApinned/, "the namespace's pins: the host key it was deployed with");
  const gone = exporter({
    "qemu-ssh.jumpstarter.dev/ssh-target": "ops@a.example.com:2222",
    [CREDENTIALS_ANNOTATION]: "x",
  });
  assert.deepEqual(deployedTargets(caches, PROVISIONER, gone), [], "the Secret went too: nothing to try");
});
