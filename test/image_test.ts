/**
 * The controller's image (`deno task image`: FROM scratch, built offline by Podman) run as a kubelet would run the
 * operator's Deployment: the Deployment's own args, env and security context (uid 65532 from the image, read-only
 * root without Podman's extra tmpfs, no capabilities, no privilege escalation), in-cluster configuration from
 * KUBERNETES_SERVICE_HOST/PORT and a mounted service account directory (a TokenRequest token for the manifests'
 * ServiceAccount and Role, the CA, the namespace). It deploys the seed's set to a lab host and tears it down.
 *
 * The image runs on the second lab host, whose Podman runs containers (this machine's cgroup hybrid mode stops
 * crun; building needs no runtime). The API server listens on this machine's 127.0.0.1 only, so `ssh -R` gives the
 * lab host a 127.0.0.1 port that leads to it: the address the server's certificate names, as a Service IP would be.
 */
import assert from "node:assert/strict";
import { parse } from "yaml";
import { testEnv, waitFor } from "./env.ts";
import { applySeed, cond, exporters, getSet, SEED_HOST, SET, world } from "./e2e_world.ts";
import { hostExec, sshArgs } from "./labhost/labhost.ts";
import { installClusterIdRole, installControllerRbac, manifest } from "./rbac.ts";
import { shQuote } from "../src/host/remote.ts";
import { EXPORTER_SETS } from "../src/kube/resources.ts";

const ROOT = new URL("..", import.meta.url).pathname;
const CONTAINER = "qsp-image-test";
const SA_DIR = "/run/qsp-image-test/serviceaccount";
const API_PORT_ON_HOST = 16443;

/** `deno task image`, with this test's deno as the runtime it packs; returns the reference and size it reports. */
async function buildImage(): Promise<{ ref: string; sizeMiB: number }> {
  const out = await new Deno.Command("bash", {
    args: ["scripts/image.sh", "localhost/qemu-ssh-provisioner:test"],
    cwd: ROOT,
    env: { DENO_BIN: Deno.execPath() },
    stdout: "piped",
    stderr: "inherit",
  }).output();
  const last = new TextDecoder().decode(out.stdout).trim().split("\n").pop() ?? "";
  const m = /^image (\S+) (\d+)$/.exec(last);
  assert.ok(out.success && m, `scripts/image.sh failed or printed no "image REF SIZE_MB" line: ${last}`);
  return { ref: m[1], sizeMiB: Number(m[2]) };
}

Deno.test({
  name: "image: the Deployment's container, from the image, deploys the seed in-cluster style as uid 65532",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const env = await testEnv();
    const { ref, sizeMiB } = await buildImage();
    console.log(`  image ${ref}: ${sizeMiB} MiB`);
    const w = await world({ startController: false });
    const runner = w.host2;
    const dir = await Deno.makeTempDir({ prefix: "qsp-image-" });
    let forward: Deno.ChildProcess | undefined;
    // what `kubectl apply -k manifests` gives the ServiceAccount besides its Role: the read of the cluster id
    const removeRole = await installClusterIdRole(w.client, w.ns);
    try {
      // the image onto the lab host that runs it
      const tar = `${dir}/image.tar`;
      const save = await new Deno.Command("podman", { args: ["save", "-q", "-o", tar, ref], stderr: "piped" })
        .output();
      assert.ok(save.success, new TextDecoder().decode(save.stderr));
      const load = await new Deno.Command("ssh", {
        args: [...sshArgs(runner), "podman load -q"],
        stdin: "piped",
        stdout: "piped",
        stderr: "piped",
      }).spawn();
      await (await Deno.open(tar)).readable.pipeTo(load.stdin);
      const loaded = await load.output();
      assert.ok(loaded.success, new TextDecoder().decode(loaded.stderr));

      // what the kubelet mounts for the Pod's ServiceAccount
      const kubeconfig = parse(
        await Deno.readTextFile(
          await installControllerRbac(w.client, env.kubeconfig, w.ns, dir),
        ),
      );
      const token: string = kubeconfig.users[0].user.token;
      const ca = atob(kubeconfig.clusters[0].cluster["certificate-authority-data"]);
      const api = new URL(kubeconfig.clusters[0].cluster.server);
      const files = { token, "ca.crt": ca, namespace: w.ns };
      const write = Object.entries(files).map(([f, v]) => `printf %s ${shQuote(v)} >${SA_DIR}/${f}`).join("; ");
      assert.equal((await hostExec(runner, `mkdir -p ${SA_DIR} && ${write} && chmod 0644 ${SA_DIR}/*`)).code, 0);
      forward = new Deno.Command("ssh", {
        args: [
          "-N",
          "-o",
          "ExitOnForwardFailure=yes",
          "-R",
          `127.0.0.1:${API_PORT_ON_HOST}:${api.hostname}:${api.port}`,
          ...sshArgs(runner),
        ],
        stdin: "null",
        stdout: "null",
        stderr: "null",
      }).spawn();
      await waitFor(async () => (await hostExec(runner, `echo >/dev/tcp/127.0.0.1/${API_PORT_ON_HOST}`)).code === 0, {
        what: "the API server reachable from the lab host",
      });

      // the operator's container as the Deployment describes it
      // deno-lint-ignore no-explicit-any
      const d = await manifest<any>("deployment.yaml");
      const c = d.spec.template.spec.containers[0];
      assert.deepEqual(c.command, ["/exporter-set-controller"]);
      assert.deepEqual(c.securityContext, {
        allowPrivilegeEscalation: false,
        readOnlyRootFilesystem: true,
        capabilities: { drop: ["ALL"] },
      });
      const vars: Record<string, string> = {
        KUBERNETES_SERVICE_HOST: "127.0.0.1",
        KUBERNETES_SERVICE_PORT: String(API_PORT_ON_HOST),
      };
      for (const e of c.env) {
        // NAMESPACE comes from the Pod's namespace; LAB_HOSTS is the value the README tells a lab to set: its host
        vars[e.name] = e.valueFrom?.fieldRef ? w.ns : e.name === "LAB_HOSTS" ? `${SEED_HOST}:22` : e.value;
      }
      const run = [
        "podman run -d --replace",
        `--name ${CONTAINER}`,
        "--network host",
        `--add-host ${SEED_HOST}:${w.host.address}`,
        "--read-only --read-only-tmpfs=false --cap-drop all --security-opt no-new-privileges",
        `-v ${SA_DIR}:/var/run/secrets/kubernetes.io/serviceaccount:ro`,
        ...Object.entries(vars).map(([k, v]) => `-e ${shQuote(`${k}=${v}`)}`),
        ref,
        ...c.args.map(shQuote),
      ].join(" ");
      const started = await hostExec(runner, run);
      assert.equal(started.code, 0, started.stderr);
      const inspect = await hostExec(
        runner,
        `podman inspect --format '{{.Config.User}} {{.HostConfig.ReadonlyRootfs}} {{len .EffectiveCaps}}' ${CONTAINER}`,
      );
      assert.equal(inspect.stdout.trim(), "65532:65532 true 0", "user from the image, read-only root, no caps");
      const uid = await hostExec(
        runner,
        `awk '/^Uid:/ {print $2}' /proc/$(podman inspect --format '{{.State.Pid}}' ${CONTAINER})/status`,
      );
      assert.equal(uid.stdout.trim(), "65532", "the controller process runs as 65532");

      const t0 = performance.now();
      await applySeed(w);
      await waitFor(async () => {
        const s = await getSet(w);
        return cond(s, "Available")?.status === "True" && s.status?.readyReplicas === 1;
      }, { what: "the seed's set Available with 1 ready exporter, from the image", timeoutMs: 120_000 });
      console.log(`  from the image: Available ${((performance.now() - t0) / 1000).toFixed(1)}s after the seed`);
      const [e] = await exporters(w);
      const name = e.metadata.name!;
      const units = await hostExec(w.host, `systemctl is-active ${name}-runtime.service ${name}-exporter.service`);
      assert.equal(units.stdout, "active\nactive\n");

      await w.client.delete(EXPORTER_SETS, w.ns, SET);
      await waitFor(async () => (await exporters(w)).length === 0, { what: "exporters gone", timeoutMs: 90_000 });
      const left = await hostExec(w.host, `ls /etc/containers/systemd/ | grep -c ${name} || true`);
      assert.equal(left.stdout.trim(), "0", "nothing left on the lab host");
    } catch (e) {
      const logs = await hostExec(runner, `podman logs --tail 30 ${CONTAINER} 2>&1`);
      console.log(`controller log:\n${logs.stdout}`);
      throw e;
    } finally {
      await hostExec(runner, `podman rm -f -t 5 ${CONTAINER} >/dev/null; rm -rf ${SA_DIR}`);
      forward?.kill("SIGTERM");
      await forward?.status;
      await removeRole();
      await w.stop();
      await Deno.remove(dir, { recursive: true });
    }
  },
});
