import assert from "node:assert/strict";
import { MAX_RETRIES, MAX_RETRY_AFTER_MS, retryAfterMs, retryDelay, TokenBucket } from "./flowcontrol.ts";

Deno.test("flowcontrol: the token bucket lets a burst through, then paces at qps, and refills while idle", () => {
  let now = 0;
  const b = new TokenBucket(10, 3, () => now);
  assert.deepEqual([b.reserve(), b.reserve(), b.reserve()], [0, 0, 0]);
  // 10 qps: the 4th waits 100 ms, the 5th 200 ms (reservations queue up in arrival order)
  assert.ok(Math.abs(b.reserve() - 100) < 1e-6);
  assert.ok(Math.abs(b.reserve() - 200) < 1e-6);
  now = 10_000; // idle long enough: refilled to the burst, never above it
  assert.deepEqual([b.reserve(), b.reserve(), b.reserve()], [0, 0, 0]);
  assert.ok(b.reserve() > 0);
  assert.equal(new TokenBucket(0, 0).reserve(), 0, "qps 0: no limit");
  assert.throws(() => new TokenBucket(5, 0), /burst must be >= 1/);
});

Deno.test("flowcontrol: a wait that is aborted gives its token back", async () => {
  const now = 0;
  const b = new TokenBucket(10, 1, () => now);
  assert.equal(b.reserve(), 0);
  const abort = new AbortController();
  const waiting = b.take(abort.signal);
  abort.abort();
  await waiting;
  // without the aborted one, the next caller waits 100 ms (one token at 10 qps), not 200
  assert.ok(Math.abs(b.reserve() - 100) < 1e-6);
});

Deno.test("flowcontrol: 429 is retried for every method, 5xx and lost connections only where it is safe", () => {
  const r = () => 1; // the top of the jitter range
  const s = (status: number, retryAfter?: string) => ({ status, retryAfter });
  for (const m of ["GET", "PUT", "PATCH", "DELETE", "POST"]) assert.notEqual(retryDelay(m, 0, s(429), r), undefined);
  for (const code of [500, 502, 503, 504]) {
    assert.notEqual(retryDelay("PATCH", 0, s(code), r), undefined);
    assert.equal(retryDelay("POST", 0, s(code), r), undefined, `a POST answered ${code} may have been created`);
  }
  for (const code of [400, 401, 403, 404, 409, 410, 422]) assert.equal(retryDelay("GET", 0, s(code), r), undefined);
  assert.notEqual(retryDelay("POST", 0, { connectError: "ECONNREFUSED" }, r), undefined, "never sent: safe");
  assert.equal(retryDelay("POST", 0, { connectError: "ECONNRESET" }, r), undefined, "maybe sent: not for a POST");
  assert.notEqual(retryDelay("GET", 0, { connectError: "ECONNRESET" }, r), undefined);
  assert.equal(retryDelay("GET", MAX_RETRIES, s(429), r), undefined, "retries are bounded");
});

Deno.test("flowcontrol: Retry-After is honoured (seconds or a date) up to its bound; else the back-off grows", () => {
  const r = () => 1;
  assert.equal(retryDelay("GET", 0, { status: 429, retryAfter: "3" }, r), 3_000);
  assert.equal(retryDelay("GET", 0, { status: 503, retryAfter: "0" }, r), 0);
  assert.equal(retryDelay("GET", 0, { status: 429, retryAfter: "86400" }, r), MAX_RETRY_AFTER_MS);
  const now = Date.parse("2026-12-01T12:00:00Z");
  assert.equal(retryAfterMs("Tue, 01 Dec 2026 12:00:05 GMT", now), 5_000);
  assert.equal(retryAfterMs("Tue, 01 Dec 2026 11:00:00 GMT", now), 0, "a date in the past: now");
  assert.equal(retryAfterMs("soon", now), undefined);
  const waits = [0, 1, 2, 3].map((n) => retryDelay("GET", n, { status: 429, retryAfter: "soon" }, r)!);
  assert.deepEqual(waits, [250, 500, 1_000, 2_000]);
});
