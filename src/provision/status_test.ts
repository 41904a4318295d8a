import assert from "node:assert/strict";
import { computeStatus, statusChanged, type StatusInput } from "./status.ts";

const t0 = new Date("2026-11-30T12:00:00Z");
const t1 = new Date("2026-11-30T12:05:00Z");
const base: StatusInput = {
  generation: 3,
  now: t0,
  selector: "board=aarch64-qemu,virtual=true",
  minReplicas: 0,
  minAvailableReplicas: 1,
  desired: 1,
  wanted: 1,
  maxReplicas: 4,
  exporters: [],
  waitingForCredentials: [],
  problems: [],
};
const cond = (s: ReturnType<typeof computeStatus>, type: string) => s.conditions!.find((c) => c.type === type)!;

Deno.test("status: one ready idle exporter makes the seed's set Available", () => {
  const s = computeStatus({ ...base, exporters: [{ name: "e1", enabled: true, leased: false, ready: true }] });
  assert.equal(s.replicas, 1);
  assert.equal(s.readyReplicas, 1);
  assert.equal(s.availableReplicas, 1);
  assert.equal(s.observedGeneration, 3);
  assert.equal(cond(s, "Available").reason, "MinimumReplicasAvailable");
  assert.equal(cond(s, "Progressing").reason, "AllReplicasReady");
  assert.equal(cond(s, "Degraded").status, "False");
  assert.equal(cond(s, "ScalingLimited").reason, "WithinLimits");
});

Deno.test("status: waiting for credentials is progress, not degradation", () => {
  const s = computeStatus({
    ...base,
    exporters: [{ name: "e1", enabled: true, leased: false, ready: false }],
    waitingForCredentials: ["e1"],
  });
  assert.equal(cond(s, "Progressing").reason, "WaitingForCredentials");
  assert.match(cond(s, "Progressing").message!, /e1/);
  assert.equal(cond(s, "Degraded").status, "False");
  assert.equal(cond(s, "Available").status, "False");
});

Deno.test("status: units on their way up are progress, not ready and not offline", () => {
  const s = computeStatus({
    ...base,
    exporters: [{ name: "e1", enabled: true, leased: false, ready: false, starting: true }],
  });
  assert.deepEqual([s.readyReplicas, s.availableReplicas, s.exportersOffline], [0, 0, 0]);
  assert.equal(cond(s, "Progressing").reason, "ReplicasNotReady");
  assert.equal(cond(s, "Degraded").status, "False");
  assert.equal(cond(s, "Available").status, "False");
  // Jumpstarter's word that it is offline still counts
  const reported = computeStatus({
    ...base,
    exporters: [{ name: "e1", enabled: true, leased: false, ready: false, starting: true, online: false }],
  });
  assert.equal(reported.exportersOffline, 1);
});

Deno.test("status: problems and the max cap are reported with actionable messages", () => {
  const s = computeStatus({
    ...base,
    wanted: 6,
    desired: 4,
    problems: [{ reason: "HostUnreachable", message: "root@lab-host-01:22: connection refused" }],
  });
  assert.equal(cond(s, "Degraded").reason, "HostUnreachable");
  assert.equal(cond(s, "ScalingLimited").reason, "AtMaxReplicas");
  assert.match(cond(s, "ScalingLimited").message!, /raise maxReplicas/);
});

Deno.test("status: a missing class is named", () => {
  const s = computeStatus({ ...base, classMissing: "qemu-ssh-aarch64", desired: undefined });
  assert.equal(cond(s, "Available").reason, "VirtualTargetClassNotFound");
  assert.match(cond(s, "Available").message!, /qemu-ssh-aarch64/);
});

Deno.test("status: lastTransitionTime moves only when the status flips", () => {
  const first = computeStatus(base);
  const same = computeStatus({ ...base, old: first, now: t1 });
  assert.equal(cond(same, "Available").lastTransitionTime, t0.toISOString());
  assert.ok(!statusChanged(first, same));
  const flipped = computeStatus({
    ...base,
    old: first,
    now: t1,
    exporters: [{ name: "e1", enabled: true, leased: false, ready: true }],
  });
  assert.equal(cond(flipped, "Available").lastTransitionTime, t1.toISOString());
  assert.ok(statusChanged(first, flipped));
});

Deno.test("status: an exporter Jumpstarter reports offline is not ready, whatever its units say", () => {
  // Why 6 of issue 18: the units were up, the exporter had given up, and the set said READY 1 and Available=True
  const s = computeStatus({
    ...base,
    exporters: [{ name: "e1", enabled: true, leased: false, ready: true, online: false }],
  });
  assert.deepEqual([s.readyReplicas, s.availableReplicas, s.unavailableReplicas], [0, 0, 1]);
  assert.equal(cond(s, "Available").status, "False");
  assert.equal(cond(s, "Degraded").reason, "ExportersOffline");
  assert.equal(cond(s, "Progressing").reason, "ReplicasNotReady");
  // where Jumpstarter reports it online, or does not report yet, the units decide
  const online = computeStatus({
    ...base,
    exporters: [{ name: "e1", enabled: true, leased: false, ready: true, online: true }],
  });
  assert.equal(online.readyReplicas, 1);
  const unreported = computeStatus({ ...base, exporters: [{ name: "e1", enabled: true, leased: false, ready: true }] });
  assert.equal(unreported.readyReplicas, 1);
});

Deno.test("status: with minimums of 0, a set whose exporters all are offline is not Available", () => {
  const s = computeStatus({
    ...base,
    minAvailableReplicas: 0,
    exporters: [{ name: "e1", enabled: true, leased: false, ready: true, online: false }],
  });
  assert.equal(cond(s, "Available").status, "False");
  assert.match(cond(s, "Available").message!, /none of 1 exporters can take a lease \(offline: e1\)/);
  assert.equal(cond(s, "Degraded").reason, "ExportersOffline");
});
