import assert from "node:assert/strict";
import { drift, starting } from "./drift.ts";
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

Deno.test("drift: units on their way up are starting, not drift; down ones are drift, not starting", () => {
  const found = inSync();
  found.runtime = { load: "loaded", active: "activating", sub: "start-pre" };
  found.exporter = { load: "loaded", active: "inactive", sub: "dead", job: "start" };
  assert.deepEqual(drift(rendered, found), []);
  assert.deepEqual(starting(rendered, found), [
    "a-runtime.service is activating (start-pre)",
    "a-exporter.service is inactive with a start job queued",
  ]);
  // systemd's wait before restarting a unit that exited is still on the way up; a restart queued on a running one too
  found.runtime = { load: "loaded", active: "activating", sub: "auto-restart" };
  found.exporter = { load: "loaded", active: "active", sub: "running", job: "restart" };
  assert.deepEqual(drift(rendered, found), []);
  assert.deepEqual(starting(rendered, found), [
    "a-runtime.service is activating (auto-restart)",
    "a-exporter.service is active with a restart job queued",
  ]);
  found.runtime = active;
  found.exporter = { load: "loaded", active: "failed", sub: "failed" };
  assert.deepEqual(drift(rendered, found), ["a-exporter.service is failed"]);
  assert.deepEqual(starting(rendered, found), []);
  found.exporter = { load: "loaded", active: "inactive", sub: "dead", job: "stop" };
  assert.deepEqual(drift(rendered, found), ["a-exporter.service is inactive"]);
  assert.deepEqual(starting(rendered, inSync()), []);
  assert.deepEqual(starting(rendered, undefined), []);
});
