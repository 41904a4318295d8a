import assert from "node:assert/strict";
import { mapAtMost } from "./at_most.ts";

const tick = () => new Promise((r) => setTimeout(r, 0));

Deno.test("mapAtMost: never more than n at once, every item once, results in order", async () => {
  let running = 0, most = 0;
  const out = await mapAtMost([...Array(25).keys()], 4, async (i) => {
    most = Math.max(most, ++running);
    for (let k = 0; k < i % 3 + 1; k++) await tick();
    running--;
    return i * 2;
  });
  assert.equal(most, 4);
  assert.deepEqual(out, [...Array(25).keys()].map((i) => i * 2));
  assert.deepEqual(await mapAtMost([], 4, () => Promise.resolve(1)), []);
});

Deno.test("mapAtMost: after a failure no new call starts, and the first failure is the result", async () => {
  const started: number[] = [];
  await assert.rejects(
    mapAtMost([0, 1, 2, 3, 4, 5], 2, async (i) => {
      started.push(i);
      await tick();
      if (i === 1) throw new Error("one");
    }),
    /one/,
  );
  await tick();
  assert.deepEqual(started, [0, 1, 2], "the call that was free when 1 failed took 2; nothing after");
  await assert.rejects(mapAtMost([1], 0, () => Promise.resolve(1)), RangeError);
});
