/**
 * Credential faults: the exporter token rotated by Jumpstarter (the config on the host follows, the exporter is
 * SIGHUP'd, QEMU's runtime keeps running), and the SSH credentials Secret replaced with a wrong key (another
 * ed25519 key the host does not know): the set goes Degraded, nothing else is touched on the host, a teardown asked
 * for meanwhile goes through with the key the host took before, and once the key is fixed everything is healthy again.
 */
import { Buffer } from "node:buffer";
import { waitFor } from "../env.ts";
import type { LabHost } from "../labhost/labhost.ts";
import { SECRETS } from "../../src/kube/resources.ts";
import type { Secret } from "../../src/api/types.ts";
import { checkInvariants, trial } from "./invariants.ts";
import { b64, FaultWorld, KEY_SECRET, type Outcome, outer, SEED_HOST, sh } from "./world.ts";

const TWO = { ...FaultWorld.LOW, minAvailableReplicas: 2 };

export async function credentialScenario(reps: number): Promise<Outcome[]> {
  const w = await FaultWorld.create({ prefix: "cred" });
  const host = w.hostNamed(SEED_HOST)!;
  const results: Outcome[] = [];
  const keyDir = await Deno.makeTempDir({ prefix: "qsp-faults-key-" });
  try {
    await w.seed((s) => Object.assign(s.spec, TWO));
    await w.controller.start();
    const base = await checkInvariants(w);
    if (!base.ok) throw new Error(`baseline did not hold: ${base.violations.join("; ")}`);

    for (let rep = 1; rep <= reps; rep++) {
      results.push(
        await trial(w, "credentials", `token rotated #${rep}`, async (checks) => {
          const live = (await w.exporters()).filter((e) => !e.metadata.deletionTimestamp);
          const name = live[rep % live.length].metadata.name!;
          const others = live.map((e) => e.metadata.name!).filter((n) => n !== name);
          const before = await identities(host, [name, ...others]);
          const hups = count(await journal(host, name), "SIGHUP, reloaded");
          const t0 = performance.now();
          const token = await w.fake.rotate(w.ns, name);
          await waitFor(async () => (await configOf(host, name)).includes(`\ntoken: ${token}\n`), {
            what: `the new token in ${name}'s config on ${host.name}`,
            timeoutMs: 60_000,
            intervalMs: 500,
          });
          const landed = secs(t0);
          await waitFor(async () => count(await journal(host, name), "SIGHUP, reloaded") > hups, {
            what: `${name}'s exporter to log its SIGHUP reload`,
            timeoutMs: 30_000,
            intervalMs: 500,
          });
          const after = await identities(host, [name, ...others]);
          checks.expect(after.get(`${name}-runtime`) === before.get(`${name}-runtime`), "the runtime was restarted");
          checks.expect(after.get(`${name}-exporter`) === before.get(`${name}-exporter`), "the exporter was restarted");
          for (const o of others) {
            checks.expect(after.get(`${o}-runtime`) === before.get(`${o}-runtime`), `${o} was restarted`);
          }
          return { fault: `token of ${name} rotated`, note: `on the host after ${landed}s, HUP'd, nothing restarted` };
        }),
      );

      if (w.desired(await w.set()) < 2) {
        await w.patchSpec(TWO);
        await checkInvariants(w);
      }
      results.push(
        await trial(w, "credentials", `wrong SSH key, then fixed #${rep}`, async (checks) => {
          const secret = await w.client.get<Secret>(SECRETS, w.ns, KEY_SECRET);
          const good = secret.data!["ssh-privatekey"];
          const wrong = await newKey(keyDir, `stranger-${rep}`);
          const names = (await w.exporters()).filter((e) => !e.metadata.deletionTimestamp).map((e) => e.metadata.name!);
          const before = await identities(host, names);
          const t0 = performance.now();
          await w.client.mergePatch(SECRETS, w.ns, KEY_SECRET, { data: { "ssh-privatekey": b64(wrong) } });
          let degraded = "";
          try {
            const c = await w.waitCondition(
              "Degraded",
              (c) => c.status === "True" && c.reason === "AuthenticationFailed",
              60_000,
            );
            const st = (await w.set())?.status;
            degraded = `Degraded/${c.reason} after ${secs(t0)}s (readyReplicas ${st?.readyReplicas} of ` +
              `${st?.replicas} meanwhile)`;
            // A scale-down meanwhile: the surplus Exporter is deleted, and its teardown is not stuck behind the wrong
            // key: the controller remembers the key this host took before (issue 18 B, the key rotated).
            await w.patchSpec(FaultWorld.LOW);
            const gone = await waitFor(async () => {
              const left = new Set((await w.exporters()).map((e) => e.metadata.name!));
              return names.find((n) => !left.has(n));
            }, {
              what: "the surplus Exporter torn down with the key the host took before",
              timeoutMs: 60_000,
              intervalMs: 500,
            });
            await waitFor(async () => {
              const evs = await w.events();
              return evs.some((e) => e.reason === "TornDown" && e.message.includes(gone));
            }, { what: `a TornDown event for ${gone}`, timeoutMs: 30_000, intervalMs: 500 });
            const kept = names.filter((n) => n !== gone);
            const now = await identities(host, kept);
            for (const n of kept) {
              checks.expect(now.get(`${n}-runtime`) === before.get(`${n}-runtime`), `${n}'s runtime changed`);
              checks.expect(now.get(`${n}-exporter`) === before.get(`${n}-exporter`), `${n}'s exporter changed`);
            }
            degraded += `, ${gone} torn down with the remembered key`;
          } finally {
            await w.client.mergePatch(SECRETS, w.ns, KEY_SECRET, { data: { "ssh-privatekey": good } });
          }
          return {
            fault: "ssh-privatekey replaced by another ed25519 key, scale 2->1, key fixed",
            note: `${degraded}; the other instances kept running untouched`,
          };
        }),
      );
    }
  } finally {
    await w.stop({ keepLogs: results.some((r) => !r.ok) });
    await Deno.remove(keyDir, { recursive: true }).catch(() => {});
  }
  return results;
}

const secs = (t0: number) => ((performance.now() - t0) / 1000).toFixed(1);
const count = (text: string, what: string) => text.split(what).length - 1;

const journal = (host: LabHost, name: string) =>
  sh(host, `journalctl -o cat --no-pager -u ${name}-exporter.service || true`);

const configOf = (host: LabHost, name: string) => sh(host, `cat /etc/jumpstarter/exporters/${name}.yaml`);

/** Container name -> "StartedAt Pid": equal values mean it was not restarted. */
async function identities(host: LabHost, names: string[]): Promise<Map<string, string>> {
  const containers = names.flatMap((n) => [`${n}-runtime`, `${n}-exporter`]);
  const out = await sh(
    host,
    `podman inspect --format '{{.Name}} {{.State.StartedAt}} {{.State.Pid}}' ${containers.join(" ")}`,
  );
  return new Map(
    out.trim().split("\n").map((l) => {
      const [name, ...rest] = l.split(" ");
      return [name, rest.join(" ")];
    }),
  );
}

/** A fresh unencrypted ed25519 private key that no lab host knows. */
async function newKey(dir: string, name: string): Promise<string> {
  await outer("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", `${dir}/${name}`);
  return Buffer.from(await Deno.readFile(`${dir}/${name}`)).toString("utf8");
}
