/**
 * The binary's front door: bad flags, a missing or broken kubeconfig, an unreachable server and missing rights each
 * give one clear message naming what and where, and a non-zero exit, never a stack trace.
 */
import assert from "node:assert/strict";
import { testEnv } from "./env.ts";
import { parseRunFlags } from "../main.ts";

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

Deno.test("cli: kubebuilder's --zap-log-level is understood; --log-level wins", () => {
  assert.equal(parseRunFlags([]).logLevel, "info");
  assert.equal(parseRunFlags(["--zap-log-level=debug"]).logLevel, "debug");
  assert.equal(parseRunFlags(["--zap-log-level=3"]).logLevel, "debug");
  assert.equal(parseRunFlags(["--zap-log-level=panic"]).logLevel, "error");
  assert.equal(parseRunFlags(["--zap-log-level=debug", "--log-level=warn"]).logLevel, "warn");
  assert.throws(() => parseRunFlags(["--zap-log-level=loud"]), /--zap-log-level: unknown level "loud"/);
});

Deno.test("cli: --resync and --sweep-interval set how often sets and hosts are looked at", () => {
  const defaults = parseRunFlags([]);
  assert.deepEqual([defaults.resyncMs, defaults.sweepMs], [300_000, 300_000]);
  const set = parseRunFlags(["--resync", "20", "--sweep-interval", "60"]);
  assert.deepEqual([set.resyncMs, set.sweepMs], [20_000, 60_000]);
  assert.throws(() => parseRunFlags(["--sweep-interval", "0"]), /--sweep-interval must be a number of seconds >= 1/);
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
    assert.match(missing.stderr, new RegExp(`^error: cannot load the kubeconfig \\(${dir}/nope\\)`));
    assertNoTrace(missing.stderr);

    await Deno.writeTextFile(`${dir}/broken`, "clusters: [\n");
    const broken = await run(`${dir}/broken`);
    assert.equal(broken.code, 1);
    assert.match(broken.stderr, /^error: cannot load the kubeconfig/);

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
    assert.match(unreachable.stderr, new RegExp(`^error: cannot reach the API server at https://127.0.0.1:${port}`));
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
