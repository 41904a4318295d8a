/**
 * The production permission set (scripts/permissions.sh: what `deno task compile` bakes into the binary and
 * `deno task run:prod` uses) against the real thing: main.ts runs as a subprocess under exactly those flags, pointed
 * at the test control plane and a lab host, with the FakeJumpstarterController in this process. It must do the whole
 * job; and with the lab host left out of --allow-net it must say so in the set's status and its log, not deploy.
 */
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { freshNamespace, seedExample, testEnv, waitFor } from "./env.ts";
import { startFakeJumpstarter } from "./fake_jumpstarter.ts";
import { hostExec, type LabHost } from "./labhost/labhost.ts";
import { KubeClient } from "../src/kube/client.ts";
import { EXPORTER_SETS, EXPORTERS, SECRETS, VIRTUAL_TARGET_CLASSES } from "../src/kube/resources.ts";
import type { Exporter, ExporterSet, Secret } from "../src/api/types.ts";

const ROOT = new URL("..", import.meta.url).pathname;
const SEED_HOST = "lab-host-01.example.com";
const SET = "aarch64-ssh-pool";

/** The flags scripts/permissions.sh prints for these build-time variables, and only these. */
async function prodFlags(vars: Record<string, string>): Promise<string[]> {
  const out = await new Deno.Command("sh", {
    args: [`${ROOT}scripts/permissions.sh`],
    clearEnv: true,
    env: { PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin", ...vars },
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.ok(out.success, new TextDecoder().decode(out.stderr));
  return new TextDecoder().decode(out.stdout).trim().split(/\s+/);
}

/** Build-time variables for the test environment, with the lab allowance given. */
async function testVars(allowLab: string): Promise<Record<string, string>> {
  const env = await testEnv();
  const client = await KubeClient.load(env.kubeconfig);
  const api = new URL(client.server);
  client.close();
  return {
    QSP_ALLOW_API: `${api.hostname}:${api.port}`,
    QSP_ALLOW_LISTEN: "127.0.0.1:0",
    QSP_ALLOW_LAB: allowLab,
    QSP_KUBECONFIG: env.kubeconfig,
  };
}

interface Provisioner {
  logs: string[];
  /** SIGTERM, then the exit code. */
  stop(): Promise<number>;
}

/** main.ts as the operator starts it (leader election on), plus what a lab outside the cluster needs. */
async function startProvisioner(flags: string[], ns: string, host: LabHost): Promise<Provisioner> {
  const env = await testEnv();
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      ...flags,
      "main.ts",
      "run",
      "--provisioner=qemu-ssh.jumpstarter.dev",
      "--leader-elect",
      "--health-probe-bind-address=127.0.0.1:0",
      "--metrics-bind-address=0",
      "--kubeconfig",
      env.kubeconfig,
      "--namespace",
      ns,
      "--host-alias",
      `${SEED_HOST}=${host.address}`,
    ],
    cwd: ROOT,
    env: { NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const logs: string[] = [];
  const collect = async (stream: ReadableStream<Uint8Array>) => {
    let buf = "";
    for await (const chunk of stream.pipeThrough(new TextDecoderStream())) {
      buf += chunk;
      const lines = buf.split("\n");
      buf = lines.pop()!;
      logs.push(...lines);
    }
    if (buf) logs.push(buf);
  };
  const drained = Promise.all([collect(child.stdout), collect(child.stderr)]);
  return {
    logs,
    async stop() {
      try {
        child.kill("SIGTERM");
      } catch {
        // already exited: its status says how
      }
      const status = await child.status;
      await drained;
      return status.code;
    },
  };
}

/** Steps 2 to 4 of the feature description in a fresh namespace, and the fake Jumpstarter controller for it. */
async function seed(client: KubeClient, host: LabHost) {
  const ns = await freshNamespace(client, "perm");
  const key = await Deno.readTextFile(host.privateKeyPath);
  await client.create<Secret>(SECRETS, {
    metadata: { name: "lab-ssh-key", namespace: ns },
    type: "Opaque",
    data: { "ssh-privatekey": Buffer.from(key).toString("base64") },
  });
  await client.create(VIRTUAL_TARGET_CLASSES, await seedExample("virtualtargetclass.yaml", ns));
  await client.create(EXPORTER_SETS, await seedExample("exporterset.yaml", ns));
  return { ns, fake: startFakeJumpstarter(client, ns) };
}

const condition = (s: ExporterSet, type: string) => s.status?.conditions?.find((c) => c.type === type);
const denials = (logs: string[]) => logs.filter((l) => /NotCapable|Requires \w+ access/.test(l));

Deno.test("permissions: the production flag set grants no blanket permission", async () => {
  const flags = await prodFlags({});
  for (const f of flags) {
    assert.doesNotMatch(f, /^(-A|--allow-all|--allow-(run|write|ffi|import))/, `no ${f}`);
    assert.ok(!/^--allow-(net|read|sys)$/.test(f), `${f} must name what it allows`);
  }
  const net = flags.find((f) => f.startsWith("--allow-net="))!.slice("--allow-net=".length).split(",");
  for (const n of net) assert.match(n, /:\d+$/, `${n}: every network grant names its port`);
  assert.ok(net.includes("10.96.0.0/12:443") && net.includes("0.0.0.0:8081"), "defaults: in-cluster API, :8081");
  assert.deepEqual(
    flags.find((f) => f.startsWith("--allow-read=")),
    "--allow-read=/var/run/secrets/kubernetes.io/serviceaccount",
  );
  assert.deepEqual(flags.find((f) => f.startsWith("--allow-sys=")), "--allow-sys=hostname,uid");
});

Deno.test({
  name: "permissions: under the production flags main.ts deploys the seed's set on the lab host and tears it down",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const env = await testEnv();
    const host = env.labhosts[0];
    const client = await KubeClient.load(env.kubeconfig);
    // The lab host as a CIDR: what the variable is documented for, and checked against the --host-alias address.
    const flags = await prodFlags(await testVars(`${host.address}/32:22`));
    const { ns, fake } = await seed(client, host);
    const p = await startProvisioner(flags, ns, host);
    let code: number | undefined;
    try {
      const t0 = performance.now();
      await waitFor(async () => {
        const s = await client.get<ExporterSet>(EXPORTER_SETS, ns, SET);
        return condition(s, "Available")?.status === "True" && s.status?.readyReplicas === 1;
      }, { what: "the set Available with 1 ready exporter", timeoutMs: 90_000 });
      console.log(`  Available after ${((performance.now() - t0) / 1000).toFixed(1)}s`);
      const [e] = (await client.list<Exporter>(EXPORTERS, ns)).items;
      const name = e.metadata.name!;
      const units = await hostExec(host, `systemctl is-active ${name}-runtime.service ${name}-exporter.service`);
      assert.equal(units.stdout, "active\nactive\n", "both units run on the lab host");

      await client.delete(EXPORTER_SETS, ns, SET);
      await waitFor(async () => (await client.list(EXPORTERS, ns)).items.length === 0, {
        what: "the exporters torn down and deleted",
        timeoutMs: 60_000,
      });
      const left = await hostExec(
        host,
        `ls /etc/containers/systemd/ /etc/jumpstarter/exporters/ | grep -c ${name} || true`,
      );
      assert.equal(left.stdout.trim(), "0", "nothing left on the lab host");
    } finally {
      code = await p.stop();
      await fake.stop();
      client.close();
    }
    assert.deepEqual(denials(p.logs), [], "no permission was missing");
    assert.equal(code, 0, `clean exit on SIGTERM; log:\n${p.logs.slice(-20).join("\n")}`);
  },
});

Deno.test({
  name: "permissions: a lab host outside --allow-net is refused with a clear error in the status and the log",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const env = await testEnv();
    const host = env.labhosts[0];
    const client = await KubeClient.load(env.kubeconfig);
    // TEST-NET-1 (RFC 5737): an allowance that can never match the lab host, and is never dialed.
    const flags = await prodFlags(await testVars("192.0.2.0/24:22"));
    const { ns, fake } = await seed(client, host);
    const p = await startProvisioner(flags, ns, host);
    const refusal = `Requires net access to "${host.address}:22"`;
    let code: number | undefined;
    try {
      const set = await waitFor(async () => {
        const s = await client.get<ExporterSet>(EXPORTER_SETS, ns, SET);
        return condition(s, "Degraded")?.message?.includes(refusal) ? s : undefined;
      }, { what: `Degraded naming the refused address`, timeoutMs: 60_000 });
      assert.equal(condition(set, "Degraded")?.status, "True");
      assert.equal(condition(set, "Available")?.status, "False");
      assert.equal(set.status?.readyReplicas ?? 0, 0);
      // The text log quotes the error, escaping its quotes.
      const logged = (l: string) => l.includes(refusal.replaceAll('"', '\\"'));
      await waitFor(() => p.logs.some(logged), { what: "the refusal in the log" });
      const [e] = (await client.list<Exporter>(EXPORTERS, ns)).items;
      const left = await hostExec(host, `ls /etc/containers/systemd/ | grep -c ${e.metadata.name} || true`);
      assert.equal(left.stdout.trim(), "0", "nothing was deployed");
    } finally {
      code = await p.stop();
      await fake.stop();
      client.close();
    }
    assert.equal(code, 0, "the process keeps running (and retrying) until told to stop");
  },
});
