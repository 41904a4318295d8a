/**
 * The binary's front door: bad flags, a missing or broken kubeconfig, an unreachable server and missing rights each
 * give one clear message naming what and where, and a non-zero exit, never a stack trace.
 */
import assert from "node:assert/strict";
import { testEnv } from "./env.ts";
import { parseRunFlags } from "../src/cli/main.ts";
import { runShell } from "../src/host/script_harness.ts";

const MAIN = new URL("../main.ts", import.meta.url).pathname;

async function cli(...args: string[]) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MAIN, ...args],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

function assertNoTrace(stderr: string) {
  assert.doesNotMatch(stderr, /^\s+at /m, `a stack trace in:\n${stderr}`);
}

Deno.test("cli: usage errors exit 2 with the usage; --help and version exit 0", async () => {
  const bad = await cli("--bogus");
  assert.equal(bad.code, 2);
  assert.match(bad.stderr, /error: Unknown option '--bogus'/);
  assert.match(bad.stderr, /usage: qemu-ssh-provisioner/);
  assertNoTrace(bad.stderr);
  assert.equal((await cli("frobnicate")).code, 2);
  assert.equal((await cli("run", "--log-level=loud")).code, 2);
  assert.equal((await cli("--help")).code, 0);
  for (const args of [["version"], ["--version"]]) {
    const v = await cli(...args);
    assert.equal(v.code, 0);
    assert.match(v.stdout, /^\d+\.\d+\.\d+\n$/);
  }
});

Deno.test("cli: kubebuilder's --zap-* flags are understood or ignored with a warning; --log-level wins", () => {
  assert.equal(parseRunFlags([]).logLevel, "info");
  assert.equal(parseRunFlags(["--zap-log-level=debug"]).logLevel, "debug");
  assert.equal(parseRunFlags(["--zap-log-level=3"]).logLevel, "debug");
  assert.equal(parseRunFlags(["--zap-log-level=panic"]).logLevel, "error");
  assert.equal(parseRunFlags(["--zap-log-level=debug", "--log-level=warn"]).logLevel, "warn");
  assert.throws(() => parseRunFlags(["--zap-log-level=loud"]), /--zap-log-level: unknown level "loud"/);
  assert.equal(parseRunFlags(["--zap-devel"]).logLevel, "debug");
  assert.equal(parseRunFlags(["--zap-encoder=json"]).logFormat, "json");
  assert.equal(parseRunFlags(["--zap-encoder=console"]).logFormat, "text");
  const ignored = parseRunFlags(["--zap-stacktrace-level=error", "--zap-time-encoding=iso8601"]);
  assert.deepEqual(ignored.warnings.map((w) => w.split(" ")[0]), ["--zap-stacktrace-level", "--zap-time-encoding"]);
  assert.deepEqual(parseRunFlags([]).warnings, []);
});

Deno.test("cli: --teardown-grace bounds a teardown (default 2 minutes); --cluster-id is one safe word", () => {
  assert.equal(parseRunFlags([]).teardownGraceMs, 120_000);
  assert.equal(parseRunFlags(["--teardown-grace=15"]).teardownGraceMs, 15_000);
  assert.throws(() => parseRunFlags(["--teardown-grace=0"]), /--teardown-grace must be a number of seconds/);
  assert.equal(parseRunFlags([]).clusterId, undefined, "read from the cluster at start");
  assert.equal(parseRunFlags(["--cluster-id=staging-eu.1"]).clusterId, "staging-eu.1");
  assert.throws(() => parseRunFlags(["--cluster-id=a b"]), /--cluster-id must be/);
});

Deno.test("cli: --kube-api-qps and --kube-api-burst set the flow control toward the API server", () => {
  assert.deepEqual(parseRunFlags([]).kubeApi, { qps: 0, burst: 100 });
  assert.deepEqual(parseRunFlags(["--kube-api-qps=20", "--kube-api-burst=30"]).kubeApi, { qps: 20, burst: 30 });
  assert.deepEqual(parseRunFlags(["--kube-api-qps=50"]).kubeApi, { qps: 50, burst: 100 });
  assert.throws(() => parseRunFlags(["--kube-api-qps=-1"]), /--kube-api-qps must be a number >= 0/);
  assert.throws(() => parseRunFlags(["--kube-api-burst=0"]), /--kube-api-burst must be a whole number >= 1/);
  assert.equal(parseRunFlags([]).maxSshConnections, 2000);
  assert.equal(parseRunFlags(["--max-ssh-connections=900"]).maxSshConnections, 900);
  assert.throws(() => parseRunFlags(["--max-ssh-connections=0"]), /--max-ssh-connections must be a whole number/);
});

Deno.test("cli: --lab-hosts is checked at start; the environment sets it for a Deployment", () => {
  assert.equal(parseRunFlags([]).labHosts, "10.0.0.0/8:22,172.16.0.0/12:22,192.168.0.0/16:22");
  assert.equal(parseRunFlags(["--lab-hosts=lab-host-01.example.com"]).labHosts, "lab-host-01.example.com");
  assert.throws(() => parseRunFlags(["--lab-hosts=fd00::/8"]), /IPv6 ranges cannot be granted/);
  assert.throws(() => parseRunFlags(["--lab-hosts=,"]), /--lab-hosts: the list is empty/);
});

Deno.test("cli: --resync and --sweep-interval set how often sets and hosts are looked at", () => {
  const defaults = parseRunFlags([]);
  assert.deepEqual([defaults.resyncMs, defaults.sweepMs], [300_000, 300_000]);
  const set = parseRunFlags(["--resync", "20", "--sweep-interval", "60"]);
  assert.deepEqual([set.resyncMs, set.sweepMs], [20_000, 60_000]);
  assert.throws(() => parseRunFlags(["--sweep-interval", "0"]), /--sweep-interval must be a number of seconds >= 1/);
  assert.equal(parseRunFlags([]).concurrency, undefined, "the controller's default");
  assert.equal(parseRunFlags(["--max-concurrent-reconciles=8"]).concurrency, 8);
  assert.throws(() => parseRunFlags(["--max-concurrent-reconciles=0"]), /--max-concurrent-reconciles must be/);
});

Deno.test("cli: crds prints the bundled CRDs, identical to crds/", async () => {
  const out = await cli("crds");
  assert.equal(out.code, 0);
  const files = [...Deno.readDirSync(new URL("../crds/", import.meta.url))].map((f) => f.name)
    .filter((f) => f !== "kustomization.yaml");
  const texts = files.map((f) => Deno.readTextFileSync(new URL(`../crds/${f}`, import.meta.url)));
  const docs = out.stdout.split("---\n");
  assert.equal(docs.length, files.length);
  for (const t of texts) assert.ok(docs.includes(t), "every file of crds/ is printed unchanged");
});

Deno.test("cli: kubeconfig, server and RBAC problems are one clear line each", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const run = (kubeconfig: string) => cli("run", "--kubeconfig", kubeconfig, "--health-probe-bind-address=0");
    const missing = await run(`${dir}/nope`);
    assert.equal(missing.code, 1);
    assert.match(
      missing.stderr,
      new RegExp(`^error: cannot read kubeconfig ${dir}/nope \\(--kubeconfig\\): no such file`),
    );
    assertNoTrace(missing.stderr);

    await Deno.writeTextFile(`${dir}/broken`, "clusters: [\n");
    const broken = await run(`${dir}/broken`);
    assert.equal(broken.code, 1);
    assert.match(broken.stderr, new RegExp(`^error: kubeconfig ${dir}/broken is not valid YAML`));

    const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const port = listener.addr.port;
    listener.close(); // nothing listens there now
    await Deno.writeTextFile(
      `${dir}/unreachable`,
      `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:${port}"}}]
users: [{name: u, user: {token: abc}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`,
    );
    const unreachable = await run(`${dir}/unreachable`);
    assert.equal(unreachable.code, 1);
    assert.match(
      unreachable.stderr,
      new RegExp(
        `^error: cannot reach the API server https://127.0.0.1:${port} .*connection refused \\(ECONNREFUSED\\)`,
      ),
    );
    assertNoTrace(unreachable.stderr);

    const forbidden = await run((await testEnv()).userKubeconfigs.nobody);
    assert.equal(forbidden.code, 1);
    assert.match(
      forbidden.stderr,
      /^error: forbidden to list exportersets\.virtualtarget\.jumpstarter\.dev cluster-wide/,
    );
    assertNoTrace(forbidden.stderr);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/** main.ts with `stdin` piped in, as `... | qemu-ssh-provisioner render -f -` runs it. */
function cliStdin(stdin: string, ...args: string[]) {
  return runShell(Deno.execPath(), stdin, ["run", "-A", MAIN, ...args]);
}

Deno.test("cli: render -f - reads the manifests from stdin; -o json prints them as data", async () => {
  const path = (f: string) => new URL(`../manifests/examples/${f}`, import.meta.url).pathname;
  const [cls, set] = [path("virtualtargetclass.yaml"), path("exporterset.yaml")];
  const manifests = `${Deno.readTextFileSync(cls)}---\n${Deno.readTextFileSync(set)}`;
  const piped = await cliStdin(manifests, "render", "-f", "-");
  assert.equal(piped.code, 0, piped.stderr);
  const files = await cli("render", "-f", cls, "-f", set);
  assert.equal(files.code, 0, files.stderr);
  assert.equal(piped.stdout, files.stdout);
  assert.match(piped.stdout, /^Pull=newer$/m, "the seed's :latest images, no pull policy stated");

  const json = await cliStdin(manifests, "render", "-f", "-", "-o", "json");
  assert.equal(json.code, 0, json.stderr);
  const [one] = JSON.parse(json.stdout);
  assert.equal(one.exporterSet, "jumpstarter/aarch64-ssh-pool");
  assert.equal(one.files.length, 3);

  const bad = await cliStdin("kind: [unclosed", "render", "-f", "-");
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /^<stdin>: document 1: /);
  assertNoTrace(bad.stderr);
});
