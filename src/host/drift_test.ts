import assert from "node:assert/strict";
import { drift } from "./drift.ts";
import { type InspectedInstance, sha256 } from "./remote.ts";
import type { RenderedInstance } from "./render.ts";

const rendered: RenderedInstance = {
  name: "a",
  namespace: "lab",
  uid: "u-a",
  volume: "jumpstarter-a-shared",
  disk: { volume: "jumpstarter-a-disk", image: "/d/a.img", bytes: 2 ** 30 },
  files: [
    { path: "/c/a.d/a.yaml", content: "config", mode: 0o600, owner: 65532, secret: true, links: ["/c/a.yaml"] },
    { path: "/q/a-runtime.container", content: "runtime", mode: 0o644, owner: 0, secret: false, links: [] },
  ],
  units: { runtime: "a-runtime.service", exporter: "a-exporter.service" },
  devices: [],
};

const active = { load: "loaded", active: "active", sub: "running" };
const inSync = (): InspectedInstance => ({
  name: "a",
  uid: "u-a",
  files: [
    { kind: "config", path: "/c/a.d/a.yaml", mode: "600:65532:65532", sha256: sha256("config") },
    { kind: "config", path: "/c/a.yaml", mode: "600:65532:65532", sha256: sha256("config") },
    { kind: "runtime", path: "/q/a-runtime.container", mode: "644:0:0", sha256: sha256("runtime") },
  ],
  ownerMismatch: false,
  runtime: active,
  exporter: active,
  containers: [],
  volume: true,
  diskVolume: true,
});

Deno.test("drift: none when files, modes, units and volume are as rendered", () => {
  assert.deepEqual(drift(rendered, inSync()), []);
});

Deno.test("drift: names each file, mode, unit and volume that differs", () => {
  const found = inSync();
  found.files[0].sha256 = sha256("edited");
  found.files.splice(1, 1);
  found.files[1].mode = "666:0:0";
  found.exporter = { load: "loaded", active: "failed", sub: "failed" };
  found.runtime = undefined;
  found.volume = false;
  found.diskVolume = false;
  assert.deepEqual(drift(rendered, found), [
    "/c/a.d/a.yaml was changed",
    "/c/a.yaml is missing",
    "/q/a-runtime.container has mode and owner 666:0:0, not 644:0:0",
    "a-runtime.service is not loaded",
    "a-exporter.service is failed",
    "volume jumpstarter-a-shared is missing",
    "volume jumpstarter-a-disk is missing",
  ]);
  assert.deepEqual(drift(rendered, undefined), ["not on the host"]);
});
