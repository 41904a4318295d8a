import assert from "node:assert/strict";
import fc from "fast-check";
import { failover, hostKey, hostRows, hostSummary, placeNew, type Reach, type SlotHost } from "./placement.ts";

const pool: SlotHost[] = [
  { key: "a:22", name: "a", slots: 2 },
  { key: "b:22", name: "b", slots: 2 },
  { key: "c:22", name: "c", slots: 4 },
];
const none = new Map<string, number>();

Deno.test("placeNew: most free slots first, ties by name, never above slots", () => {
  // free 2,2,4: c twice; then all tie at 2 and a (fewest on it) goes first, then b (2 free beside c's 2)...
  const six = placeNew(pool, none, new Set(), 6);
  assert.deepEqual(six, ["c:22", "c:22", "a:22", "b:22", "c:22", "a:22"]);
  const nine = placeNew(pool, none, new Set(), 9);
  assert.equal(nine.length, 8, "the pool holds 8");
  assert.equal(nine.filter((k) => k === "c:22").length, 4);
});

Deno.test("placeNew: hosts without slots spread by count; avoided hosts take nothing", () => {
  const open = [{ key: "x:22", name: "x" }, { key: "y:22", name: "y" }];
  assert.deepEqual(placeNew(open, none, new Set(), 3), ["x:22", "y:22", "x:22"]);
  assert.deepEqual(placeNew(open, none, new Set(["x:22"]), 2), ["y:22", "y:22"]);
});

Deno.test("failover: idle instances of a host silent past the timeout leave it; leased ones stay", () => {
  const reach = new Map<string, Reach>([["a:22", { failingSince: 0, lastError: "connect EHOSTUNREACH" }]]);
  const instances = [
    { name: "a1", host: "a:22", leased: false },
    { name: "a2", host: "a:22", leased: true },
    { name: "b1", host: "b:22", leased: false },
  ];
  const early = failover({ hosts: pool, instances, reach, now: 10_000, failoverMs: 20_000 });
  assert.deepEqual(early.evict, []);
  assert.equal(early.nextInMs, 10_000);
  assert.ok(early.avoid.has("a:22"), "no new instance on a silent host");
  const late = failover({ hosts: pool, instances, reach, now: 20_000, failoverMs: 20_000 });
  assert.deepEqual(late.evict, ["a1"]);
  assert.deepEqual(late.held.map((h) => h.name), ["a2"]);
  assert.equal(late.counts.get("a:22"), 1, "the leased one still takes its slot");
});

Deno.test("failover: a host left the pool loses its idle instances; unplaced ones are assigned", () => {
  const fo = failover({
    hosts: pool.slice(1),
    instances: [{ name: "a1", host: "a:22", leased: false }, { name: "n", leased: false }],
    reach: new Map(),
    now: 0,
    failoverMs: 1,
  });
  assert.deepEqual(fo.evict, ["a1"]);
  assert.equal(fo.assign.get("n"), "c:22");
});

Deno.test("hostRows and hostSummary: pool hosts, then hosts left with instances", () => {
  const rows = hostRows(
    pool,
    new Map([["a:22", 1], ["old:22", 1]]),
    new Map([["b:22", { failingSince: 5, lastError: "timeout" }]]),
    new Map([["old:22", "old"]]),
  );
  assert.deepEqual(rows[1], { name: "b", instances: 0, slots: 2, reachable: false, lastError: "timeout" });
  assert.equal(hostSummary(rows), "a 1/2, b 0/2 unreachable, c 0/4, old 1/0");
  assert.equal(hostKey("Lab-A", 22), "lab-a:22");
});

const arbPool = fc.uniqueArray(
  fc.record({ name: fc.constantFrom("a", "b", "c", "d", "e"), slots: fc.option(fc.integer({ min: 1, max: 5 })) }),
  { minLength: 1, maxLength: 5, selector: (h) => h.name },
).map((hs) => hs.map((h) => ({ key: `${h.name}:22`, name: h.name, ...h.slots === null ? {} : { slots: h.slots } })));

Deno.test("property: never above slots; spread within 1 when all reachable; leased never moved", () => {
  fc.assert(fc.property(
    arbPool,
    fc.array(fc.record({ host: fc.constantFrom("a", "b", "c", "d", "e", "gone"), leased: fc.boolean() })),
    fc.subarray(["a", "b", "c", "d", "e"]),
    fc.integer({ min: 0, max: 30 }),
    (hosts, existing, failed, n) => {
      const instances = existing.map((e, i) => ({ name: `e${i}`, host: `${e.host}:22`, leased: e.leased }));
      const reach = new Map(failed.map((f) => [`${f}:22`, { failingSince: 0 }]));
      const fo = failover({ hosts, instances, reach, now: 100, failoverMs: 50 });
      for (const e of instances) if (e.leased) assert.ok(!fo.evict.includes(e.name), "a leased one never moves");
      const placed = placeNew(hosts, fo.counts, fo.avoid, n);
      for (const k of placed) assert.ok(!fo.avoid.has(k), "nothing new on a failing host");
      // from an empty pool, all reachable: within slots, and spread evenly while room is left
      const fresh = placeNew(hosts, new Map(), new Set(), n);
      for (const h of hosts) {
        assert.ok(fresh.filter((k) => k === h.key).length <= (h.slots ?? Infinity), `${h.name} above its slots`);
      }
      const on = (h: SlotHost) => fresh.filter((k) => k === h.key).length;
      const freeOf = (h: SlotHost) => (h.slots ?? Infinity) - on(h);
      const open = hosts.filter((h) => freeOf(h) > 0);
      // spread: a host that took any has within 1 of the most free slots left anywhere
      for (const h of hosts.filter((h) => on(h) > 0)) {
        for (const g of hosts) assert.ok(freeOf(g) <= freeOf(h) + 1, `${g.name} has more room than ${h.name}`);
      }
      const unbounded = hosts.filter((h) => h.slots === undefined).map(on);
      if (unbounded.length) assert.ok(Math.max(...unbounded) - Math.min(...unbounded) <= 1, "spread within 1");
      if (fresh.length < n) assert.equal(open.length, 0, "fewer than asked only when the pool is full");
    },
  ));
});

Deno.test("property: placed over equal slots, counts differ by at most 1", () => {
  fc.assert(fc.property(fc.integer({ min: 1, max: 5 }), fc.integer({ min: 1, max: 6 }), fc.nat(40), (k, s, n) => {
    const hosts = Array.from({ length: k }, (_, i) => ({ key: `h${i}:22`, name: `h${i}`, slots: s }));
    const placed = placeNew(hosts, new Map(), new Set(), n);
    const per = hosts.map((h) => placed.filter((x) => x === h.key).length);
    assert.ok(Math.max(...per) - Math.min(...per) <= 1);
    assert.equal(placed.length, Math.min(n, k * s));
  }));
});
