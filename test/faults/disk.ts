/**
 * A lab host's disk full where the configs live: a small tmpfs over /etc/jumpstarter/exporters (holding a copy of
 * what was there, then filled up). A token rotation and a scale-up must then fail with a clear error in the set's
 * status and in events, the running instance's good config must stay as it was (no half-written file in its place,
 * no temp file left), and once the tmpfs is gone the controller catches up on its own.
 */
import { waitFor } from "../env.ts";
import type { LabHost } from "../labhost/labhost.ts";
import { CONFIG_DIR } from "../../src/host/render.ts";
import { checkInvariants, trial } from "./invariants.ts";
import { FaultWorld, type Outcome, SEED_HOST, sh } from "./world.ts";

const FILL = `
set -e
d=${CONFIG_DIR}
mountpoint -q "$d" && exit 3
keep=$(mktemp -d /run/qsp-disk.XXXXXX)
cp -a "$d/." "$keep/"
used=$(du -sk "$keep" | cut -f1)
mount -t tmpfs -o size=$((used + 64))k,mode=0755 qsp-full "$d"
cp -a "$keep/." "$d/"
rm -rf "$keep"
dd if=/dev/zero of="$d/.qsp-fill" bs=1k 2>/dev/null || true
df -k "$d" | awk 'NR == 2 { print $4 }'
`;

export async function diskScenario(reps: number): Promise<Outcome[]> {
  const w = await FaultWorld.create({ prefix: "disk" });
  const host = w.hostNamed(SEED_HOST)!;
  const results: Outcome[] = [];
  try {
    await w.seed((s) => Object.assign(s.spec, FaultWorld.LOW));
    await w.controller.start();
    const base = await checkInvariants(w);
    if (!base.ok) throw new Error(`baseline did not hold: ${base.violations.join("; ")}`);

    for (let rep = 1; rep <= reps; rep++) {
      if (w.desired(await w.set()) !== 1) {
        await w.patchSpec(FaultWorld.LOW);
        await checkInvariants(w);
      }
      results.push(
        await trial(w, "disk", `config dir full #${rep}`, async (checks) => {
          const [x] = (await w.exporters()).filter((e) => !e.metadata.deletionTimestamp);
          const name = x.metadata.name!;
          const good = await sh(host, `sha256sum <${CONFIG_DIR}/${name}.d/${name}.yaml`);
          const identity = await sh(
            host,
            `podman inspect --format '{{.State.StartedAt}}' ${name}-runtime ${name}-exporter`,
          );
          const free = (await sh(host, FILL)).trim();
          let message = "";
          try {
            const token = await w.fake.rotate(w.ns, name);
            await w.patchSpec({ ...FaultWorld.LOW, minAvailableReplicas: 2 });
            const c = await w.waitCondition(
              "Degraded",
              (c) => c.status === "True" && /No space left on device/.test(c.message ?? ""),
              90_000,
            ).catch(async (e) => {
              const d = (await w.set())?.status?.conditions?.find((c) => c.type === "Degraded");
              checks.expect(false, `no clear disk-full error in status (Degraded: ${d?.reason}: ${d?.message})`);
              throw e;
            });
            message = `${c.reason}: ${c.message}`;
            await waitFor(async () => {
              const evs = await w.events();
              return evs.some((e) => e.type === "Warning" && /No space left on device/.test(e.message));
            }, { what: "a Warning event naming the full disk", timeoutMs: 30_000, intervalMs: 500 }).catch(() => {
              checks.expect(false, "no Warning event names the full disk");
            });
            // what is on the (full) config dir now
            checks.expect(
              (await sh(host, `sha256sum <${CONFIG_DIR}/${name}.d/${name}.yaml`)) === good,
              `${name}'s config changed while the disk was full`,
            );
            checks.expect(
              (await sh(host, `cmp ${CONFIG_DIR}/${name}.d/${name}.yaml ${CONFIG_DIR}/${name}.yaml && echo same`))
                .trim() === "same",
              `${name}'s top-level config differs from its mounted one`,
            );
            checks.expect(!(await configOf(host, name)).includes(token), "the new token is on a full disk?");
            const temps = (await sh(host, `find ${CONFIG_DIR} -name '.*.qsp-tmp.*'`)).trim();
            checks.expect(temps === "", `temp files left behind: ${temps}`);
            const partial =
              (await sh(host, `find ${CONFIG_DIR} -name '*.yaml' -size -1k -newer ${CONFIG_DIR}/.qsp-fill`))
                .trim();
            checks.expect(partial === "", `half-written configs: ${partial}`);
            checks.expect(
              (await sh(host, `podman inspect --format '{{.State.StartedAt}}' ${name}-runtime ${name}-exporter`)) ===
                identity,
              `${name}'s containers were restarted`,
            );
            checks.expect(
              (await sh(host, `systemctl is-active ${name}-runtime ${name}-exporter`)).trim() === "active\nactive",
              `${name} is not running`,
            );
            const after = async () => {
              const cfg = await configOf(host, name);
              checks.expect(
                cfg.includes(`\ntoken: ${token}\n`),
                `${name}'s config did not get the new token afterwards`,
              );
              return "caught up after the unmount";
            };
            return { fault: `rotate ${name}'s token + scale 1->2, ${free} KiB free`, note: message, after };
          } finally {
            await sh(host, `umount ${CONFIG_DIR}`);
          }
        }),
      );
    }
  } finally {
    await sh(host, `! mountpoint -q ${CONFIG_DIR} || umount ${CONFIG_DIR}`).catch(() => {});
    await w.stop({ keepLogs: results.some((r) => !r.ok) });
  }
  return results;
}

const configOf = (host: LabHost, name: string) => sh(host, `cat ${CONFIG_DIR}/${name}.yaml`);
