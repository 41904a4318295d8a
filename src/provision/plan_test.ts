import assert from "node:assert/strict";
import { desiredCount, type ExporterView, parseDuration, plan, type PlanInput, selectorMatches } from "./plan.ts";

const now = new Date("2026-11-30T12:00:00Z");
const ex = (name: string, over: Partial<ExporterView> = {}): ExporterView => ({
  name,
  enabled: true,
  leased: false,
  deleting: false,
  leaseEnded: false,
  createdAt: `2026-11-30T10:00:0${name.slice(-1)}Z`,
  ...over,
});
const input = (over: Partial<PlanInput>): PlanInput => ({
  spec: { virtualTargetClassName: "c", minReplicas: 0, maxReplicas: 4, minAvailableReplicas: 1 },
  exporters: [],
  pendingDemand: 0,
  waitForFirstConsumer: false,
  now,
  ...over,
});

Deno.test("desired: min, warm buffer over leased, demand, capped by max (0 = unbounded)", () => {
  const spec = { virtualTargetClassName: "c", minReplicas: 1, maxReplicas: 4, minAvailableReplicas: 1 };
  assert.deepEqual(desiredCount(spec, 0, 0), { desired: 1, wanted: 1 });
  assert.deepEqual(desiredCount(spec, 2, 0), { desired: 3, wanted: 3 });
  assert.deepEqual(desiredCount(spec, 3, 2), { desired: 4, wanted: 6 });
  assert.deepEqual(desiredCount({ ...spec, maxReplicas: 0 }, 3, 2), { desired: 6, wanted: 6 });
  assert.deepEqual(desiredCount({ virtualTargetClassName: "c" }, 0, 0), { desired: 0, wanted: 0 });
});

Deno.test("plan: the seed's set scales from zero to one warm exporter", () => {
  const p = plan(input({}));
  assert.equal(p.create, 1);
  assert.deepEqual(p.drain, []);
});

Deno.test("plan: a lease on the warm exporter asks for another", () => {
  const p = plan(input({ exporters: [ex("a1", { leased: true })] }));
  assert.equal(p.desired, 2);
  assert.equal(p.create, 1);
});

Deno.test("plan: demand counts only for WaitForFirstConsumer", () => {
  assert.equal(plan(input({ pendingDemand: 2 })).create, 1);
  assert.equal(plan(input({ pendingDemand: 2, waitForFirstConsumer: true })).create, 3);
});

Deno.test("plan: surplus waits for the cooldown, then drains the newest idle, never a leased one", () => {
  const exporters = [ex("a1", { leased: true }), ex("a2"), ex("a3"), ex("a4")];
  const first = plan(input({ exporters }));
  assert.equal(first.desired, 2);
  assert.deepEqual(first.drain, []);
  assert.equal(first.surplusSince, now.toISOString());
  assert.equal(first.requeueAfterMs, 5 * 60_000);

  const early = plan(input({ exporters, surplusSince: new Date(now.getTime() - 60_000).toISOString() }));
  assert.deepEqual(early.drain, []);
  assert.equal(early.requeueAfterMs, 4 * 60_000);

  const due = plan(input({ exporters, surplusSince: new Date(now.getTime() - 5 * 60_000).toISOString() }));
  assert.deepEqual(due.drain, ["a4", "a3"]);
  assert.equal(due.surplusSince, undefined);
});

Deno.test("plan: drained and unleased exporters are deleted; drained but leased ones wait", () => {
  const p = plan(input({
    exporters: [ex("a1"), ex("a2", { enabled: false }), ex("a3", { enabled: false, leased: true })],
    spec: { virtualTargetClassName: "c", minReplicas: 1, maxReplicas: 4 },
  }));
  assert.deepEqual(p.delete, ["a2"]);
  assert.equal(p.create, 0);
});

Deno.test("plan: a drained exporter is re-enabled when demand returns, before creating new ones", () => {
  const p = plan(input({ exporters: [ex("a1", { leased: true }), ex("a2", { enabled: false })] }));
  assert.deepEqual(p.enable, ["a2"]);
  assert.equal(p.create, 0);
});

Deno.test("plan: ExitAndReplace replaces an exporter whose lease ended; InPlaceReuse keeps it", () => {
  const exporters = [ex("a1", { leaseEnded: true })];
  const replace = plan(input({ exporters }));
  assert.deepEqual([replace.recycle, replace.delete], [["a1"], []]);
  assert.equal(replace.create, 1);
  const reuse = plan(input({
    exporters,
    spec: { virtualTargetClassName: "c", minAvailableReplicas: 1, recycleStrategy: "InPlaceReuse" },
  }));
  assert.deepEqual([reuse.recycle, reuse.delete], [[], []]);
  assert.equal(reuse.create, 0);
});

Deno.test("plan: exporters being deleted do not count", () => {
  const p = plan(input({ exporters: [ex("a1", { deleting: true })] }));
  assert.equal(p.create, 1);
});

Deno.test("durations parse like Go's", () => {
  assert.equal(parseDuration("5m"), 300_000);
  assert.equal(parseDuration("1h30m"), 5_400_000);
  assert.equal(parseDuration("1.5s"), 1500);
  assert.throws(() => parseDuration("5 minutes"), /invalid duration/);
  assert.throws(() => parseDuration(""), /invalid duration/);
});

Deno.test("selectors: matchLabels and expressions", () => {
  const labels = { board: "aarch64-qemu", virtual: "true", arch: "aarch64" };
  assert.ok(selectorMatches({ matchLabels: { board: "aarch64-qemu", virtual: "true" } }, labels));
  assert.ok(!selectorMatches({ matchLabels: { board: "x86" } }, labels));
  assert.ok(selectorMatches({ matchExpressions: [{ key: "arch", operator: "In", values: ["aarch64"] }] }, labels));
  assert.ok(!selectorMatches({ matchExpressions: [{ key: "gpu", operator: "Exists" }] }, labels));
  assert.ok(!selectorMatches(undefined, labels));
});
