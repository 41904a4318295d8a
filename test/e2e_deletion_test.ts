/**
 * Deletion in any order (issue 18, Why 2), with the real garbage collector and namespace controller: whatever goes
 * first, every case ends with no Exporter left, no finalizer held past --teardown-grace, and the lab host clean.
 * Each prints its time to full cleanup (Exporters gone and host clean, from the first delete).
 */
import assert from "node:assert/strict";
import { waitFor } from "./env.ts";
import { applySeed, exporters, hostHas, plugIn, unplug, waitReady, type World, world } from "./e2e_world.ts";
import { NAMESPACES } from "../src/kube/resources.ts";
import { deleteSeeded, DELETION_ORDERS, type DeletionOrder } from "./deletion_orders.ts";

const opts = { sanitizeOps: false, sanitizeResources: false };
/** The bound under test: short, so the unreachable case ends soon; teardowns that can succeed do so well within. */
const GRACE_MS = 20_000;

interface Case extends DeletionOrder<World> {
  /** Whether the teardown may be given up (nothing can reach the host). */
  abandons?: boolean;
}

const CASES: Case[] = [
  ...DELETION_ORDERS,
  {
    name: "the host unreachable: the finalizer goes after the grace, the sweep cleans the host once it is back",
    abandons: true,
    async run(w) {
      await unplug(w.host);
      try {
        await deleteSeeded(w, "set");
        await waitFor(async () => (await exporters(w)).length === 0, {
          what: "the Exporters let go after the grace",
          timeoutMs: GRACE_MS + 60_000,
        });
      } finally {
        await plugIn(w.host);
      }
    },
  },
];

Deno.test({
  name: "e2e deletion: every order ends with no Exporter, no finalizer past the grace, and the host clean",
  ...opts,
  async fn(t) {
    const figures: string[] = [];
    for (const c of CASES) {
      await t.step(c.name, async () => {
        const w = await world({ teardownGraceMs: GRACE_MS, sweepMs: 2_000 });
        try {
          await applySeed(w, (s) => Object.assign(s.spec, { minAvailableReplicas: 2 }));
          const names = (await waitReady(w, 2)).map((e) => e.metadata.name!);
          // what the controller says, also where a terminating namespace takes no Event
          const said: { reason: string; message: string }[] = [];
          const recorder = w.controller.recorder;
          const event = recorder.event.bind(recorder);
          recorder.event = (o, type, reason, message) => {
            said.push({ reason, message });
            event(o, type, reason, message);
          };
          const started = performance.now();
          await c.run(w);
          await waitFor(async () => {
            const left = c.namespaceGone
              ? !!(await w.client.find(NAMESPACES, undefined, w.ns))
              : (await exporters(w)).length > 0;
            if (left) return false;
            for (const n of names) if (await hostHas(w.host, n)) return false;
            return true;
          }, { what: `${c.name}: all gone`, timeoutMs: GRACE_MS + 90_000 });
          const ms = performance.now() - started;
          figures.push(`${(ms / 1000).toFixed(1)} s  ${c.name}`);
          const abandoned = said.filter((e) => e.reason === "TeardownAbandoned");
          assert.equal(abandoned.length > 0, !!c.abandons, abandoned.map((e) => e.message).join("; "));
          for (const e of abandoned) assert.match(e.message, new RegExp(`on \\S+@${SEED_HOST_RE}:22`));
          if (c.abandons) {
            assert.ok(names.every((n) => abandoned.some((e) => e.message.includes(n))), "each instance named");
          }
        } finally {
          await w.stop();
        }
      });
    }
    console.log(`time to full cleanup (grace ${GRACE_MS / 1000} s):\n  ${figures.join("\n  ")}`);
  },
});

const SEED_HOST_RE = "lab-host-01\\.example\\.com";
