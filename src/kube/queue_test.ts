import assert from "node:assert/strict";
import { WorkQueue } from "./queue.ts";
import { backoffDelay } from "./backoff.ts";

const tick = (ms = 0) => new Promise((r) => setTimeout(r, ms));

Deno.test("queue: a key added many times is processed once per round, never concurrently", async () => {
  let running = 0;
  let maxRunning = 0;
  const seen: string[] = [];
  const q = new WorkQueue({
    concurrency: 4,
    process: async (key) => {
      running++;
      maxRunning = Math.max(maxRunning, running);
      seen.push(key);
      await tick(20);
      running--;
    },
  });
  q.start();
  for (let i = 0; i < 10; i++) q.add("a");
  await tick(5);
  q.add("a"); // arrives while "a" is processing: runs once more afterwards
  q.add("b");
  await tick(80);
  await q.shutdown();
  assert.deepEqual(seen.filter((k) => k === "a").length, 2);
  assert.deepEqual(seen.filter((k) => k === "b").length, 1);
  assert.equal(maxRunning, 2, "a and b in parallel, never two a's");
});

Deno.test("queue: failures retry with growing backoff, success forgets them", async () => {
  const times: number[] = [];
  const q = new WorkQueue({
    concurrency: 1,
    baseDelayMs: 10,
    process: (key) => {
      times.push(Date.now());
      if (times.length < 4) return Promise.reject(new Error(`fail ${key}`));
      return Promise.resolve();
    },
  });
  q.start();
  q.add("k");
  while (times.length < 4) await tick(5);
  await q.shutdown();
  const gaps = times.slice(1).map((t, i) => t - times[i]);
  assert.ok(gaps[0] >= 4 && gaps[2] >= 19, `gaps grow: ${gaps}`);
});

Deno.test("queue: the first retry is not immediate, and many failing keys share an overall retry bucket", async () => {
  const retries = new Map<string, number>();
  const q = new WorkQueue({
    concurrency: 4,
    retryQps: 1,
    retryBurst: 2,
    process: (key) => Promise.reject(new Error(`fail ${key}`)),
    onError: (key, _e, retryIn) => retries.set(key, retryIn),
  });
  q.start();
  for (const k of ["a", "b", "c"]) q.add(k);
  while (retries.size < 3) await tick(1);
  await q.shutdown();
  const waits = [...retries.values()].sort((x, y) => x - y);
  assert.ok(waits[0] >= 125, `first retry after half the 250 ms base at least: ${waits}`);
  assert.ok(waits[2] > 500, `the third key waits for the bucket's token (1 qps): ${waits}`);
});

Deno.test("queue: requeueAfter and addAfter keep the earliest deadline; shutdown drains in-flight work", async () => {
  const seen: number[] = [];
  let finished = false;
  const q = new WorkQueue({
    concurrency: 1,
    process: async () => {
      seen.push(Date.now());
      if (seen.length === 2) {
        await tick(30);
        finished = true;
      }
      return { requeueAfterMs: 10 };
    },
  });
  q.start();
  q.addAfter("x", 10_000);
  q.addAfter("x", 5); // earlier wins
  while (seen.length < 2) await tick(2);
  await q.shutdown();
  assert.ok(finished, "shutdown waited for the in-flight reconcile");
  assert.equal(q.depth(), 0);
});

Deno.test("backoff: bounded, jittered, capped", () => {
  const b = { initialMs: 5, maxMs: 1_000_000 };
  assert.equal(backoffDelay(1, b, () => 1), 5);
  assert.equal(backoffDelay(1, b, () => 0), 2.5);
  assert.equal(backoffDelay(100, b, () => 1), 1_000_000);
});
