/**
 * `doctor` against real lab hosts (test/labhost) and, for its cluster mode, the real API server of the run: a
 * healthy host passes every check, and each fault it is meant to explain is reported with its fix and exit 1.
 */
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { freshNamespace, seedExample, testEnv } from "./env.ts";
import type { LabHost } from "./labhost/labhost.ts";
import { doctorCommand } from "../src/cli/doctor.ts";
import { fingerprint } from "../src/host/known_hosts.ts";
import { KubeClient } from "../src/kube/client.ts";
import { EXPORTER_SETS, SECRETS, VIRTUAL_TARGET_CLASSES } from "../src/kube/resources.ts";
import type { ExporterSet, KubeObject, Secret } from "../src/api/types.ts";

const SEED_HOST = "lab-host-01.example.com";

async function doctor(args: string[], utf8 = true) {
  const lines: string[] = [];
  const io = { out: (t: string) => lines.push(...t.split("\n")), err: (t: string) => lines.push(...t.split("\n")) };
  const code = await doctorCommand(args, io, utf8);
  const text = lines.join("\n");
  /** The check lines of one check, e.g. "host key". */
  const check = (name: string) => lines.filter((l) => new RegExp(`^\\S+ +${name} `).test(l));
  return { code, text, lines, check };
}

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

const direct = (h: LabHost, ...more: string[]) => [
  ...["--host", h.address, "--key", h.privateKeyPath, "--known-hosts", h.knownHostsPath],
  ...more,
];

/** The host key line known_hosts has for a lab host (recorded under its address). */
async function hostKeyLine(h: LabHost): Promise<{ type: string; blob: string }> {
  const text = await Deno.readTextFile(h.knownHostsPath);
  const line = text.split("\n").find((l) => l.startsWith(`${h.address} `));
  assert.ok(line, `no known_hosts line for ${h.address}`);
  const [, type, blob] = line.split(" ");
  return { type, blob };
}

Deno.test({
  name: "doctor: a healthy lab host passes every check, logged in as root and as a user with sudo",
  async fn() {
    const [h] = (await testEnv()).labhosts;
    const r = await doctor(direct(h));
    assert.equal(r.code, 0, r.text);
    const names = ["client key", "tcp", "host key", "login", "rights", "systemd", "podman", "quadlet", "kvm"];
    for (const n of [...names, "image", "disk"]) assert.ok(r.check(n).length, `no "${n}" line:\n${r.text}`);
    const checks = r.lines.filter((l) => /^[✓!✗] /.test(l));
    assert.ok(checks.every((l) => l.startsWith("✓ ")), r.text);
    const { type, blob } = await hostKeyLine(h);
    assert.match(r.check("host key")[0], new RegExp(`matches known_hosts: ${type} ${escape(fingerprint(blob))}$`));
    assert.match(r.check("tcp")[0], /answers: SSH-2\.0-OpenSSH/);
    assert.match(r.check("podman")[0], /podman [5-9]\./);
    assert.match(r.check("quadlet")[0], /generator \//);
    assert.equal(r.check("image").length, 2, "both default images are there");
    assert.equal(r.check("disk").length, 2, "/etc and /var/lib/containers");
    assert.match(
      r.lines.at(-1)!,
      new RegExp(`^verdict: root@${escape(h.address)}:22 is ready for qemu-ssh.jumpstarter.dev`),
    );

    const lab = await doctor(direct(h, "--user", "lab"));
    assert.equal(lab.code, 0, lab.text);
    assert.match(lab.check("rights")[0], /^✓ .*lab runs sh as root with passwordless sudo/);
  },
});

Deno.test({
  name: "doctor: a changed host key is refused with both fingerprints, before logging in",
  async fn() {
    const [h1, h2] = (await testEnv()).labhosts;
    const other = await hostKeyLine(h2);
    const real = await hostKeyLine(h1);
    const dir = await Deno.makeTempDir();
    try {
      // what known_hosts says after h1 was "reinstalled" with h2's key, or when h2 answers on h1's address
      const wrong = `${dir}/known_hosts`;
      await Deno.writeTextFile(wrong, `${h1.address} ${other.type} ${other.blob}\n`);
      const r = await doctor(["--host", h1.address, "--key", h1.privateKeyPath, "--known-hosts", wrong], false);
      assert.equal(r.code, 1, r.text);
      const [line, fix] = r.lines.slice(r.lines.indexOf(r.check("host key")[0]));
      assert.match(line, /^FAIL host key +.*HOST KEY MISMATCH/);
      assert.ok(line.includes(fingerprint(other.blob)), `expected fingerprint missing: ${line}`);
      assert.ok(line.includes(fingerprint(real.blob)), `presented fingerprint missing: ${line}`);
      assert.match(fix, /^ +-> .*known_hosts/);
      assert.deepEqual(r.check("login"), [], "no login on a host whose key does not match");
      assert.match(r.lines.at(-1)!, /NOT ready .*\(host key\)/);

      // not in known_hosts at all: refused, unless --accept-new, which only warns
      await Deno.writeTextFile(wrong, "");
      const unknown = await doctor(["--host", h1.address, "--key", h1.privateKeyPath, "--known-hosts", wrong]);
      assert.equal(unknown.code, 1, unknown.text);
      assert.match(
        unknown.check("host key")[0],
        new RegExp(`^✗ .*${escape(fingerprint(real.blob))} is not in known_hosts`),
      );
      const tofu = await doctor(["--host", h1.address, "--key", h1.privateKeyPath, "--accept-new"]);
      assert.equal(tofu.code, 0, tofu.text);
      assert.match(
        tofu.check("host key")[0],
        new RegExp(`^! .*${real.type} ${escape(fingerprint(real.blob))} is not in`),
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test({
  name: "doctor: a user the host does not know fails at login, with the authorized_keys line to add",
  async fn() {
    const [h] = (await testEnv()).labhosts;
    const r = await doctor(direct(h, "--user", "nosuchuser"));
    assert.equal(r.code, 1, r.text);
    assert.match(r.check("host key")[0], /^✓ /, "the host key is checked before authentication");
    const [line, fix] = r.lines.slice(r.lines.indexOf(r.check("login")[0]));
    assert.match(line, /^✗ login +ssh nosuchuser@.*authentication refused for key SHA256:/);
    assert.match(fix, /→ on the host, add to ~nosuchuser\/\.ssh\/authorized_keys: ssh-ed25519 AAAA/);
    assert.deepEqual(r.check("rights"), [], "nothing is checked past a failed login");
  },
});

Deno.test({
  name: "doctor from the cluster: the seed's class and set through a host alias; the set's image missing under Never " +
    "fails",
  async fn() {
    const env = await testEnv();
    const h = env.labhosts[1];
    const client = await KubeClient.load(env.kubeconfig);
    try {
      const ns = await freshNamespace(client, "doctor");
      const { type, blob } = await hostKeyLine(h);
      const b64 = (s: string) => Buffer.from(s).toString("base64");
      await client.create<Secret>(SECRETS, {
        metadata: { name: "lab-ssh-key", namespace: ns },
        type: "kubernetes.io/ssh-auth",
        data: {
          "ssh-privatekey": b64(await Deno.readTextFile(h.privateKeyPath)),
          // host keys are checked under the class's host name, whatever address the alias leads to
          known_hosts: b64(`${SEED_HOST} ${type} ${blob}\n`),
        },
      });
      await client.create(VIRTUAL_TARGET_CLASSES, await seedExample("virtualtargetclass.yaml", ns));
      const set = await seedExample("exporterset.yaml", ns) as ExporterSet;
      await client.create(EXPORTER_SETS, set as KubeObject);
      const base = ["--kubeconfig", env.kubeconfig, "--namespace", ns, "--host-alias", `${SEED_HOST}=${h.address}`];
      const r = await doctor([...base, "--class", "qemu-ssh-aarch64", "--set", "aarch64-ssh-pool"]);
      assert.equal(r.code, 0, r.text);
      assert.ok(r.lines.filter((l) => /^[✓!✗] /.test(l)).every((l) => l.startsWith("✓ ")), r.text);
      assert.match(r.check("credentials")[0], /Secret .*\/lab-ssh-key: ssh-ed25519 SHA256:.*hostKeyPolicy Strict/);
      assert.match(r.check("kvm")[0], /^✓ .*\/dev\/kvm present/);
      assert.match(
        r.lines.at(-1)!,
        new RegExp(`root@${escape(SEED_HOST)}:22 \\(via ${escape(h.address)}\\) is ready`),
      );

      const absent = "quay.io/jumpstarter-dev/virtual/qemu-runtime:not-on-this-host";
      await client.mergePatch(EXPORTER_SETS, ns, "aarch64-ssh-pool", {
        spec: { images: { runtime: { image: absent, imagePullPolicy: "Never" } } },
      });
      // the set names its class
      const missing = await doctor([...base, "--set", "aarch64-ssh-pool"]);
      assert.equal(missing.code, 1, missing.text);
      const images = missing.check("image");
      assert.match(images[0], /^✓ .*jumpstarter:latest present/);
      assert.match(images[1], new RegExp(`^✗ .*${escape(absent)} missing, and imagePullPolicy is Never`));
      assert.match(missing.lines.at(-1)!, /NOT ready .*1 check\(s\) failed \(image\)/);
      const classOnly = await doctor([...base, "--class", "qemu-ssh-aarch64"]);
      assert.equal(classOnly.code, 0, `the class alone uses the default images:\n${classOnly.text}`);
      assert.match(classOnly.check("cluster")[0], /VirtualTargetClass [^,]*\/qemu-ssh-aarch64 from /);
    } finally {
      client.close();
    }
  },
});

Deno.test("doctor: usage errors exit 2 with the usage and no stack trace; --help exits 0", async () => {
  const cases = [
    [],
    ["--host", "h1"],
    ["--host", "h1", "--key", "k", "--class", "c"],
    ["--host", "h1", "--key", "k", "--namespace", "ns"],
    ["--host", "h1", "--key", "k", "--known-hosts", "kh", "--accept-new"],
    ["--host", "h1", "--key", "k", "--port", "0"],
    ["--class", "c"],
    ["--class", "c", "--namespace", "ns", "--key", "k"],
    ["--class", "c", "--namespace", "ns", "--host-alias", "h1"],
    ["--bogus"],
  ];
  for (const args of cases) {
    const r = await doctor(args);
    assert.equal(r.code, 2, `${args}: ${r.text}`);
    assert.match(r.text, /^error: .*\n\nusage: qemu-ssh-provisioner doctor /, `${args}`);
    assert.doesNotMatch(r.text, /\n +at /);
  }
  const help = await doctor(["--help"]);
  assert.equal(help.code, 0);
  assert.match(help.text, /^usage: qemu-ssh-provisioner doctor --host HOST/);
});
