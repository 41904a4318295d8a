/**
 * Proves the lab host harness gives the controller what it needs: strict-host-key sshd, podman with quadlet,
 * /dev/kvm, and stand-in images that a hand-written runtime/exporter quadlet pair can run side by side.
 * Needs root (network namespaces, bridge, systemd-nspawn); it is skipped otherwise.
 */
import { privateLabNet } from "../env.ts";
import assert from "node:assert/strict";
import { type ExecResult, hostExec, type LabHost, type LabNet, startLabHosts, stopLabHosts } from "./labhost.ts";

const net: LabNet = await privateLabNet(1);
const isRoot = Deno.uid() === 0;

async function sh(host: LabHost, command: string): Promise<string> {
  const r = await hostExec(host, command);
  assert.equal(r.code, 0, `on ${host.name}: ${command}\nexit ${r.code}\n${r.stderr}${r.stdout}`);
  return r.stdout;
}

async function pollUntil(what: string, probe: () => Promise<boolean>, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await probe())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 300));
  }
}

function exporterConfig(name: string): string {
  return `apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata: {namespace: jumpstarter, name: ${name}}
endpoint: grpc.jumpstarter.example:443
token: eyJ.test-secret-${name}
tls: {ca: "", insecure: false}
exitOnLeaseEnd: true
export:
  qemu:
    type: jumpstarter_driver_qemu.driver.Qemu
    config:
      arch: aarch64
      smp: 4
      mem: 4G
      disk_size: 16G
      launcher_socket: /shared/launcher.sock
      hostfwd: {ssh: {protocol: tcp, hostaddr: 127.0.0.1, hostport: 2222, guestport: 22}}
  tcp: {type: jumpstarter_driver_network.driver.TcpNetwork, config: {host: 127.0.0.1, port: 2222}}
`;
}

/** The quadlet files for one instance, as the controller is expected to write them. */
function quadlets(n: string): Record<string, string> {
  return {
    [`/etc/jumpstarter/exporters/${n}.yaml`]: exporterConfig(n),
    [`/etc/containers/systemd/${n}-shared.volume`]: `[Volume]
VolumeName=${n}-shared
`,
    // upstream main's /disk: the exporter (65532) flashes into it, the runtime reads from it
    [`/etc/containers/systemd/${n}-disk.volume`]: `[Volume]
VolumeName=${n}-disk
User=65532
Group=65532
`,
    // its own network namespace on podman's default bridge: every runtime can listen on 127.0.0.1:2222; upstream's
    // contract: run as root, with the launcher staged from the exporter image first
    [`/etc/containers/systemd/${n}-runtime.container`]: `[Unit]
Description=${n} QEMU runtime
[Container]
Image=quay.io/jumpstarter-dev/virtual/qemu-runtime:latest
ContainerName=${n}-runtime
Network=bridge
AddDevice=/dev/kvm
Volume=${n}-shared.volume:/shared
Volume=${n}-disk.volume:/disk
User=0
[Service]
ExecStartPre=podman run --rm --user 0 --entrypoint cp -v ${n}-shared:/shared quay.io/jumpstarter-dev/jumpstarter:latest \\
  /jumpstarter/bin/jumpstarter-exec /shared/jumpstarter-exec
Restart=on-failure
`,
    // Network=<unit>.container becomes --network container:<n>-runtime plus Requires=/After= on its service
    [`/etc/containers/systemd/${n}-exporter.container`]: `[Unit]
Description=${n} exporter
[Container]
Image=quay.io/jumpstarter-dev/jumpstarter:latest
ContainerName=${n}-exporter
Network=${n}-runtime.container
AddDevice=/dev/kvm
Volume=${n}-shared.volume:/shared
Volume=${n}-disk.volume:/disk
Volume=/etc/jumpstarter/exporters/${n}.yaml:/etc/jumpstarter/exporters/${n}.yaml:ro
User=65532
Exec=jmp run --exporter-config /etc/jumpstarter/exporters/${n}.yaml
[Service]
Restart=on-failure
`,
  };
}

function writeFilesCommand(files: Record<string, string>): string {
  return Object.entries(files).map(([path, body]) => `cat > ${path} <<'QSP_EOF'\n${body}QSP_EOF\n`).join("");
}

async function journal(host: LabHost, unit: string): Promise<string> {
  return await sh(host, `journalctl -u ${unit} -o cat --no-pager`);
}

const ms = (d: number) => `${Math.round(d)} ms`;

function versionAtLeast(v: string, min: [number, number]): boolean {
  const m = v.match(/(\d+)\.(\d+)/);
  assert.ok(m, `no version in ${JSON.stringify(v)}`);
  const [maj, minor] = [Number(m[1]), Number(m[2])];
  return maj > min[0] || (maj === min[0] && minor >= min[1]);
}

Deno.test({
  name: "labhost: two hosts with sshd, podman quadlet, /dev/kvm and stand-in images",
  ignore: !isRoot,
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const t0 = performance.now();
  try {
    const hosts = await startLabHosts(net, 2);
    console.log(`booted ${hosts.length} hosts in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
    const [h1, h2] = hosts;

    await t.step("sshd answers with strict host key checking, hosts are distinct", async () => {
      for (const h of hosts) assert.equal((await sh(h, "hostname")).trim(), h.name);
      assert.notEqual(h1.address, h2.address);
      const ips = await Promise.all(hosts.map((h) => sh(h, "ip -4 -o addr show dev eth0")));
      hosts.forEach((h, i) => assert.match(ips[i], new RegExp(`inet ${h.address.replaceAll(".", "\\.")}/24`)));
      // the check must be real: a host key that does not match is refused
      const wrong: LabHost = { ...h1, address: h2.address, knownHostsPath: "/dev/null" };
      const r: ExecResult = await hostExec(wrong, "true");
      assert.notEqual(r.code, 0);
      assert.match(r.stderr, /Host key verification failed|No .* host key is known/);
    });

    await t.step("podman >= 5.3 with quadlet, /dev/kvm and stand-in images", async () => {
      for (const h of hosts) {
        const v = await sh(h, "podman --version");
        assert.ok(versionAtLeast(v, [5, 3]), v);
        await sh(h, "test -x /usr/lib/systemd/system-generators/podman-system-generator");
        // its own node, as Debian ships it; a chmod there must not reach the outer machine's
        const outer = Deno.statSync("/dev/kvm").mode;
        assert.equal(await sh(h, "stat -c '%t:%T %a %U:%G' /dev/kvm && chmod 0606 /dev/kvm"), "a:e8 660 root:kvm\n");
        assert.equal(Deno.statSync("/dev/kvm").mode, outer, "the outer machine's /dev/kvm is untouched");
        await sh(h, "chmod 0660 /dev/kvm");
        const images = await sh(h, "podman images --format '{{.Repository}}:{{.Tag}}'");
        assert.match(images, /quay\.io\/jumpstarter-dev\/virtual\/qemu-runtime:latest/);
        assert.match(images, /quay\.io\/jumpstarter-dev\/jumpstarter:latest/);
      }
    });

    await t.step("two runtime/exporter quadlet pairs on one host share netns, volume and /dev/kvm", async () => {
      const names = ["qsp-a", "qsp-b"];
      const files = Object.assign({}, ...names.map(quadlets));
      await sh(h1, `mkdir -p /etc/jumpstarter/exporters && ${writeFilesCommand(files)}`);
      const tDeploy = performance.now();
      await sh(h1, `systemctl daemon-reload && systemctl start ${names.map((n) => `${n}-exporter`).join(" ")}`);
      const tStarted = performance.now();

      for (const n of names) {
        await pollUntil(`${n} exporter findings`, async () => {
          return /launcher=ok tcp=ok kvm=present/.test(await journal(h1, `${n}-exporter`));
        });
        const log = await journal(h1, `${n}-exporter`);
        assert.match(
          log,
          new RegExp(
            `standin-exporter: name=jumpstarter/${n} endpoint=grpc\\.jumpstarter\\.example:443 ` +
              "launcher=ok tcp=ok kvm=present exitOnLeaseEnd=true token=<set> disk=ok",
          ),
        );
        assert.ok(!log.includes("test-secret"), "the token must never be logged");
        assert.match(await journal(h1, `${n}-runtime`), /jumpstarter-exec: ssh connection from 127\.0\.0\.1/);
      }
      console.log(
        `daemon-reload+start ${ms(tStarted - tDeploy)}, both exporters reporting ${ms(performance.now() - tDeploy)}`,
      );
      const pairs = names.flatMap((n) => [`${n}-runtime`, `${n}-exporter`]);
      const active = await sh(h1, `systemctl is-active ${pairs.join(" ")}`);
      assert.deepEqual(active.trim().split("\n"), ["active", "active", "active", "active"]);
      // the exporter really is inside the runtime's namespace, and each runtime has its own
      const nsOf = (c: string) => sh(h1, `readlink /proc/$(podman inspect -f '{{.State.Pid}}' ${c})/ns/net`);
      assert.equal(await nsOf("qsp-a-exporter"), await nsOf("qsp-a-runtime"));
      assert.notEqual(await nsOf("qsp-a-runtime"), await nsOf("qsp-b-runtime"));

      await sh(h1, "podman kill --signal HUP qsp-a-exporter");
      await pollUntil("exporter reload", async () => {
        const log = await journal(h1, "qsp-a-exporter");
        const after = log.slice(log.indexOf("standin-exporter: SIGHUP, reloaded"));
        return log.includes("SIGHUP, reloaded") && /launcher=ok tcp=ok kvm=present/.test(after);
      });

      const units = names.flatMap((n) => [`${n}-exporter`, `${n}-runtime`, `${n}-shared-volume`, `${n}-disk-volume`])
        .join(" ");
      const tStop = performance.now();
      await sh(h1, `systemctl stop ${units}`);
      console.log(`stop ${ms(performance.now() - tStop)}`);
      assert.match(await journal(h1, "qsp-a-exporter"), /standin-exporter: SIGTERM, exiting/);
      assert.match(await journal(h1, "qsp-a-runtime"), /jumpstarter-exec: SIGTERM, exiting/);
      await sh(
        h1,
        `rm -f ${Object.keys(files).join(" ")} && systemctl daemon-reload && ` +
          `podman volume rm ${names.flatMap((n) => [`${n}-shared`, `${n}-disk`]).join(" ")}`,
      );
      assert.equal((await sh(h1, "podman ps -a --format '{{.Names}}'")).trim(), "");
      assert.equal((await sh(h1, "podman volume ls -q")).trim(), "");
      assert.equal((await sh(h1, "systemctl list-units --all --no-legend 'qsp-*'")).trim(), "");
      assert.equal((await sh(h1, "systemctl show -p NFailedUnits --value")).trim(), "0");
    });
  } finally {
    await stopLabHosts(net);
    console.log(`test took ${((performance.now() - t0) / 1000).toFixed(1)} s including teardown`);
  }
  // nothing of this set may be left on the outer machine
  const left = new TextDecoder().decode(
    (await new Deno.Command("ip", { args: ["-br", "link", "show", net.bridge], stderr: "null" }).output()).stdout,
  );
  assert.equal(left.trim(), "");
  await assert.rejects(Deno.stat(`${net.dir}/hosts/h1`));
});
