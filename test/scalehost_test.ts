/**
 * The scale world's stand-ins (test/scalehost: systemd, Podman and journald replaced by recording fakes behind a real
 * sshd) against the project's own host scripts. The scale bench judges the controller by what these fakes report, so
 * they must honour the contract of what they stand for: what an apply leaves, an inspection sees as on a real lab host
 * (files with their digests, both units active, the volume: no drift); a stopped unit is seen stopped; a remove leaves
 * nothing. Needs root (network namespace, mount namespaces); skipped otherwise.
 */
import assert from "node:assert/strict";
import { seedParams } from "./fixtures.ts";
import { leftovers, startScaleHosts, stopScaleHosts } from "./scalehost/scalehost.ts";
import { drift } from "../src/host/drift.ts";
import { LabHosts } from "../src/host/lab.ts";
import { renderInstance } from "../src/host/render.ts";
import { SshPool } from "../src/host/ssh.ts";
import { directTarget } from "./e2e_world.ts";

// one scale world per machine: a scale bench running now owns it
const benchRunning = (() => {
  try {
    return Deno.statSync("/run/netns/qspscale").isFile;
  } catch {
    return false;
  }
})();
if (benchRunning) console.error("scalehost_test: skipped, network namespace qspscale exists (a scale bench runs?)");

Deno.test({
  name: "scale hosts: the host scripts see on a fake host what they would see on a real one",
  ignore: Deno.uid() !== 0 || benchRunning,
  async fn() {
    const pool = new SshPool();
    try {
      const [host] = await startScaleHosts(1);
      const target = await directTarget(host);
      const lab = new LabHosts(pool);
      const { facts } = await lab.inspect(target);
      const r = renderInstance({
        namespace: "scale",
        name: "fake-a1",
        uid: "aaaaaaaa-0000-4000-8000-00000000000a",
        setName: "pool",
        params: { ...seedParams, host: { name: host.address, user: "root", port: 22 } },
        drivers: [{ name: "qemu", type: "jumpstarter_driver_qemu.driver.Qemu" }],
        exitOnLeaseEnd: true,
        endpoint: "grpc.jumpstarter.example:443",
        token: "fake-jwt.scale",
        caBundle: "",
      }, facts);
      const applied = await lab.apply(target, r, { kvmRequired: true, keepExited: true });
      assert.deepEqual([applied.errors, applied.ready], [[], true]);
      const found = async () => (await lab.inspect(target)).instances.find((i) => i.name === r.name);
      assert.deepEqual(drift(r, await found()), [], "as applied");
      // the runtime's ExecStartPre (stage.sh) ran: the launcher of the exporter image's id is on the shared volume
      const staged = await pool.exec(target, `cat /run/fake-podman/volumes/${r.volume}/_data/jumpstarter-exec`);
      assert.match(staged.stdout, /the launcher of image [0-9a-f]{64}$/m);
      assert.deepEqual(
        applied.changed.filter((f) => !r.files.some((rf) => [rf.path, ...rf.links].includes(f))),
        [],
        "only the instance's files are its changes, not the host's staging script",
      );
      assert.ok(applied.changed.length > 0);
      await pool.exec(target, `systemctl stop ${r.units.exporter}`);
      assert.deepEqual(drift(r, await found()), [`${r.units.exporter} is inactive`]);
      await lab.remove(target, r.name, r.uid);
      assert.equal(await found(), undefined);
      assert.deepEqual(await leftovers(), []);
    } finally {
      await pool.close();
      await stopScaleHosts();
    }
  },
});
