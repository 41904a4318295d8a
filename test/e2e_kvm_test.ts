/**
 * KVM that QEMU really uses. An x86_64 class with `runtime.kvm: true`, deployed by our controller onto a lab host whose
 * /dev/kvm is its own `0660 root:kvm` node (as Debian and Ubuntu ship it), runs the real 0.9.0 exporter, which runs
 * QEMU in its own container as uid 65532; leased with `jmp shell`, the guest boots to its console marker, and QEMU
 * itself shows KVM: it was started with `-accel kvm` and holds /dev/kvm open. Then the same instance without the
 * group the apply gave it (PodmanArgs=--group-add, taken out of its quadlet by hand) boots under TCG, so the check
 * can fail. The boot-to-marker times of both are printed.
 */
import { builtPath } from "./built.ts";
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { privateLabNet, testEnv, waitFor } from "./env.ts";
import { ourController, sh } from "./e2e_world.ts";
import { readClusterId } from "../src/run.ts";
import { type LabHost, startLabHosts, stopLabHosts } from "./labhost/labhost.ts";
import { type RealJumpstarter, startRealJumpstarter } from "./jumpstarter/controller.ts";
import { KubeClient } from "../src/kube/client.ts";
import { EXPORTER_SETS, EXPORTERS, SECRETS, VIRTUAL_TARGET_CLASSES } from "../src/kube/resources.ts";
import type { Exporter, KubeObject } from "../src/api/types.ts";
import { PROVISIONER } from "../src/api/types.ts";

const NS = "kvm-proof";
const HOST = "kvm-host.example.com";
const SET = "x86-kvm";
const EXPORTER_IMAGE = "quay.io/jumpstarter-dev/jumpstarter:latest";
const ROOT = new URL("../", import.meta.url).pathname;
const secs = (t0: number) => `${((performance.now() - t0) / 1000).toFixed(1)} s`;

/**
 * Why this machine cannot show KVM, or undefined when it can: a real KVM_CREATE_VM ioctl on its /dev/kvm, as root
 * (the lab host's own node has the same numbers, so it opens this device).
 */
function noKvmHere(): string | undefined {
  if (Deno.build.arch !== "x86_64") return `the guest is x86_64 and this machine is ${Deno.build.arch}`;
  if (Deno.uid() !== 0) return "the lab hosts need root";
  const py = 'import fcntl, os; fd = os.open("/dev/kvm", os.O_RDWR); print(fcntl.ioctl(fd, 0xAE01, 0))';
  try {
    const out = new Deno.Command("python3", { args: ["-c", py], stdout: "null", stderr: "piped" }).outputSync();
    if (out.success) return undefined;
    const why = new TextDecoder().decode(out.stderr).trim().split("\n").pop();
    return `no usable /dev/kvm on this machine: KVM_CREATE_VM failed (${why})`;
  } catch (e) {
    return `cannot check /dev/kvm with python3: ${e instanceof Error ? e.message : e}`;
  }
}
const NO_KVM = noKvmHere();
if (NO_KVM) console.error(`e2e_kvm_test: ignored: ${NO_KVM}`);

async function run(cmd: string, args: string[]) {
  const out = await new Deno.Command(cmd, { args, stdin: "null", stdout: "piped", stderr: "piped" }).output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 0, `${cmd} ${args.join(" ")}: exit ${out.code}\n${text}`);
  return text;
}

/** What the QEMU process on the host shows about KVM, read from /proc while the guest runs. */
interface QemuKvm {
  accel: boolean;
  /** Open fds on /dev/kvm and on a KVM VM (anon_inode:kvm-vm). */
  kvmFds: number;
  groups: string;
}

async function qemuKvm(host: LabHost): Promise<QemuKvm> {
  const out = await sh(
    host,
    "p=$(pgrep -o -f '^qemu-system-x86_64 '); [ -n \"$p\" ] || { echo 'no qemu'; exit 1; }; " +
      // the device, and the VM that KVM_CREATE_VM made on it
      `tr '\\0' ' ' </proc/$p/cmdline; echo; ls -l /proc/$p/fd | grep -c -e '/kvm$' -e 'anon_inode:kvm-vm$' || true; ` +
      "sed -n 's/^Groups:\\t*//p' /proc/$p/status",
  );
  const [cmdline, fds, groups] = out.split("\n");
  return { accel: / -accel kvm /.test(cmdline), kvmFds: Number(fds), groups: groups.trim() };
}

/**
 * Leases the set's exporter with `jmp shell`, flashes the marker disk and powers on; once the marker is on the
 * console, reads QEMU's KVM state on the host, then powers off. Returns the seconds from power-on to the marker.
 */
async function bootToMarker(
  jmp: string,
  clientConfig: string,
  dir: string,
  host: LabHost,
  waitSeconds: number,
): Promise<{ seconds?: number; powerOn: number; qemu: QemuKvm }> {
  const marker = `QSP-KVM-${crypto.randomUUID().slice(0, 8)}`;
  await run("bash", [`${ROOT}test/jumpstarter/marker-image.sh`, `${dir}/marker.img`, marker, "bios"]);
  const proceed = `${dir}/proceed-${marker}`;
  const child = new Deno.Command(jmp, {
    args: [
      ...["shell", "--client-config", clientConfig, "-l", `board=${SET}`, "--"],
      ...[jmp.replace(/jmp$/, "python"), `${dir}/lease.py`, `${dir}/marker.img`, marker, proceed, `${waitSeconds}`],
    ],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const stderr = new Response(child.stderr).text();
  let out = "";
  let found: { seconds?: number; powerOn: number; qemu: QemuKvm } | undefined;
  const seen = new RegExp(
    `^(?:marker ${marker} on the console ([0-9.]+) s after power on #([12])|no marker ${marker} .*)$`,
    "m",
  );
  try {
    for await (const chunk of child.stdout.pipeThrough(new TextDecoderStream())) {
      out += chunk;
      const m = seen.exec(out);
      if (m && !found) {
        found = {
          seconds: m[1] === undefined ? undefined : Number(m[1]),
          powerOn: Number(m[2] ?? 2),
          qemu: await qemuKvm(host),
        };
        await Deno.writeTextFile(proceed, "");
      }
    }
  } finally {
    await Deno.writeTextFile(proceed, "").catch(() => {});
  }
  const status = await child.status;
  assert.ok(status.success && found, `jmp shell: exit ${status.code}\n${out}\n${await stderr}`);
  return found;
}

/**
 * Runs inside `jmp shell`: flash, power on, wait up to WAIT seconds for the marker on the console, say what came, then
 * wait for PROCEED (the test reading QEMU on the host) before powering off. A boot with no marker is power-cycled once:
 * this machine's nested KVM (PVM under Firecracker) once left SeaBIOS wedged for 120 s in a CI run, where it boots in
 * 5 s otherwise (and in the firmware probe just before); what the provisioner owns (the group, /dev/kvm open, -accel
 * kvm) is asserted on whichever boot comes to the marker.
 */
const LEASE_SCRIPT = `import os, sys, time
import pexpect
from jumpstarter.utils.env import env
image, marker, proceed, wait = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
with env() as client:
    client.qemu.flasher.flash(image)
    for attempt in (1, 2):
        t0 = time.monotonic()
        client.qemu.power.on()
        with client.qemu.console.pexpect() as p:
            try:
                p.expect(marker, timeout=wait)
                print(f"marker {marker} on the console {time.monotonic() - t0:.2f} s after power on #{attempt}", flush=True)
                break
            except pexpect.TIMEOUT:
                if attempt == 2:
                    print(f"no marker {marker} within {wait:.0f} s, twice", flush=True)
                else:
                    print(f"power cycled: nothing on the console within {wait:.0f} s", flush=True)
        if attempt == 1:
            client.qemu.power.off()
    while not os.path.exists(proceed):
        time.sleep(0.1)
    client.qemu.power.off()
`;

/**
 * The CPU model the template names: QEMU 10's `-cpu host` (the driver's default under KVM) aborts where the host
 * refuses IA32_ARCH_CAPABILITIES ("failed to set MSR 0x10a"), as this machine's nested KVM does; `max` without it
 * runs under KVM and TCG alike.
 */
const CPU = "max,-arch-capabilities";

/**
 * Whether this machine's KVM runs x86 firmware at all: the image's QEMU, as root on the lab host, under KVM with the
 * marker disk, for up to 20 s. KVM_CREATE_VM alone says too little: under some nested KVM SeaBIOS hangs at its first
 * switch back to 16-bit mode, and no guest gets anywhere.
 */
async function firmwareRunsUnderKvm(host: LabHost, dir: string): Promise<boolean> {
  const marker = "QSP-KVM-PROBE";
  await run("bash", [`${ROOT}test/jumpstarter/marker-image.sh`, `${dir}/probe.img`, marker, "bios"]);
  const gz = await new Response(
    (await Deno.open(`${dir}/probe.img`)).readable.pipeThrough(new CompressionStream("gzip")),
  ).arrayBuffer();
  const out = await sh(
    host,
    `mkdir -p /root/kvm-probe && echo ${Buffer.from(gz).toString("base64")} | base64 -d | gunzip ` +
      ">/root/kvm-probe/probe.img && rm -f /root/kvm-probe/serial && " +
      `(timeout 20 podman run --rm --replace --name qsp-kvm-probe --user 0 --device /dev/kvm -v /root/kvm-probe:/p --entrypoint qemu-system-x86_64 ` +
      `${EXPORTER_IMAGE} -nodefaults -display none -accel kvm -machine q35 -cpu ${CPU} -m 256M -serial file:/p/serial ` +
      "-blockdev driver=raw,node-name=d,file.driver=file,file.filename=/p/probe.img -device virtio-blk-pci,drive=d " +
      ">/dev/null 2>&1 &) ; i=0; while [ $i -lt 100 ] && ! grep -q " + marker +
      " /root/kvm-probe/serial 2>/dev/null; " +
      "do sleep 0.2; i=$((i + 1)); done; podman rm -f -t 0 qsp-kvm-probe >/dev/null 2>&1; " +
      "grep -c " + marker + " /root/kvm-probe/serial || true",
  );
  return Number(out.trim()) > 0;
}

const online = (e: Exporter | undefined) =>
  e?.status?.conditions?.some((c) => c.type === "Online" && c.status === "True") ?? false;

/** The set's one exporter, once the real controller has heard from it since `since` (ms; lastSeen every 10 s). */
async function onlineSince(client: KubeClient, since: number, what: string): Promise<Exporter> {
  return await waitFor(async () => {
    const es = (await client.list<Exporter>(EXPORTERS, NS)).items.filter((e) => !e.metadata.deletionTimestamp);
    const e = es.length === 1 ? es[0] : undefined;
    return online(e) && Date.parse(e!.status?.lastSeen ?? "") > since ? e : undefined;
  }, { what, timeoutMs: 180_000 });
}

Deno.test({
  name: "KVM: an x86_64 class boots its guest under KVM through the real exporter, and under TCG without the group",
  ignore: NO_KVM !== undefined,
  sanitizeOps: false,
  sanitizeResources: false,
}, async (t) => {
  const env = await testEnv();
  const t0 = performance.now();
  const [image, jmp, dir] = await Promise.all([
    builtPath(`${ROOT}test/jumpstarter/image.sh`),
    builtPath(`${ROOT}test/jumpstarter/jmp.sh`),
    Deno.makeTempDir({ prefix: "qsp-kvm-" }),
  ]);
  console.log(`  images and client ready after ${secs(t0)}`);
  const net = { ...await privateLabNet(7), images: [{ tarball: image, tag: EXPORTER_IMAGE }], kvmMode: "0660" };
  const client = await KubeClient.load(env.kubeconfig);
  let js: RealJumpstarter | undefined;
  let ours: ReturnType<typeof ourController> | undefined;
  try {
    const [host] = await startLabHosts(net, 1);
    js = await startRealJumpstarter({
      kubeconfig: env.kubeconfig,
      namespace: NS,
      bridgeAddress: `${net.subnet}.1`,
      dir: `${dir}/jumpstarter`,
    });
    ours = ourController(client, NS, { [HOST]: host.address }, {
      resyncMs: 10_000,
      clusterId: await readClusterId(client, undefined),
    });
    await ours.controller.start();
    const kvmGid = (await sh(host, "stat -c '%a %g' /dev/kvm")).trim().split(" ");
    assert.equal(kvmGid[0], "660", "the lab host's /dev/kvm is 0660 root:kvm, as Debian ships it");
    const gid = kvmGid[1];

    const key = await Deno.readTextFile(host.privateKeyPath);
    await client.create(SECRETS, {
      metadata: { name: "lab-ssh-key", namespace: NS },
      type: "Opaque",
      data: { "ssh-privatekey": Buffer.from(key).toString("base64") },
    } as KubeObject);
    await client.create(VIRTUAL_TARGET_CLASSES, {
      apiVersion: "virtualtarget.jumpstarter.dev/v1alpha1",
      kind: "VirtualTargetClass",
      metadata: { name: "qemu-ssh-x86", namespace: NS },
      spec: {
        provisioner: PROVISIONER,
        credentialsSecretRef: { name: "lab-ssh-key" },
        parameters: {
          ssh: { user: "root", port: 22 },
          host: { name: HOST },
          runtime: { kvm: true },
          arch: "x86_64",
          // small: the driver wants disk_size free on the host for the (sparse) disk
          resources: { cpu: 1, memory: "256Mi" },
          storage: { size: "64Mi" },
        },
      },
    } as KubeObject);
    await client.create(EXPORTER_SETS, {
      apiVersion: "virtualtarget.jumpstarter.dev/v1alpha1",
      kind: "ExporterSet",
      metadata: { name: SET, namespace: NS },
      spec: {
        minReplicas: 1,
        maxReplicas: 1,
        minAvailableReplicas: 1,
        // the same instance is leased twice: with the group and without it
        recycleStrategy: "InPlaceReuse",
        virtualTargetClassName: "qemu-ssh-x86",
        selector: { matchLabels: { board: SET } },
        template: {
          metadata: { labels: { board: SET } },
          spec: { drivers: [{ name: "qemu", type: "jumpstarter_driver_qemu.driver.Qemu", config: { cpu: CPU } }] },
        },
      },
    } as KubeObject);
    const exporter = await onlineSince(client, 0, "the x86_64 exporter Online");
    const name = exporter.metadata.name!;
    const quadlet = `/etc/containers/systemd/${name}-exporter.container`;
    assert.match(await sh(host, `cat ${quadlet}`), new RegExp(`^PodmanArgs=--group-add ${gid}$`, "m"));

    const clientConfig = `${dir}/client.yaml`;
    await run(jmp, [
      ...["admin", "create", "client", "qsp-kvm", "-n", NS, "--unsafe", "--out", clientConfig, "--nointeractive"],
      ...["--kubeconfig", env.kubeconfig],
    ]);
    await Deno.writeTextFile(`${dir}/lease.py`, LEASE_SCRIPT);

    const firmware = await firmwareRunsUnderKvm(host, dir);
    if (!firmware) {
      console.log("  this machine's KVM does not run x86 firmware (SeaBIOS hangs under it): no marker under KVM");
    }
    let kvmSeconds: number | undefined;
    await t.step("with the kvm group: QEMU runs the guest with -accel kvm and holds /dev/kvm open", async () => {
      const { seconds, powerOn, qemu } = await bootToMarker(jmp, clientConfig, dir, host, firmware ? 60 : 15);
      kvmSeconds = seconds;
      console.log(
        `  KVM: ${seconds === undefined ? "no marker" : `boot to the marker ${seconds.toFixed(2)} s after power on`}` +
          ` #${powerOn} (QEMU groups: ${qemu.groups}, kvm fds: ${qemu.kvmFds})`,
      );
      assert.ok(qemu.groups.split(" ").includes(gid), `QEMU holds the kvm gid ${gid}: ${qemu.groups}`);
      assert.ok(qemu.accel, "the driver chose -accel kvm");
      assert.ok(qemu.kvmFds > 0, "QEMU holds /dev/kvm open");
    });
    await t.step({
      name: "the guest reaches its console marker under KVM",
      ignore: !firmware,
      fn: () => assert.notEqual(kvmSeconds, undefined, "the marker came on the console under KVM"),
    });

    await t.step("without the group (taken out of the quadlet by hand): the same class falls back to TCG", async () => {
      // our controller would put the group back (drift): it stops first
      await ours!.controller.stop();
      const restarted = Date.now();
      await sh(
        host,
        `sed -i '/^PodmanArgs=--group-add /d' ${quadlet} && systemctl daemon-reload && ` +
          `systemctl restart ${name}-exporter.service`,
      );
      await onlineSince(client, restarted + 1_000, "the exporter Online again without the group");
      const { seconds, powerOn, qemu } = await bootToMarker(jmp, clientConfig, dir, host, 60);
      assert.ok(seconds !== undefined, "the marker came on the console under TCG");
      const kvm = kvmSeconds === undefined ? "not shown here" : `${kvmSeconds.toFixed(2)} s`;
      console.log(`  TCG: boot to the marker ${seconds.toFixed(2)} s after power on #${powerOn} (KVM: ${kvm})`);
      assert.ok(!qemu.groups.split(" ").includes(gid), qemu.groups);
      assert.ok(!qemu.accel, "no -accel kvm: the driver's os.access check failed");
      assert.equal(qemu.kvmFds, 0, "QEMU does not hold /dev/kvm");
    });
  } finally {
    await ours?.controller.stop();
    await ours?.pool.close();
    await js?.stop();
    await cleanNamespace(client);
    client.close();
    await stopLabHosts(net);
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});

/** The objects go, finalizers dropped (our controller is stopped), so a later run starts from nothing. */
async function cleanNamespace(client: KubeClient): Promise<void> {
  await client.delete(EXPORTER_SETS, NS, SET).catch(() => {});
  for (const e of (await client.list<Exporter>(EXPORTERS, NS).catch(() => ({ items: [] as Exporter[] }))).items) {
    await client.mergePatch(EXPORTERS, NS, e.metadata.name!, { metadata: { finalizers: null } }).catch(() => {});
    await client.delete(EXPORTERS, NS, e.metadata.name!).catch(() => {});
  }
  await client.delete(VIRTUAL_TARGET_CLASSES, NS, "qemu-ssh-x86").catch(() => {});
  await client.delete(SECRETS, NS, "lab-ssh-key").catch(() => {});
}
