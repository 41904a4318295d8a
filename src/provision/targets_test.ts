import assert from "node:assert/strict";
import type { ExporterSet, Secret, VirtualTargetClass } from "../api/types.ts";
import { PROVISIONER } from "../api/types.ts";
import type { LabTarget } from "./credentials.ts";
import { parseTarget, setTarget, targetString } from "./targets.ts";

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
