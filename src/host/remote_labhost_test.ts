/**
 * The apply, remove and inspect scripts run for real on a simulated lab host (test/labhost: systemd 257, podman 5.4
 * with quadlet, /dev/kvm, stand-in images whose exporter checks the launcher socket, the tcp target and /dev/kvm),
 * and all of it again on one whose Podman is 4.9.3 built from source (Ubuntu 24.04's; the 4.4-5.3 quadlet dialect).
 * Needs root (network namespaces, bridge, systemd-nspawn); it is skipped otherwise.
 */
import { seedParams } from "../../test/fixtures.ts";
import { inspectUntilUp, privateLabNet } from "../../test/env.ts";
import assert from "node:assert/strict";
import {
  type ExecResult,
  hostExec,
  type LabHost,
  type LabNet,
  startLabHosts,
  stopLabHosts,
} from "../../test/labhost/labhost.ts";
import { drift } from "./drift.ts";
import type { InstanceParams } from "./instance_params.ts";
import {
  EXPORTER_UID,
  type Instance,
  LAUNCHER_CACHE,
  type RenderedInstance,
  renderInstance,
  STAGE_SCRIPT,
} from "./render.ts";
import { factsWire } from "./host_facts.ts";
import { runShell } from "./script_harness.ts";
import {
  type ApplyReport,
  applyScript,
  HOST_LOCK,
  inspectScript,
  LOCK_WAIT_SECONDS,
  parseApplyOutput,
  parseInspectOutput,
  parseRemoveOutput,
  parseUnitsOutput,
  removeScript,
  sha256,
  shellCommand,
  STAGE_SCRIPT_TEXT,
  unitsScript,
} from "./remote.ts";

/**
 * The hosts it all runs on: Debian 13's own Podman, and Podman 4.9.3 in its place (test/podman/build.sh); the scripts
 * go to `sh -s` as the product sends them (Debian's sh is dash) on the first, to `bash -s` on the second, so both
 * shells run every script for real.
 */
const VARIANTS: { suffix: string; net: LabNet; podman: string; shell: "sh" | "bash" }[] = [
  { suffix: "", net: await privateLabNet(3), podman: "5\\.[0-9.]+", shell: "sh" },
  {
    suffix: " (Podman 4.9.3, bash)",
    net: { ...await privateLabNet(5), podman: "4.9.3" },
    podman: "4\\.9\\.3",
    shell: "bash",
  },
];
/** The shell the scripts of the test running now are sent to. */
let scriptShell: "sh" | "bash" = "sh";
const isRoot = Deno.uid() === 0;

// a small /disk, so that filling it up is quick
const DISK_MIB = 64;
const params: InstanceParams = {
  ...seedParams,
  host: { name: "h1", user: "root", port: 22 },
  diskBytes: DISK_MIB << 20,
};

function instance(ns: string, name: string, uid: string, over: Partial<Instance> = {}): Instance {
  return {
    namespace: ns,
    name,
    uid,
    setName: "aarch64-ssh-pool",
    params,
    drivers: [{ name: "qemu", type: "jumpstarter_driver_qemu.driver.Qemu" }],
    exitOnLeaseEnd: true,
    endpoint: "grpc.jumpstarter.example:443",
    token: `eyJ.token-one-${name}`,
    caBundle: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    ...over,
  };
}

/** Sends a script on stdin the way the product does: `sh -s` (or `sudo -n sh -s`), nothing secret in argv. */
function runScript(
  host: LabHost,
  script: string,
  command = shellCommand(host.user).replace(/\bsh -s$/, `${scriptShell} -s`),
): Promise<ExecResult> {
  return runShell("ssh", script, [
    ...["-F", "/dev/null", "-i", host.privateKeyPath, "-p", String(host.port), "-o", "BatchMode=yes"],
    ...["-o", "LogLevel=ERROR", "-o", "StrictHostKeyChecking=yes", "-o", `UserKnownHostsFile=${host.knownHostsPath}`],
    `${host.user}@${host.address}`,
    command,
  ]);
}

async function apply(
  host: LabHost,
  r: RenderedInstance,
  opts: { command?: string; keepExited?: boolean; deferRestart?: boolean } = {},
): Promise<ApplyReport> {
  const script = applyScript(r, { kvmRequired: true, ...opts });
  const out = await runScript(host, script, opts.command);
  return parseApplyOutput(out.stdout, out.stderr, out.code);
}

/**
 * The apply went through, and left both units up or on their way up: it queues their starts and restarts and does
 * not wait for them (waitUp does, as the controller's next inspection would).
 */
function assertApplied(report: ApplyReport) {
  assert.ok(report.ok, JSON.stringify(report.errors));
  for (const [unit, s] of Object.entries(report.states)) {
    const queued = report.started.includes(unit) || report.restarted.includes(unit);
    assert.ok(["active", "activating", "reloading"].includes(s.active) || queued, `${unit}: ${JSON.stringify(s)}`);
  }
  assert.equal(Object.keys(report.states).length, 2);
}

/** Waits until the host's inspection finds `r` as rendered with both units active: what makes the controller's ready. */
const waitUp = (host: LabHost, r: RenderedInstance) =>
  inspectUntilUp(async () => {
    const out = await runScript(host, inspectScript());
    return parseInspectOutput(out.stdout, out.stderr, out.code);
  }, [r]);

async function sh(host: LabHost, command: string): Promise<string> {
  const r = await hostExec(host, command);
  assert.equal(r.code, 0, `${command}\nexit ${r.code}\n${r.stderr}${r.stdout}`);
  return r.stdout;
}

/** `explain` adds what the host says to a timeout, so a failure under load shows its cause rather than only "timed out". */
async function pollUntil(
  what: string,
  probe: () => Promise<boolean>,
  timeoutMs = 60_000,
  explain?: () => Promise<string>,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await probe())) {
    if (Date.now() > deadline) {
      const why = explain ? `\n${await explain().catch((e) => `(explain failed: ${e})`)}` : "";
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${why}`);
    }
    await new Promise((r) => setTimeout(r, 250));
  }
}

const journal = (host: LabHost, unit: string) => sh(host, `journalctl -u ${unit} -o cat --no-pager`);
const count = (s: string, re: RegExp) => s.match(new RegExp(re.source, "g"))?.length ?? 0;
const HEALTHY = /launcher=ok tcp=ok kvm=present/;

/** Waits until the exporter has logged a healthy line more than `before` times. */
async function waitHealthy(host: LabHost, name: string, before = 0) {
  await pollUntil(
    `${name} exporter healthy`,
    async () => count(await journal(host, `${name}-exporter`), HEALTHY) > before,
  );
}

/** PID and start time of a container: unchanged means not restarted. */
const started = (host: LabHost, c: string) => sh(host, `podman inspect -f '{{.State.Pid}} {{.State.StartedAt}}' ${c}`);

const ms = (d: number) => `${Math.round(d)} ms`;

for (const { suffix, net, podman, shell } of VARIANTS) {
  Deno.test({
    name: `remote scripts on a lab host${suffix}: apply, no-op, token rotation, drift, refusals, inspect, remove`,
    ignore: !isRoot,
    sanitizeResources: false,
    sanitizeOps: false,
  }, async (t) => {
    const timings: string[] = [];
    scriptShell = shell;
    try {
      const [host] = await startLabHosts(net, 1);
      // the shells the scripts are written for: Debian's sh is dash, and bash is there too
      assert.equal(await sh(host, "readlink -f /bin/sh; command -v bash"), "/usr/bin/dash\n/usr/bin/bash\n");
      const a = instance("team-a", "pool-a1", "aaaaaaaa-0000-4000-8000-000000000001");
      const b = instance("team-b", "pool-b1", "bbbbbbbb-0000-4000-8000-000000000002");
      // first contact: files rendered for no host's facts are refused before anything is written, with the host's facts
      const first = await apply(host, renderInstance(a));
      assert.deepEqual(first.errors.map((e) => e.code), ["facts-changed"], JSON.stringify(first.errors));
      assert.deepEqual(first.changed, []);
      const facts = first.facts!;
      // the lab host's own /dev/kvm node, 0660 root:kvm as Debian ships it
      assert.match(factsWire(facts), new RegExp(`^podman=${podman} kvm=660:[1-9][0-9]*$`));
      const render = (i: Instance) => renderInstance(i, facts);

      await t.step("two instances on one host come up healthy, each in its own network namespace", async () => {
        for (const inst of [a, b]) {
          const t0 = performance.now();
          const report = await apply(host, render(inst));
          timings.push(`apply cold ${inst.name}: ${ms(performance.now() - t0)}`);
          assertApplied(report);
          assert.equal(report.changed.length, 4, JSON.stringify(report.changed));
          assert.deepEqual([report.reloaded, report.volumeCreated], [true, true]);
          assert.deepEqual(report.started, [`${inst.name}-runtime.service`, `${inst.name}-exporter.service`]);
          // the apply did not wait for the starts it queued: an inspection right after it sees no drift, however far
          // they got (a unit whose start job waits on the runtime's reads inactive, with the job)
          const out = await runScript(host, inspectScript());
          const found = parseInspectOutput(out.stdout, out.stderr, out.code).instances.find((i) =>
            i.name === inst.name
          );
          assert.deepEqual(drift(render(inst), found), [], JSON.stringify([found?.runtime, found?.exporter]));
        }
        for (const inst of [a, b]) {
          const t0 = performance.now();
          await waitUp(host, render(inst));
          timings.push(`up after the apply ${inst.name}: ${ms(performance.now() - t0)}`);
          await waitHealthy(host, inst.name);
          const log = await journal(host, `${inst.name}-exporter`);
          assert.match(
            log,
            new RegExp(`name=${inst.namespace}/${inst.name} endpoint=grpc\\.jumpstarter\\.example:443`),
          );
          assert.ok(!log.includes("token-one"), "the token is not logged");
        }
        const nsOf = (c: string) => sh(host, `readlink /proc/$(podman inspect -f '{{.State.Pid}}' ${c})/ns/net`);
        assert.equal(await nsOf("pool-a1-exporter"), await nsOf("pool-a1-runtime"));
        assert.notEqual(await nsOf("pool-a1-runtime"), await nsOf("pool-b1-runtime"));
        const perms = await sh(
          host,
          "stat -c '%a %n' /etc/jumpstarter/exporters && stat -c '%a %h %n' /etc/jumpstarter/exporters/pool-a1.yaml",
        );
        assert.equal(perms, "700 /etc/jumpstarter/exporters\n600 2 /etc/jumpstarter/exporters/pool-a1.yaml\n");
        // quadlet units cannot be enabled, [Install] wires them into the boot target
        assert.match(await sh(host, "ls /run/systemd/generator/multi-user.target.wants/"), /pool-a1-exporter\.service/);
        // Pull=newer (the :latest images, no pull policy stated) on a host that reaches no registry: Podman cannot
        // compare digests and starts the local image, as its documentation says ("pull errors are suppressed if a
        // local image was found")
        for (const u of ["pool-a1-runtime", "pool-a1-exporter"]) {
          assert.match(await sh(host, `systemctl cat ${u}.service`), /^ExecStart=.* --pull newer /m, u);
        }
        const pull = await hostExec(host, `podman pull --policy always ${params.images.exporter.image}`);
        assert.notEqual(pull.code, 0, "the lab host reaches no registry");
      });

      await t.step(
        "the launcher: copied out of the exporter image once per image id, onto the volume at every start",
        async () => {
          const image = params.images.exporter.image;
          const id = (await sh(host, `podman image inspect --format '{{.Id}}' ${image}`)).trim();
          const cached = `${LAUNCHER_CACHE}/${id}/jumpstarter-exec`;
          const mp = (await sh(host, "podman volume inspect -f '{{.Mountpoint}}' jumpstarter-pool-a1-shared")).trim();
          const staged = `${mp}/jumpstarter-exec`;
          // podman's o=uid,gid made the volume the exporter's: the apply no longer checks a volume it just made
          assert.equal(await sh(host, `stat -c %u:%g ${mp}`), `${EXPORTER_UID}:${EXPORTER_UID}\n`);
          // the script every apply writes, root's; the launcher the runtime runs is the cached one
          assert.equal(
            await sh(host, `stat -c '%a %u' ${STAGE_SCRIPT} ${staged} && sha256sum <${STAGE_SCRIPT}`),
            `755 0\n755 0\n${sha256(STAGE_SCRIPT_TEXT)}  -\n`,
          );
          await sh(host, `cmp ${cached} ${staged}`);
          const inode = (f: string) => sh(host, `stat -c '%i %Y' ${f}`);
          const [cachedBefore, stagedBefore] = [await inode(cached), await inode(staged)];
          const seen = count(await journal(host, "pool-a1-exporter"), HEALTHY);
          const t0 = performance.now();
          await sh(host, "systemctl restart pool-a1-runtime.service pool-a1-exporter.service");
          timings.push(`runtime restart (staging from the cache): ${ms(performance.now() - t0)}`);
          await waitHealthy(host, "pool-a1", seen);
          assert.equal(await inode(cached), cachedBefore, "not copied out of the image again");
          assert.notEqual(await inode(staged), stagedBefore, "copied onto the volume at the start");
          await sh(host, `cmp ${cached} ${staged}`);
          assert.equal(await sh(host, "podman ps -a --format '{{.Names}}' | grep -c -- -stage || true"), "0\n");

          // real Podman: an image of a new id is staged anew; Never without the image fails, saying why
          const moved = "localhost/qsp-stage-moved:1";
          const run = (pull: string, img: string) =>
            hostExec(host, `/bin/sh ${STAGE_SCRIPT} ${pull} ${img} qsp-stage-test qsp-stage-test-stage`);
          await sh(
            host,
            `podman create --name qsp-stage-src ${image} x >/dev/null && podman commit -q qsp-stage-src ${moved} ` +
              ">/dev/null && podman rm qsp-stage-src >/dev/null && podman volume create qsp-stage-test >/dev/null",
          );
          let movedId = "none";
          try {
            movedId = (await sh(host, `podman image inspect --format '{{.Id}}' ${moved}`)).trim();
            assert.notEqual(movedId, id);
            const staging = await run("never", moved);
            assert.equal(staging.code, 0, staging.stderr);
            const vmp = (await sh(host, "podman volume inspect -f '{{.Mountpoint}}' qsp-stage-test")).trim();
            await sh(host, `cmp ${LAUNCHER_CACHE}/${movedId}/jumpstarter-exec ${vmp}/jumpstarter-exec`);
            const missing = await run("never", "localhost/qsp-stage-missing:1");
            assert.notEqual(missing.code, 0);
            assert.match(missing.stderr, /qsp-stage-missing:1 is not on this host and its imagePullPolicy is Never/);
            assert.equal(await sh(host, "podman ps -a --format '{{.Names}}' | grep -c qsp-stage || true"), "0\n");
          } finally {
            await sh(
              host,
              `podman volume rm -f qsp-stage-test >/dev/null; podman rmi -f ${moved} >/dev/null; ` +
                `rm -rf ${LAUNCHER_CACHE}/${movedId}`,
            );
          }
        },
      );

      await t.step(
        "/disk: one sized volume both containers mount, the exporter's to write, full at its size",
        async () => {
          const disk = render(a).disk;
          // the stand-ins' contract: the exporter flashed into its /disk and the runtime read the flash from its own
          assert.match(await journal(host, "pool-a1-exporter"), /token=<set> disk=ok$/m);
          assert.match(await journal(host, "pool-a1-runtime"), /jumpstarter-exec: disk ok/);
          for (const c of ["pool-a1-runtime", "pool-a1-exporter"]) {
            const mounts = await sh(
              host,
              `podman inspect -f '{{range .Mounts}}{{.Name}}:{{.Destination}} {{end}}' ${c}`,
            );
            assert.match(mounts, new RegExp(`(^| )${disk.volume}:/disk `), c);
          }
          const mp = (await sh(host, `podman volume inspect -f '{{.Mountpoint}}' ${disk.volume}`)).trim();
          const [source, fstype, size] = (await sh(host, `findmnt -n -b -o SOURCE,FSTYPE,SIZE ${mp}`)).trim().split(
            /\s+/,
          );
          assert.match(source, /^\/dev\/loop[0-9]+$/);
          assert.equal(fstype, "ext4");
          // ext4's own metadata (journal, inode tables) takes a little of the image
          assert.ok(Number(size) <= DISK_MIB << 20 && Number(size) > (3 * DISK_MIB / 4) << 20, size);
          assert.equal(await sh(host, `stat -c '%U %s' ${disk.image}`), `root ${DISK_MIB << 20}\n`);
          assert.ok(
            Number(await sh(host, `du -k ${disk.image} | cut -f1`)) < 8 * 1024,
            "sparse: only metadata written",
          );
          // the size holds for the exporter's uid: writing past it fails with ENOSPC
          const fill = await hostExec(
            host,
            // from inside the mount point: the way there (/var/lib/containers) is root's alone
            `cd ${mp} && setpriv --reuid 65532 --regid 65532 --clear-groups dd if=/dev/zero of=fill bs=1M count=${
              DISK_MIB + 8
            }`,
          );
          assert.notEqual(fill.code, 0);
          assert.match(fill.stderr, /No space left on device/);
          await sh(host, `rm ${mp}/fill`);
        },
      );

      await t.step(
        "/disk grows at the restart a larger size brings, deferred while leased; smaller is refused",
        async () => {
          const before = await started(host, "pool-a1-runtime");
          const mp = (await sh(host, `podman volume inspect -f '{{.Mountpoint}}' jumpstarter-pool-a1-disk`)).trim();
          const grown = render({ ...a, params: { ...params, diskBytes: (2 * DISK_MIB) << 20 } });
          const leased = await apply(host, grown, { deferRestart: true });
          assertApplied(leased);
          assert.equal(leased.disk, "grow-pending");
          assert.deepEqual(leased.pending, ["pool-a1-runtime.service", "pool-a1-exporter.service"]);
          assert.equal(await started(host, "pool-a1-runtime"), before, "QEMU keeps running while leased");

          const healthy = () => journal(host, "pool-a1-exporter").then((j) => count(j, HEALTHY));
          let seen = await healthy();
          const report = await apply(host, grown);
          assertApplied(report);
          assert.equal(report.disk, "grown");
          assert.deepEqual(report.restarted, ["pool-a1-runtime.service", "pool-a1-exporter.service"]);
          await waitHealthy(host, "pool-a1", seen);
          const size = Number((await sh(host, `findmnt -n -b -o SIZE ${mp}`)).trim());
          assert.ok(size > (3 * DISK_MIB / 2) << 20, String(size));
          const after = await started(host, "pool-a1-runtime");

          const shrunk = await apply(host, render(a));
          assert.equal(shrunk.ok, false);
          assert.deepEqual(shrunk.errors.map((e) => e.code), ["disk-shrink"]);
          assert.match(
            shrunk.errors[0].message,
            /holds 128 MiB, more than the 64 MiB that storage\.size plus storage\.fsOverhead/,
          );
          assert.deepEqual(shrunk.changed, [], "refused before anything is written");
          assert.equal(await started(host, "pool-a1-runtime"), after);
          // back to the size the later steps expect: a fresh /disk
          seen = await healthy();
          await runScript(host, removeScript("pool-a1"));
          assertApplied(await apply(host, render(a)));
          await waitHealthy(host, "pool-a1", seen);
        },
      );

      await t.step(
        "upstream's image contract: without the staged launcher, a readable config or a shared /disk, nothing runs",
        async () => {
          // the contract as deployed: root runtime running the staged launcher, exporter as 65532 reading its own config
          assert.match(await journal(host, "pool-a1-runtime"), /jumpstarter-exec: starting pid=\d+ uid=0 /);
          assert.match(await journal(host, "pool-a1-exporter"), /standin-exporter: starting uid=65532 /);
          assert.match(
            await journal(host, "pool-a1-runtime"),
            /log_fields="component=exporter,exporter=pool-a1,namespace=team-a"/,
          );
          assert.equal(
            await sh(
              host,
              "stat -c '%u:%g %a' /etc/jumpstarter/exporters/pool-a1.d /etc/jumpstarter/exporters/pool-a1.yaml",
            ),
            "65532:65532 700\n65532:65532 600\n",
          );
          const broken = (name: string, uid: string, edit: (r: RenderedInstance) => void) => {
            const r = render(instance("team-c", name, uid));
            edit(r);
            return r;
          };
          const noStaging = broken("pool-c1", "cccccccc-0000-4000-8000-000000000001", (r) => {
            const rt = r.files.find((f) => f.path.endsWith("-runtime.container"))!;
            rt.content = rt.content.replace(/^ExecStartPre=.*\n/m, "");
          });
          const unreadable = broken("pool-c2", "cccccccc-0000-4000-8000-000000000002", (r) => {
            r.files.find((f) => f.secret)!.owner = 0;
          });
          // upstream main's /disk: missing in the exporter, or not the runtime's, the flash cannot reach QEMU
          const exporterDisk = (r: RenderedInstance, mount: string) => {
            const ex = r.files.find((f) => f.path.endsWith("-exporter.container"))!;
            ex.content = ex.content.replace(
              /^Volume=jumpstarter-.*-disk:\/disk:z,U\n/m,
              `${mount}Environment=STANDIN_RETRY=2s\n`,
            );
          };
          const noDisk = broken("pool-c3", "cccccccc-0000-4000-8000-000000000005", (r) => exporterDisk(r, ""));
          const ownDisk = broken(
            "pool-c4",
            "cccccccc-0000-4000-8000-000000000006",
            (r) => exporterDisk(r, "Tmpfs=/disk:mode=1777\n"),
          );
          const brokenOnes = [noStaging, unreadable, noDisk, ownDisk];
          try {
            for (const r of brokenOnes) {
              const report = await apply(host, r);
              assert.ok(report.ok, JSON.stringify(report.errors));
              // Not asserted on the report: a container that fails at once is "active" for the moment between its
              // start and its exit, and the apply's last look may fall there (with any pull policy). The journal and
              // the restarts below are the evidence.
            }
            await pollUntil(
              "the runtime without a launcher to fail",
              async () => /jumpstarter-exec.*(no such file|not found)/i.test(await journal(host, "pool-c1-runtime")),
            );
            await pollUntil(
              "the exporter to fail on its config",
              async () => /config error: .*permission denied/.test(await journal(host, "pool-c2-exporter")),
            );
            for (const [name, why] of [["pool-c3", "unwritable"], ["pool-c4", "unshared"]]) {
              await pollUntil(
                `${name}'s exporter to fail on its /disk`,
                async () => (await journal(host, `${name}-exporter`)).includes(`standin-exporter: error: disk=${why}`),
              );
            }
            for (const unit of ["pool-c1-runtime", "pool-c2-exporter", "pool-c3-exporter", "pool-c4-exporter"]) {
              await pollUntil(
                `${unit} not to stay up after failing`,
                async () => {
                  const shown = await sh(host, `systemctl show -p NRestarts,ActiveState ${unit}.service`);
                  const n = Number(/^NRestarts=(\d+)$/m.exec(shown)?.[1]);
                  const state = /^ActiveState=(.*)$/m.exec(shown)?.[1];
                  // Restarted, or down: a container that exits within milliseconds of its start may be gone before
                  // systemd reads conmon's MAINPID ("New main PID ... does not exist or is a zombie"). systemd then
                  // knows no exit status, deactivates the unit "successfully", and Restart=on-failure leaves it down,
                  // as after a clean exit; the controller starts such an exporter again (deploy.ts, holdExited).
                  return n > 0 || state === "inactive" || state === "failed";
                },
                60_000,
                () =>
                  sh(
                    host,
                    `systemctl show -p NRestarts,ActiveState,SubState,Result,ExecMainStatus ${unit}.service; ` +
                      `journalctl -u ${unit}.service --no-pager -n 60 -o short-precise`,
                  ),
              );
            }
          } finally {
            // removed whatever failed above, so the steps after this one see only their own instances
            for (const r of brokenOnes) {
              const out = await runScript(host, removeScript(r.name));
              assert.ok(parseRemoveOutput(out.stdout, out.stderr, out.code).ok, out.stdout + out.stderr);
            }
          }
        },
      );

      await t.step("applying again changes nothing and restarts nothing", async () => {
        const before = await started(host, "pool-a1-runtime pool-a1-exporter");
        const t0 = performance.now();
        const report = await apply(host, render(a));
        timings.push(`apply no-op: ${ms(performance.now() - t0)}`);
        assertApplied(report);
        assert.deepEqual(
          [report.changed, report.reloaded, report.restarted, report.hupped, report.started, report.volumeCreated],
          [[], false, [], [], [], false],
        );
        assert.equal(await started(host, "pool-a1-runtime pool-a1-exporter"), before);
      });

      await t.step("a new token rewrites only the config, HUPs the exporter, and QEMU keeps running", async () => {
        const before = await started(host, "pool-a1-runtime pool-a1-exporter");
        const reloadsBefore = count(await journal(host, "pool-a1-exporter"), /SIGHUP, reloaded/);
        const rotated = { ...a, token: "eyJ.token-two-pool-a1" };
        const report = await apply(host, render(rotated));
        assertApplied(report);
        assert.deepEqual(report.changed, [
          "/etc/jumpstarter/exporters/pool-a1.d/pool-a1.yaml",
          "/etc/jumpstarter/exporters/pool-a1.yaml",
        ]);
        assert.deepEqual([report.reloaded, report.restarted, report.hupped], [false, [], ["pool-a1-exporter.service"]]);
        await pollUntil("exporter reload", async () => {
          return count(await journal(host, "pool-a1-exporter"), /SIGHUP, reloaded/) > reloadsBefore;
        });
        // the container sees the new file through its directory mount, without a restart
        assert.match(
          await sh(host, "podman exec pool-a1-exporter grep -c token-two /etc/jumpstarter/exporters/pool-a1.yaml"),
          /^1$/m,
        );
        assert.equal(await started(host, "pool-a1-runtime pool-a1-exporter"), before);
        // and a second apply with that token is a no-op again
        const again = await apply(host, render(rotated));
        assert.deepEqual([again.changed, again.hupped], [[], []]);
        Object.assign(a, rotated);
      });

      await t.step("drift: a quadlet and the config link deleted by hand are put back without restarting", async () => {
        const before = await started(host, "pool-a1-runtime pool-a1-exporter");
        const inspected = async () => {
          const out = await runScript(host, inspectScript());
          return drift(render(a), parseInspectOutput(out.stdout, out.stderr, out.code).instances[0]);
        };
        assert.deepEqual(await inspected(), [], "the resync check's inspection agrees with the apply: no drift");
        await sh(host, "rm /etc/containers/systemd/pool-a1-runtime.container /etc/jumpstarter/exporters/pool-a1.yaml");
        assert.deepEqual(await inspected(), [
          "/etc/jumpstarter/exporters/pool-a1.yaml is missing",
          "/etc/containers/systemd/pool-a1-runtime.container is missing",
        ]);
        const report = await apply(host, render(a));
        assertApplied(report);
        assert.deepEqual(await inspected(), []);
        assert.deepEqual(report.changed, [
          "/etc/jumpstarter/exporters/pool-a1.yaml",
          "/etc/containers/systemd/pool-a1-runtime.container",
        ]);
        assert.equal(report.reloaded, true);
        assert.deepEqual([report.restarted, report.hupped], [[], []], "same content: nothing to restart");
        assert.equal(await started(host, "pool-a1-runtime pool-a1-exporter"), before);
        assert.equal(
          await sh(
            host,
            "stat -c %i /etc/jumpstarter/exporters/pool-a1.yaml /etc/jumpstarter/exporters/pool-a1.d/pool-a1.yaml | uniq | wc -l",
          ),
          "1\n",
          "the link is one inode with the mounted file again",
        );
      });

      await t.step(
        "deferRestart: a leased instance keeps running its old definition until an apply without it",
        async () => {
          const both = "pool-a1-runtime pool-a1-exporter";
          const before = await started(host, both);
          const neverPull = {
            ...params,
            images: { ...params.images, runtime: { ...params.images.runtime, pullPolicy: "Never" as const } },
          };
          const units = ["pool-a1-runtime.service", "pool-a1-exporter.service"];
          const deferred = await apply(host, render({ ...a, params: neverPull }), { deferRestart: true });
          assertApplied(deferred);
          assert.deepEqual([deferred.changed, deferred.restarted, deferred.pending], [
            ["/etc/containers/systemd/pool-a1-runtime.container"],
            [],
            units,
          ]);
          // systemd has the new definition loaded now: only the host's own record says the restart is still owed
          const rotated = { ...a, params: neverPull, token: "eyJ.token-three-pool-a1" };
          const again = await apply(host, render(rotated), { deferRestart: true });
          assert.deepEqual([again.restarted, again.hupped, again.pending], [[], ["pool-a1-exporter.service"], units]);
          assert.equal(await started(host, both), before, "nothing restarted under the lease");
          const after = await apply(host, render(rotated));
          assertApplied(after);
          assert.deepEqual([after.changed, after.restarted, after.pending], [[], units, []]);
          await waitUp(host, render(rotated));
          assert.notEqual(await started(host, both), before);
          const settled = await apply(host, render(rotated));
          assert.deepEqual([settled.restarted, settled.pending], [[], []], "restarted once, not on every apply");
          Object.assign(a, rotated);
        },
      );

      await t.step("a runtime quadlet change restarts both units, an exporter change only the exporter", async () => {
        const healthy = count(await journal(host, "pool-b1-exporter"), HEALTHY);
        const rtBefore = await started(host, "pool-b1-runtime");
        const neverPull = {
          ...params,
          images: { ...params.images, runtime: { ...params.images.runtime, pullPolicy: "Never" as const } },
        };
        const report = await apply(host, render({ ...b, params: neverPull }));
        assertApplied(report);
        assert.deepEqual(report.changed, ["/etc/containers/systemd/pool-b1-runtime.container"]);
        assert.deepEqual(report.restarted, ["pool-b1-runtime.service", "pool-b1-exporter.service"]);
        await waitUp(host, render({ ...b, params: neverPull }));
        assert.notEqual(await started(host, "pool-b1-runtime"), rtBefore);
        await waitHealthy(host, "pool-b1", healthy);

        const rtNow = await started(host, "pool-b1-runtime");
        const exBefore = await started(host, "pool-b1-exporter");
        // (the exporter's image is in the runtime quadlet too: the runtime's launcher is staged from it)
        const report2 = await apply(host, render({ ...b, params: neverPull, exitOnLeaseEnd: !b.exitOnLeaseEnd }));
        assertApplied(report2);
        assert.deepEqual(report2.restarted, ["pool-b1-exporter.service"]);
        await waitUp(host, render({ ...b, params: neverPull, exitOnLeaseEnd: !b.exitOnLeaseEnd }));
        assert.equal(await started(host, "pool-b1-runtime"), rtNow);
        assert.notEqual(await started(host, "pool-b1-exporter"), exBefore);
        await waitHealthy(host, "pool-b1", healthy + 1);
      });

      await t.step("ExitAndReplace: an exporter that ended after its lease stays down and is reported", async () => {
        const rt = await started(host, "pool-a1-runtime");
        // SIGINT makes the stand-in exit 0, as `jmp run` does when exitOnLeaseEnd ends it after a lease
        await sh(host, "podman kill --signal INT pool-a1-exporter");
        await pollUntil("exporter exit", async () => {
          return (await hostExec(host, "systemctl is-active pool-a1-exporter.service")).stdout.trim() === "inactive";
        });
        const kept = await apply(host, render(a), { keepExited: true });
        assert.ok(kept.ok, JSON.stringify(kept.errors));
        assert.deepEqual([kept.exited, kept.started, kept.restarted], [["pool-a1-exporter.service"], [], []]);
        assert.equal(kept.states["pool-a1-exporter.service"].active, "inactive");
        assert.equal(kept.states["pool-a1-runtime.service"].active, "active");
        assert.equal(await started(host, "pool-a1-runtime"), rt, "QEMU is left alone");

        // InPlaceReuse (or an exporter the controller keeps): the apply brings it back
        const healthy = count(await journal(host, "pool-a1-exporter"), HEALTHY);
        const back = await apply(host, render(a));
        assertApplied(back);
        assert.deepEqual([back.exited, back.started], [[], ["pool-a1-exporter.service"]]);
        await waitHealthy(host, "pool-a1", healthy);
      });

      await t.step("refusals: another uid's files, a quadlet that generates no service, missing devices", async () => {
        const files = "/etc/containers/systemd/pool-a1-*.container /etc/jumpstarter/exporters/pool-a1.yaml";
        const sums = await sh(host, `sha256sum ${files}`);
        const intruder = instance("team-z", "pool-a1", "zzzzzzzz-0000-4000-8000-000000000009");
        const conflict = await apply(host, render(intruder));
        assert.equal(conflict.ok, false);
        assert.deepEqual(new Set(conflict.errors.map((e) => e.code)), new Set(["owner-conflict"]));
        assert.match(conflict.errors[0].message, /uid=aaaaaaaa-0000-4000-8000-000000000001, not uid=zzzzzzzz-/);
        assert.deepEqual(conflict.changed, []);
        assert.equal(await sh(host, `sha256sum ${files}`), sums, "nothing of the owner's was touched");
        const removeConflict = await runScript(host, removeScript("pool-a1", { uid: intruder.uid }));
        assert.deepEqual(
          parseRemoveOutput(removeConflict.stdout, removeConflict.stderr, removeConflict.code).errors.map((e) =>
            e.code
          )[0],
          "owner-conflict",
        );

        // a key podman does not know makes quadlet skip the file: the service silently does not exist
        const c = render(instance("team-c", "pool-c1", "cccccccc-0000-4000-8000-000000000003"));
        const rt = c.files.find((f) => f.path.endsWith("-runtime.container"))!;
        rt.content = rt.content.replace("[Container]\n", "[Container]\nNoSuchKey=1\n");
        const bad = await apply(host, c);
        assert.equal(bad.ok, false);
        assert.equal(bad.errors.length, 1, JSON.stringify(bad.errors));
        assert.equal(bad.errors[0].code, "unit-missing");
        assert.match(bad.errors[0].message, /pool-c1-runtime\.service: .*NoSuchKey/);

        // rendered for the host as the script will find it: without /dev/kvm
        const d = renderInstance(
          instance("team-d", "pool-d1", "dddddddd-0000-4000-8000-000000000004", {
            params: { ...params, runtime: { kvm: true, devices: ["/dev/qsp-no-such-device"] } },
          }),
          { ...facts, kvm: null },
        );
        // the script runs where /dev/kvm is hidden (a private mount namespace); the host itself keeps it
        const noKvm = "unshare -m --propagation private sh -c 'touch /run/qsp-no-kvm && mount --bind /run/qsp-no-kvm " +
          `/dev/kvm && exec ${shell} -s'`;
        const missing = await apply(host, d, { command: noKvm });
        assert.deepEqual(missing.errors.map((e) => e.code), ["kvm-missing", "device-missing"]);
        assert.deepEqual(missing.started, [], "nothing is started on a host that lacks the devices");
        assert.equal(
          await sh(host, "systemctl is-active pool-d1-runtime.service pool-d1-exporter.service || true"),
          "inactive\ninactive\n",
        );
      });

      await t.step("inspect lists every managed instance with its owner, including half-deployed ones", async () => {
        // as a non-root user through sudo, the way a host with `user: lab` is driven
        const out = await runScript({ ...host, user: "lab" }, inspectScript());
        const h = parseInspectOutput(out.stdout, out.stderr, out.code);
        assert.ok(h.ok, JSON.stringify(h.errors));
        assert.deepEqual(h.facts, facts);
        assert.ok((h.systemdVersion ?? 0) >= 254);
        assert.equal(h.generator, "/usr/lib/systemd/system-generators/podman-system-generator");
        assert.ok(h.diskFreeKiB["/etc"] > 0 && h.diskFreeKiB["/var/lib/containers"] > 0);
        assert.deepEqual(
          h.instances.map((i) => [i.name, i.namespace, i.set, i.uid, i.runtime?.active, i.exporter?.active, i.volume]),
          [
            ["pool-a1", "team-a", "aarch64-ssh-pool", a.uid, "active", "active", true],
            ["pool-b1", "team-b", "aarch64-ssh-pool", b.uid, "active", "active", true],
            [
              "pool-c1",
              "team-c",
              "aarch64-ssh-pool",
              "cccccccc-0000-4000-8000-000000000003",
              "inactive",
              "inactive",
              true,
            ],
            [
              "pool-d1",
              "team-d",
              "aarch64-ssh-pool",
              "dddddddd-0000-4000-8000-000000000004",
              "inactive",
              "inactive",
              true,
            ],
          ],
        );
        assert.deepEqual(h.instances[0].containers.map((c) => c.name).sort(), ["pool-a1-exporter", "pool-a1-runtime"]);
        assert.equal(h.instances[0].files.length, 4, "both quadlets, the config and its mounted twin");
        // the runtime quadlet of pool-c1 generated nothing: the unit is only known as the exporter's dependency
        assert.equal(h.instances[2].runtime?.load, "not-found");
        // the units-only look (the close checks after an apply) sees the same units and jobs
        const u = await runScript({ ...host, user: "lab" }, unitsScript());
        const only = parseUnitsOutput(u.stdout, u.stderr, u.code);
        assert.ok(only.ok, JSON.stringify(only.errors));
        for (const i of h.instances) {
          assert.deepEqual(
            [only.units[`${i.name}-runtime.service`], only.units[`${i.name}-exporter.service`]],
            [i.runtime, i.exporter],
            i.name,
          );
        }
      });

      await t.step("remove leaves nothing behind, and removing again is fine", async () => {
        // containers left behind by units that stopped without their ExecStopPost: the exporter in the runtime's
        // network namespace, so that podman refuses the runtime while the exporter is there
        const img = params.images.exporter.image;
        await sh(
          host,
          "systemctl stop pool-b1-exporter pool-b1-runtime && " +
            `podman create --name pool-b1-runtime ${img} sleep 600 >/dev/null && ` +
            `podman create --name pool-b1-exporter --network container:pool-b1-runtime ${img} sleep 600 >/dev/null`,
        );
        for (const name of ["pool-a1", "pool-b1", "pool-c1", "pool-d1"]) {
          const t0 = performance.now();
          const out = await runScript(host, removeScript(name));
          if (name === "pool-a1") timings.push(`remove: ${ms(performance.now() - t0)}`);
          const report = parseRemoveOutput(out.stdout, out.stderr, out.code);
          assert.ok(report.ok, JSON.stringify(report.errors));
          assert.equal(report.reloaded, true);
          assert.ok(report.removed.some((r) => r.kind === "volume"));
          if (name === "pool-b1") {
            assert.deepEqual(report.removed.filter((r) => r.kind === "container").map((r) => r.name).sort(), [
              "pool-b1-exporter",
              "pool-b1-runtime",
            ]);
          }
          // the disk's image before its volume
          assert.deepEqual(report.removed.filter((r) => r.name.includes("-disk") || r.name.endsWith(".img")), [
            { kind: "file", name: `/var/lib/qemu-ssh.jumpstarter.dev/disks/${name}.img` },
            { kind: "volume", name: `jumpstarter-${name}-disk` },
          ], name);
        }
        const again = await runScript(host, removeScript("pool-a1"));
        assert.equal(again.code, 0);
        assert.match(again.stdout, /^qsp removed nothing$/m);
        assert.deepEqual(parseRemoveOutput(again.stdout, again.stderr, again.code).removed, []);

        assert.equal(await sh(host, "systemctl list-units --all --no-legend 'pool-*'"), "");
        assert.equal(await sh(host, "podman ps -a --format '{{.Names}}'"), "");
        assert.equal(await sh(host, "podman volume ls -q"), "");
        assert.equal(await sh(host, "ls -A /var/lib/qemu-ssh.jumpstarter.dev/disks"), "");
        // the host's, which other instances' runtimes use: a remove leaves them
        await sh(host, `test -f ${STAGE_SCRIPT} && ls ${LAUNCHER_CACHE}/*/jumpstarter-exec`);
        assert.equal(await sh(host, "findmnt -n -o SOURCE | grep '^/dev/loop' || true"), "", "no /disk left mounted");
        assert.equal(
          await sh(
            host,
            "ls -A /etc/jumpstarter/exporters /etc/containers/systemd | grep -v '^users$' | grep -v '^/' | grep -v '^$' || true",
          ),
          "",
        );
        assert.equal((await sh(host, "systemctl show -p NFailedUnits --value")).trim(), "0");
        const h = await runScript(host, inspectScript());
        assert.deepEqual(parseInspectOutput(h.stdout, h.stderr, h.code).instances, []);
      });
    } finally {
      await stopLabHosts(net);
      console.log(timings.join("\n"));
    }
  });
}

/** Systemd's "unit started" message: one per start of the unit, whoever asked for it. */
const UNIT_STARTED = "MESSAGE_ID=39f53479d3a045ac8e11786248231fbf";
/** How often systemd has started a unit so far, from its journal. */
async function starts(host: LabHost, unit: string): Promise<number> {
  await sh(host, "journalctl --sync");
  const out = await sh(host, `journalctl -o cat --no-pager _PID=1 UNIT=${unit} ${UNIT_STARTED}`);
  return out.split("\n").filter((l) => l.trim()).length;
}

/** How many daemon-reloads systemd has done so far, from its journal (one "Reloading finished" line each). */
async function reloads(host: LabHost): Promise<number> {
  await sh(host, "journalctl --sync");
  const out = await sh(host, "journalctl -o cat --no-pager _PID=1 | grep -c '^Reloading finished' || true");
  return Number(out.trim());
}

const { net } = VARIANTS[0];

Deno.test({
  name: "remote scripts on a lab host: concurrent applies of one change restart every runtime once, none lost",
  ignore: !isRoot,
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  scriptShell = "sh";
  try {
    const [host] = await startLabHosts(net, 1);
    // first contact tells the host's facts; everything below is rendered for them
    const { facts } = await apply(
      host,
      renderInstance(instance("team-r", "pool-r0", "eeeeeeee-0000-4000-8000-000000000000")),
    );
    const render = (i: Instance) => renderInstance(i, facts);
    const all = Array.from(
      { length: 7 },
      (_, i) => instance("team-r", `pool-r${i + 1}`, `eeeeeeee-0000-4000-8000-00000000000${i + 1}`),
    );
    // two of them are leased: their restart waits for the lease (deferRestart), the rest restart at once
    const leased = new Set(["pool-r6", "pool-r7"]);
    const neverPull = {
      ...params,
      images: { ...params.images, runtime: { ...params.images.runtime, pullPolicy: "Never" as const } },
    };
    const runtimeStarts = async () =>
      Object.fromEntries(
        await Promise.all(all.map(async (i) => [i.name, await starts(host, `${i.name}-runtime.service`)])),
      );

    await t.step("7 instances deployed at once on one host all come up", async () => {
      const reports = await Promise.all(all.map((i) => apply(host, render(i))));
      reports.forEach(assertApplied);
      for (const i of all) await waitUp(host, render(i));
    });

    await t.step("one runtime change applied to all at once: each runtime restarts exactly once", async () => {
      const before = await runtimeStarts();
      const reloadsBefore = await reloads(host);
      const reports = await Promise.all(
        all.map((i) => apply(host, render({ ...i, params: neverPull }), { deferRestart: leased.has(i.name) })),
      );
      reports.forEach(assertApplied);
      // every runtime quadlet changed; the applies at once share daemon-reloads (lib.sh reload_systemd)
      const reloaded = (await reloads(host)) - reloadsBefore;
      console.log(`daemon-reloads for ${all.length} applies at once: ${reloaded}`);
      assert.ok(reloaded >= 1 && reloaded < all.length, `${reloaded} daemon-reloads for ${all.length} applies`);
      // the restarts are queued, not awaited: counted once they are done (the leased ones still owe theirs)
      const upAll = async (which: Instance[]) => {
        for (const i of which) await waitUp(host, render({ ...i, params: neverPull }));
      };
      await upAll(all.filter((i) => !leased.has(i.name)));
      const mid = await runtimeStarts();
      const lease = await Promise.all(
        all.filter((i) => leased.has(i.name)).map((i) => apply(host, render({ ...i, params: neverPull }))),
      );
      lease.forEach(assertApplied);
      // applied once more at once, as a resync may while those restarts are under way: nothing is owed any more, and
      // a restart queued and not done yet is not taken for a unit that went down
      const again = await Promise.all(all.map((i) => apply(host, render({ ...i, params: neverPull }))));
      await upAll(all);
      const after = await runtimeStarts();
      console.log(
        "runtime restarts per instance (during the concurrent applies, after the leases ended):\n" +
          all.map((i) => `  ${i.name}: ${mid[i.name] - before[i.name]}, ${after[i.name] - before[i.name]}`)
            .join("\n"),
      );
      all.forEach((i, n) => {
        const rt = `${i.name}-runtime.service`;
        if (leased.has(i.name)) {
          assert.deepEqual([reports[n].restarted, reports[n].pending], [[], [rt, `${i.name}-exporter.service`]]);
          assert.equal(mid[i.name], before[i.name], `${i.name}: not restarted under its lease`);
        } else {
          assert.deepEqual(reports[n].restarted, [rt, `${i.name}-exporter.service`], i.name);
          assert.equal(mid[i.name] - before[i.name], 1, `${i.name}: restarted once by the concurrent applies`);
        }
        assert.equal(after[i.name] - before[i.name], 1, `${i.name}: restarted exactly once in all`);
        assert.deepEqual([again[n].restarted, again[n].pending, again[n].started], [[], [], []], i.name);
      });
      all.forEach((i) => i.params = neverPull);
    });

    await t.step("an apply killed between daemon-reload and restart is repaired by the next resync", async () => {
      const [r1] = all;
      const changed = render({ ...r1, params });
      // dies right after systemd loaded the new definition, before it could restart anything
      const killed = applyScript(changed, { kvmRequired: true }).replace(
        "\nstep=check-units\n",
        "\nkill -KILL $$\nstep=check-units\n",
      );
      const out = await runScript(host, killed);
      const report = parseApplyOutput(out.stdout, out.stderr, out.code);
      assert.deepEqual([report.ok, report.reloaded, report.restarted], [false, true, []]);
      const before = await starts(host, `${r1.name}-runtime.service`);
      // the resync's inspection sees the restart owed (files and units alone look fine)
      const inspected = await runScript(host, inspectScript());
      const found = parseInspectOutput(inspected.stdout, inspected.stderr, inspected.code).instances
        .find((i) => i.name === r1.name);
      assert.deepEqual(drift(changed, found), [
        `${r1.name}-runtime.service runs an older definition than its quadlet's`,
      ]);
      const repaired = await apply(host, changed);
      assertApplied(repaired);
      assert.deepEqual([repaired.changed, repaired.restarted], [[], [
        `${r1.name}-runtime.service`,
        `${r1.name}-exporter.service`,
      ]]);
      await waitUp(host, changed);
      assert.equal(await starts(host, `${r1.name}-runtime.service`), before + 1);
      const settled = await apply(host, changed);
      assert.deepEqual(settled.restarted, [], "restarted once, not on every apply");
    });

    await t.step("the host lock: a script that cannot get it in time refuses with host-busy", async () => {
      // held by another process on the host until the test lets go, past the bound (shortened here: the script is text)
      const release = "/run/qsp-test-release-lock";
      const holder = hostExec(host, `flock ${HOST_LOCK} sh -c 'until [ -e ${release} ]; do sleep 0.1; done'`);
      await pollUntil(
        "the lock to be held",
        async () => (await hostExec(host, `flock -n ${HOST_LOCK} true`)).code !== 0,
      );
      const script = applyScript(render(all[1]), { kvmRequired: true }).replace(
        `\nLOCK_WAIT_SECONDS='${LOCK_WAIT_SECONDS}'\n`,
        "\nLOCK_WAIT_SECONDS='1'\n",
      );
      const out = await runScript(host, script);
      const report = parseApplyOutput(out.stdout, out.stderr, out.code);
      assert.deepEqual(report.errors.map((e) => e.code), ["host-busy"]);
      assert.deepEqual(report.changed, []);
      await sh(host, `touch ${release}`);
      await holder;
      assertApplied(await apply(host, render(all[1])));
    });

    await t.step("7 removes at once on one host: each stops its units and takes everything of its own", async () => {
      const reloadsBefore = await reloads(host);
      const outs = await Promise.all(all.map((i) => runScript(host, removeScript(i.name, { uid: i.uid }))));
      outs.forEach((out, n) => {
        const report = parseRemoveOutput(out.stdout, out.stderr, out.code);
        assert.ok(report.ok, `${all[n].name}: ${JSON.stringify(report.errors)} ${out.stderr}`);
        assert.deepEqual(report.stopped.sort(), [`${all[n].name}-exporter.service`, `${all[n].name}-runtime.service`]);
      });
      // each awaits its own stops, then waits for the others to owe their reload too (remove.sh join_removes)
      const reloaded = (await reloads(host)) - reloadsBefore;
      console.log(`daemon-reloads for ${all.length} removes at once: ${reloaded}`);
      assert.ok(reloaded >= 1 && reloaded < all.length, `${reloaded} daemon-reloads for ${all.length} removes`);
      assert.equal(await sh(host, "systemctl list-units --all --no-legend 'pool-r[1-7]-*'"), "");
      assert.equal(await sh(host, "podman ps -a --format '{{.Names}}' | grep '^pool-r[1-7]-' || true"), "");
      assert.equal(await sh(host, "podman volume ls -q | grep '^jumpstarter-pool-r[1-7]-' || true"), "");
    });
  } finally {
    await stopLabHosts(net);
  }
});
