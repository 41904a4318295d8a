/**
 * The shipped permission set against the real thing. main.ts (or the air-gapped bundle) runs as a subprocess under
 * exactly the launcher's flags (scripts/permissions.sh: what `deno task compile` bakes in, what `deno task run:prod`
 * and `run:bundle` use), pointed at the test control plane (on 127.0.0.1: outside the 10.96.0.0/12 a baked set used to
 * demand), at the seed's lab host by name (--lab-hosts lab-host-01.example.com, dialed at its --host-alias address)
 * and with a health listener on a port of its own. The narrowed Worker must do the whole job; a lab host outside
 * --lab-hosts must be refused in the set's status and the log, naming the flag, and nothing deployed.
 */
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { freshNamespace, launcherFlags, seedExample, testEnv, waitFor } from "./env.ts";
import { startFakeJumpstarter } from "./fake_jumpstarter.ts";
import { hostExec, type LabHost } from "./labhost/labhost.ts";
import { KubeClient } from "../src/kube/client.ts";
import { EXPORTER_SETS, EXPORTERS, SECRETS, VIRTUAL_TARGET_CLASSES } from "../src/kube/resources.ts";
import type { Exporter, ExporterSet, Secret } from "../src/api/types.ts";

const ROOT = new URL("..", import.meta.url).pathname;
const SEED_HOST = "lab-host-01.example.com";
const SET = "aarch64-ssh-pool";

/** How the program is started: from source (`deno task run:prod`) or as the bundle (`deno task run:bundle`). */
interface Form {
  name: string;
  /** `deno` arguments before the flags of the command, permission flags included. */
  args: string[];
  cwd: string;
  env?: Record<string, string>;
}

async function sourceForm(): Promise<Form> {
  return { name: "main.ts", args: ["run", ...await launcherFlags(), "main.ts"], cwd: ROOT };
}

/**
 * `deno task bundle` into an empty directory, run from there by a bare deno with an empty cache and no way to fetch
 * anything (--cached-only, --no-remote, --no-npm): what an air-gapped machine has.
 */
async function bundleForm(dir: string): Promise<Form> {
  const out = await new Deno.Command("sh", {
    args: ["scripts/bundle.sh", `${dir}/qemu-ssh-provisioner.js`],
    cwd: ROOT,
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.ok(out.success, new TextDecoder().decode(out.stderr));
  await Deno.mkdir(`${dir}/deno-dir`);
  return {
    name: "bundle",
    args: [
      "run",
      "--no-config",
      "--cached-only",
      "--no-remote",
      "--no-npm",
      ...await launcherFlags(),
      "qemu-ssh-provisioner.js",
    ],
    cwd: dir,
    env: { DENO_DIR: `${dir}/deno-dir` },
  };
}

/** A port nothing listens on now, for the health listener. */
function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  l.close();
  return (l.addr as Deno.NetAddr).port;
}

interface Provisioner {
  logs: string[];
  /** SIGTERM, then the exit code. */
  stop(): Promise<number>;
}

/** The controller as the operator starts it (leader election on), plus what a lab outside the cluster needs. */
async function startProvisioner(
  form: Form,
  ns: string,
  host: LabHost,
  opts: { labHosts: string; healthPort?: number },
): Promise<Provisioner> {
  const env = await testEnv();
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      ...form.args,
      "run",
      "--provisioner=qemu-ssh.jumpstarter.dev",
      "--leader-elect",
      `--health-probe-bind-address=${opts.healthPort ? `127.0.0.1:${opts.healthPort}` : "0"}`,
      "--metrics-bind-address=0",
      "--lab-hosts",
      opts.labHosts,
      "--kubeconfig",
      env.kubeconfig,
      "--namespace",
      ns,
      "--host-alias",
      `${SEED_HOST}=${host.address}`,
    ],
    cwd: form.cwd,
    env: { NO_COLOR: "1", ...form.env },
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

Deno.test("permissions: the launcher grants no write, ffi or import, and narrows a Worker", async () => {
  const flags = await launcherFlags();
  for (const f of flags) assert.doesNotMatch(f, /^(-A|--allow-all|--allow-(write|ffi|import))/, `no ${f}`);
  assert.ok(flags.includes("--unstable-worker-options") && flags.includes("--no-prompt"));
});

for (const [what, form] of [["main.ts", sourceForm], ["the air-gapped bundle", bundleForm]] as const) {
  Deno.test({
    name: `permissions: ${what} under the shipped set deploys the seed's set on a lab host named in --lab-hosts`,
    sanitizeResources: false,
    sanitizeOps: false,
    async fn() {
      const env = await testEnv();
      const host = env.labhosts[0];
      const client = await KubeClient.load(env.kubeconfig);
      const dir = await Deno.makeTempDir({ prefix: "qsp-perm-" });
      const { ns, fake } = await seed(client, host);
      const healthPort = freePort();
      const t0 = performance.now();
      const p = await startProvisioner(await form(dir), ns, host, { labHosts: `${SEED_HOST}:22`, healthPort });
      let code: number | undefined;
      try {
        const health = await waitFor(async () => {
          const res = await fetch(`http://127.0.0.1:${healthPort}/healthz`).catch(() => undefined);
          return res && { status: res.status, text: await res.text() };
        }, { what: `/healthz on 127.0.0.1:${healthPort}` });
        assert.equal(health.status, 200);
        await waitFor(async () => {
          const s = await client.get<ExporterSet>(EXPORTER_SETS, ns, SET);
          return condition(s, "Available")?.status === "True" && s.status?.readyReplicas === 1;
        }, { what: "the set Available with 1 ready exporter", timeoutMs: 90_000 });
        console.log(`  ${what}: Available ${((performance.now() - t0) / 1000).toFixed(1)}s after start`);
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
        await Deno.remove(dir, { recursive: true });
      }
      assert.deepEqual(denials(p.logs), [], "no permission was missing");
      assert.equal(code, 0, `clean exit on SIGTERM; log:\n${p.logs.slice(-20).join("\n")}`);
    },
  });
}

Deno.test({
  name: "permissions: a lab host outside --lab-hosts is refused with a clear error in the status and the log",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const env = await testEnv();
    const host = env.labhosts[0];
    const client = await KubeClient.load(env.kubeconfig);
    const { ns, fake } = await seed(client, host);
    // TEST-NET-1 (RFC 5737): a list that can never match the lab host, and is never dialed.
    const p = await startProvisioner(await sourceForm(), ns, host, { labHosts: "192.0.2.0/24:22" });
    const refusal = `lab host ${SEED_HOST} (${host.address}) port 22 is not in --lab-hosts (192.0.2.0/24:22): ` +
      `add it to the controller's --lab-hosts flag or LAB_HOSTS variable`;
    let code: number | undefined;
    try {
      const set = await waitFor(async () => {
        const s = await client.get<ExporterSet>(EXPORTER_SETS, ns, SET);
        return condition(s, "Degraded")?.message?.includes(refusal) ? s : undefined;
      }, { what: `Degraded naming the refused host and the flag`, timeoutMs: 60_000 });
      assert.equal(condition(set, "Degraded")?.status, "True");
      assert.equal(condition(set, "Available")?.status, "False");
      assert.equal(set.status?.readyReplicas ?? 0, 0);
      await waitFor(() => p.logs.some((l) => l.includes(refusal)), { what: "the refusal in the log" });
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
