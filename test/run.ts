/**
 * `deno task test`: starts one real control plane and real lab hosts for the whole run, runs `deno test` against
 * them, and stops everything whatever happens. Extra arguments go to `deno test` (e.g. a file or --filter).
 * QSP_LAB_BRIDGE and QSP_LAB_SUBNET (default qsplabt, 10.76.0) choose the lab network.
 */
import { startControlPlane } from "./controlplane/controlplane.ts";
import { type LabNet, startLabHosts, stopLabHosts } from "./labhost/labhost.ts";
import { installCrdsAt, type TestEnv } from "./env.ts";

// Several runs can share a machine (developers, helpers) when each picks its own bridge and subnet.
const bridge = Deno.env.get("QSP_LAB_BRIDGE") ?? "qsplabt";
const LAB: LabNet = { dir: `/tmp/qsp-test-${bridge}`, bridge, subnet: Deno.env.get("QSP_LAB_SUBNET") ?? "10.76.0" };
const TEST_LAB_HOSTS = 2;

// Two runs on one lab network would share (and tear down) each other's hosts: the second one stops here instead.
const lock = await Deno.open(`/tmp/qsp-test-${bridge}.lock`, { create: true, write: true });
const locked = await Promise.race([lock.lock(true).then(() => true), new Promise((r) => setTimeout(r, 2000, false))]);
if (!locked) {
  console.error(`[test] another test run uses lab network ${bridge}: set QSP_LAB_BRIDGE and QSP_LAB_SUBNET to others`);
  Deno.exit(1);
}

const dir = await Deno.makeTempDir({ prefix: "qsp-test-" });
const t0 = performance.now();
const secs = () => ((performance.now() - t0) / 1000).toFixed(1);
let code = 1;
const cp = await startControlPlane({ dir: `${dir}/controlplane`, setup: installCrdsAt });
try {
  console.error(`[test] control plane ready at ${cp.server} after ${secs()}s`);
  const labhosts = await startLabHosts(LAB, TEST_LAB_HOSTS);
  console.error(`[test] ${labhosts.length} lab hosts ready after ${secs()}s`);
  const env: TestEnv = {
    kubeconfig: cp.kubeconfigPath,
    userKubeconfigs: { nobody: await cp.userKubeconfig("nobody") },
    labhosts,
    labNet: LAB,
    controlPlaneDir: cp.dir,
  };
  await Deno.writeTextFile(`${dir}/env.json`, JSON.stringify(env, null, 2));
  const test = new Deno.Command(Deno.execPath(), {
    args: ["test", "-A", ...Deno.args],
    env: { QSP_TEST_ENV: `${dir}/env.json` },
    stdin: "null",
    stdout: "inherit",
    stderr: "inherit",
  });
  code = (await test.spawn().status).code;
} finally {
  await stopLabHosts(LAB).catch((e) => console.error(`[test] stopping lab hosts: ${e}`));
  await cp.stop();
  await Deno.remove(dir, { recursive: true }).catch(() => {});
  console.error(`[test] environment stopped after ${secs()}s`);
}
Deno.exit(code);
