import assert from "node:assert/strict";
import { applyFailureReason, applyFailureText, retryAfterMs } from "./problems.ts";

Deno.test("applyFailureReason: refusals a person fixes on the host have their own reason, the rest DeployFailed", () => {
  assert.equal(applyFailureReason("podman-too-old"), "PodmanTooOld");
  assert.equal(applyFailureReason("kvm-missing"), "KvmMissing");
  assert.equal(applyFailureReason("kvm-denied"), "KvmDenied");
  assert.equal(applyFailureReason("host-busy"), "HostBusy");
  for (const code of ["missing-tool", "not-owned", "unit-missing", "step-failed", "incomplete", "exit", undefined]) {
    assert.equal(applyFailureReason(code), "DeployFailed", String(code));
  }
  // not an Object.prototype key by accident
  assert.equal(applyFailureReason("constructor"), "DeployFailed");
});

Deno.test("applyFailureText: names the host, then every error", () => {
  const text = applyFailureText("lab-host-01.example.com", [
    "podman-too-old: podman 4.3.1 is older than 4.4 and has no quadlet ...; upgrade podman to 4.4 or later",
  ]);
  assert.equal(
    text,
    "on lab-host-01.example.com: podman-too-old: podman 4.3.1 is older than 4.4 and has no quadlet ...; upgrade podman to 4.4 or later",
  );
});

Deno.test("retryAfterMs: PodmanTooOld waits for a person, like other refusals", () => {
  assert.equal(retryAfterMs(300_000, [{ reason: "PodmanTooOld", message: "" }]), 30_000);
  assert.equal(retryAfterMs(300_000, [{ reason: "HostUnreachable", message: "" }]), 10_000);
  assert.equal(retryAfterMs(300_000, [{ reason: "HostBusy", message: "" }]), 10_000, "a lock held too long: soon");
  assert.equal(retryAfterMs(300_000, []), 300_000);
});
