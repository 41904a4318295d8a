/**
 * `doctor` against real lab hosts (test/labhost) and, for its cluster mode, the real API server of the run: a
 * healthy host passes every check, and each fault it is meant to explain is reported with its fix and exit 1.
 */
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { freshNamespace, seedExample, testEnv, waitFor } from "./env.ts";
import { hostExec, type LabHost } from "./labhost/labhost.ts";
import { doctorCommand, type DoctorJson } from "../src/cli/doctor.ts";
import {
  applySeed,
  cond,
  directTarget,
  events,
  exporters,
  getSet,
  hostHas,
  sh,
  waitReady,
  world,
} from "./e2e_world.ts";
import { SshPool } from "../src/host/ssh.ts";
import { applyForFacts, LabHosts } from "../src/host/lab.ts";
import { renderInstance } from "../src/host/render.ts";
import { seedInstance } from "./fixtures.ts";
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
    assert.equal(r.check("disk").length, 3, "/etc, /var/lib/containers and where the /disk images live");
    assert.match(r.check("disk")[2], /\/var\/lib\/qemu-ssh\.jumpstarter\.dev\/disks: [0-9.]+ GiB free/);
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
      assert.match(r.check("kvm")[0], /^✓ .*\/dev\/kvm present \(mode 0660, gid [1-9][0-9]*\): its group is added/);
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

Deno.test({
  name: "doctor -o json: one object with the host, ready, and each check's name, status, detail and fix",
  async fn() {
    const [h] = (await testEnv()).labhosts;
    const ok = await doctor(direct(h, "-o", "json"));
    assert.equal(ok.code, 0, ok.text);
    const report = JSON.parse(ok.text) as DoctorJson;
    assert.equal(report.host, `root@${h.address}:22`);
    assert.equal(report.ready, true);
    const names = report.checks.map((c) => c.name);
    for (const n of ["client key", "tcp", "host key", "login", "rights", "systemd", "podman", "quadlet", "kvm"]) {
      assert.ok(names.includes(n), `no "${n}" check: ${names}`);
    }
    for (const c of report.checks) {
      assert.deepEqual(Object.keys(c), ["name", "status", "detail", "fix"]);
      assert.equal(c.status, "ok", JSON.stringify(c));
      assert.deepEqual(c.fix, []);
    }
    assert.match(report.checks.find((c) => c.name === "podman")!.detail, /^podman [5-9]\./);

    const bad = await doctor(direct(h, "--user", "nosuchuser", "--output", "json"));
    assert.equal(bad.code, 1, bad.text);
    const failed = JSON.parse(bad.text) as DoctorJson;
    assert.equal(failed.ready, false);
    const login = failed.checks.find((c) => c.name === "login")!;
    assert.equal(login.status, "fail");
    assert.match(login.detail, /authentication refused/);
    assert.equal(login.fix.length, 1);
    assert.match(login.fix[0], /^on the host, add to ~nosuchuser\/\.ssh\/authorized_keys: ssh-ed25519 AAAA/);
  },
});

// ---------------------------------------------------------------- Podman versions around the floor, faked

/**
 * A stand-in `podman` in /usr/local/bin, first in the PATH of both the SSH session and the host scripts, that claims
 * VERSION and passes everything else to the real one: a Podman 5.4 lab host that says it is older.
 */
async function fakePodmanVersion(h: LabHost, version: string): Promise<void> {
  const wrapper = [
    "#!/bin/sh",
    "# test double (test/doctor_test.ts): claims an old podman version",
    `case "$1" in --version | -v) echo "podman version ${version}"; exit 0 ;; esac`,
    'exec /usr/bin/podman "$@"',
    "",
  ].join("\n");
  await sh(h, `echo ${btoa(wrapper)} | base64 -d >/usr/local/bin/podman && chmod 755 /usr/local/bin/podman`);
  assert.equal((await sh(h, "podman --version")).trim(), `podman version ${version}`);
}
const realPodman = (h: LabHost) => sh(h, "rm -f /usr/local/bin/podman");

Deno.test({
  name: "Podman floor, faked versions (a wrapper first in PATH): doctor and deploy agree on 4.3 vs 4.4+",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const [h] = (await testEnv()).labhosts;
    const name = "podman-floor-x1";
    const inst = seedInstance({ name, uid: crypto.randomUUID(), namespace: "podman-floor" });
    const rtQuadlet = `/etc/containers/systemd/${name}-runtime.container`;
    const pool = new SshPool({});
    const target = await directTarget(h);
    const table: string[] = [];
    try {
      // a file a person made where the apply would write: past the version check, the apply stops at the
      // ownership step (not-owned), so no version gets an instance deployed
      await sh(h, `echo '# made by hand' >${rtQuadlet}`);
      for (
        const [version, refused] of [
          ["3.4.4", true],
          ["4.3.1", true],
          ["4.4.1", false],
          ["4.9.3", false],
          ["5.2.5", false],
          ["5.3.0-rc1", false],
          ["5.3.0", false],
          ["5.4.2", false],
          ["6.0.0", false],
        ] as const
      ) {
        await fakePodmanVersion(h, version);
        const opts = { kvmRequired: false, keepExited: false };
        const { outcome: apply } = await applyForFacts(
          new LabHosts(pool),
          target,
          (f) => renderInstance(inst, f),
          undefined,
          opts,
        );
        const d = await doctor(direct(h));
        const podmanLine = d.check("podman")[0];
        table.push(`${version.padEnd(10)} doctor: ${podmanLine.slice(0, 60)}... | apply: ${apply.errors[0]}`);
        assert.equal(apply.errorCode, refused ? "podman-too-old" : "not-owned", `${version}: ${apply.errors}`);
        assert.deepEqual(apply.changed, [], `${version}: nothing written`);
        if (refused) {
          assert.equal(apply.errors.length, 1);
          assert.match(
            apply.errors[0],
            new RegExp(`^podman-too-old: podman ${version.replaceAll(".", "\\.")} is older`),
          );
          assert.equal(d.code, 1, d.text);
          assert.match(podmanLine, new RegExp(`^✗ podman +podman ${version.replaceAll(".", "\\.")} is too old`));
        } else {
          assert.equal(d.code, 0, d.text);
          const form = /^(4\.|5\.[0-3]\.)/.test(version)
            ? "Network=container:<name>-runtime with "
            : "Network=<name>-runtime\\.container$";
          assert.match(podmanLine, new RegExp(`^✓ podman +podman ${version.replaceAll(".", "\\.")}: .* by ${form}`));
        }
      }
      console.log(`  ${table.join("\n  ")}`);
      // only the hand-made file: no config, no exporter quadlet, no volume
      assert.equal((await sh(h, `ls /etc/containers/systemd/ | grep -c ${name} || true`)).trim(), "1");
      assert.equal((await sh(h, `ls /etc/jumpstarter/exporters/ | grep -c ${name} || true`)).trim(), "0");
      assert.equal((await sh(h, `podman volume ls -q | grep -c ${name} || true`)).trim(), "0");
    } finally {
      await realPodman(h);
      await sh(h, `rm -f ${rtQuadlet}`);
      await pool.close();
    }
  },
});

Deno.test({
  name: "deploy on a faked Podman 4.3.1 (a wrapper first in PATH): PodmanTooOld on the set naming host, version and " +
    "fix, a Warning event, nothing on the host; once podman is 5.4 again the set deploys",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const w = await world({ resyncMs: 5_000 });
    try {
      await fakePodmanVersion(w.host, "4.3.1");
      await applySeed(w);
      const degraded = await waitFor(async () => {
        const c = cond(await getSet(w), "Degraded");
        return c?.reason === "PodmanTooOld" ? c : undefined;
      }, { what: "Degraded PodmanTooOld", timeoutMs: 60_000 });
      assert.equal(degraded.status, "True");
      assert.match(
        degraded.message!,
        /^aarch64-ssh-pool-\w+: on lab-host-01\.example\.com: podman-too-old: podman 4\.3\.1 is older than 4\.4 and has no quadlet/,
      );
      assert.match(degraded.message!, /upgrade podman to 4\.4 or later/);
      const warning = await waitFor(
        async () => (await events(w)).find((e) => e.reason === "PodmanTooOld"),
        { what: "a PodmanTooOld event" },
      );
      assert.equal(warning.type, "Warning");
      assert.match(warning.message, /on lab-host-01\.example\.com: podman-too-old: podman 4\.3\.1/);
      const [e] = await exporters(w);
      assert.ok(e, "the Exporter is created; only its deploy waits");
      assert.equal(await hostHas(w.host, e.metadata.name!), false, "no file, container, volume or unit on the host");

      await realPodman(w.host);
      await waitReady(w, 1, undefined, 60_000);
      assert.notEqual(cond(await getSet(w), "Degraded")?.reason, "PodmanTooOld");
    } finally {
      await hostExec(w.host, "rm -f /usr/local/bin/podman");
      await w.stop();
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
    ["--host", "h1", "--key", "k", "-o", "yaml"],
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
