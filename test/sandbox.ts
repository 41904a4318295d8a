/**
 * `deno task sandbox up [--hosts N] [--jumpstarter fake|real] [--kvm-mode 0660|0666] [--podman 4.9.3] | down |
 * status | demo | show | scale N | lease | host stop|start NAME`: a local world to run the provisioner in.
 *
 * up:     a real control plane (CRDs installed), N real lab hosts, and what issues exporter credentials: the
 *         FakeJumpstarterController (--jumpstarter fake), or the real Jumpstarter controller and router with the real
 *         exporter image on the lab hosts (--jumpstarter real; .sandbox/env then also has JMP and JMP_CLIENT_CONFIG
 *         for `jmp shell`); writes .sandbox/kubeconfig, .sandbox/env and .sandbox/labhosts.json. Without the flag:
 *         whichever runs, else fake. Switching re-provisions: the lab hosts are rebooted to import the other images
 *         (rootfs and keys kept), and the Exporters' credentials are issued again by the new issuer. Up with the real
 *         one returns once it accepts an exporter, and refreshes .sandbox/client.yaml with its CA.
 *         The lab network is qsplab0 / 10.77.0, or QSP_SANDBOX_BRIDGE / QSP_SANDBOX_SUBNET for a fresh sandbox (one
 *         that runs keeps its own, recorded in .sandbox/labnet.json).
 *         Each lab host has a /dev/kvm node of its own, 0660 root:kvm as Debian and Ubuntu ship it, or --kvm-mode's
 *         (0666 as Fedora and RHEL ship it), applied when a host boots.
 *         --podman VERSION: the lab hosts run that Podman 4.x, built from source, instead of Debian's 5.4 (a host
 *         keeps the Podman it was created with: `down` first to change it).
 * demo:   up with one host and the real Jumpstarter (--jumpstarter fake: the stand-in), then the feature
 *         description's examples exactly as written (Secret, VirtualTargetClass, ExporterSet in namespace
 *         jumpstarter; the class's host lab-host-01.example.com is mapped to the first lab host with --host-alias),
 *         starts the controller, waits until the exporter runs on the host (with the real one: until it is Online),
 *         and prints the `jmp shell` line that leases it.
 * show:   the ExporterSet table, the instances per host and `podman ps` on the hosts (demo ends with it).
 * scale:  what `kubectl scale exportersets/aarch64-ssh-pool --replicas=N` does (sets maxReplicas).
 * lease:  marks an idle exporter leased, as Jumpstarter does for `jmp lease`.
 * host:   `host stop NAME` powers lab host NAME (h1, ...) off, keeping its keys and disks; `host start NAME` powers
 *         it on again (test/labhost/labhost.ts powerOffLabHost, powerOnLabHost).
 * down:   stops everything `up` and `demo` started, by process id.
 */
import { builtPath } from "./built.ts";
import { parseArgs } from "node:util";
import { Buffer } from "node:buffer";
import { startControlPlane, stopControlPlane } from "./controlplane/controlplane.ts";
import {
  hostExec,
  type LabHost,
  type LabNet,
  powerOffLabHost,
  powerOnLabHost,
  startLabHosts,
  stopLabHosts,
} from "./labhost/labhost.ts";
import { installCrds, installCrdsAt, seedExample, waitFor } from "./env.ts";
import { installClusterIdRole, installControllerRbac } from "./rbac.ts";
import { startFakeJumpstarter } from "./fake_jumpstarter.ts";
import { CA_CONFIGMAP, startRealJumpstarter } from "./jumpstarter/controller.ts";
import { isConflict, KubeClient, type Resource, resourcePath } from "../src/kube/client.ts";
import { refreshedClientConfig } from "./sandbox_client.ts";
import { HOST_ANNOTATION } from "../src/provision/marks.ts";
import {
  CONFIG_MAPS,
  EXPORTER_SETS,
  EXPORTERS,
  NAMESPACES,
  SECRETS,
  VIRTUAL_TARGET_CLASSES,
} from "../src/kube/resources.ts";
import type { ConfigMap, Exporter, ExporterSet, KubeObject } from "../src/api/types.ts";

const ROOT = new URL("../", import.meta.url).pathname;
const DIR = `${ROOT}.sandbox`;
const LAB_FILE = `${DIR}/labnet.json`;
const LAB: LabNet = await labNet();
const EXPORTER_IMAGE = "quay.io/jumpstarter-dev/jumpstarter:latest";
const SEED_HOST = "lab-host-01.example.com";
const NAMESPACE = "jumpstarter";
const SET = "aarch64-ssh-pool";
/** The Jumpstarter client `jmp admin create client` makes for the sandbox's user. */
const CLIENT = "sandbox";
const JUMPSTARTER_CLIENTS: Resource = {
  group: "jumpstarter.dev",
  version: "v1alpha1",
  plural: "clients",
  kind: "Client",
};
const SELECTOR = "board=aarch64-qemu,virtual=true";

const { positionals, values } = parseArgs({
  args: Deno.args,
  allowPositionals: true,
  options: {
    hosts: { type: "string", default: "1" },
    kubeconfig: { type: "string" },
    jumpstarter: { type: "string" },
    "kvm-mode": { type: "string", default: "0660" },
    podman: { type: "string" },
  },
});
const command = positionals[0] ?? "status";
/** The credential issuers, one of which runs: the stand-in, or the real Jumpstarter controller and router. */
const ISSUERS = ["fake-jumpstarter", "real-jumpstarter"];
const RUNNING_ISSUER = (await Promise.all(ISSUERS.map((d) => pidAlive(`${DIR}/${d}.pid`)))).findIndex(Boolean);
const jumpstarter = values.jumpstarter ??
  (command === "demo" ? "real" : RUNNING_ISSUER === 1 ? "real" : "fake");
if (jumpstarter !== "fake" && jumpstarter !== "real") {
  console.error(`--jumpstarter must be fake or real, not "${jumpstarter}"`);
  Deno.exit(2);
}
const REAL = jumpstarter === "real";
/** The real controller's daemon writes this once it accepts an exporter (and removes it when it starts). */
const REAL_READY = `${DIR}/jumpstarter/ready`;
const JS_ENDPOINT = `${LAB.subnet}.1:8082`;

/** The lab network a running sandbox was started with, else the environment's or the default. */
async function labNet(): Promise<LabNet> {
  const env = { bridge: Deno.env.get("QSP_SANDBOX_BRIDGE"), subnet: Deno.env.get("QSP_SANDBOX_SUBNET") };
  const saved: LabNet | undefined = await Deno.readTextFile(LAB_FILE).then(JSON.parse).catch(() => undefined);
  if (!saved) return { dir: `${DIR}/labhost`, bridge: env.bridge ?? "qsplab0", subnet: env.subnet ?? "10.77.0" };
  if ((env.bridge && env.bridge !== saved.bridge) || (env.subnet && env.subnet !== saved.subnet)) {
    console.error(
      `the sandbox runs on bridge ${saved.bridge}, subnet ${saved.subnet}.0/24 (${LAB_FILE}), not the ` +
        "QSP_SANDBOX_BRIDGE / QSP_SANDBOX_SUBNET given: `deno task sandbox down` first to move it",
    );
    Deno.exit(2);
  }
  return saved;
}

async function pidAlive(file: string): Promise<number | undefined> {
  const pid = Number((await Deno.readTextFile(file).catch(() => "")).trim());
  if (!pid) return undefined;
  try {
    Deno.kill(pid, "SIGCONT");
    return pid;
  } catch {
    return undefined;
  }
}

/**
 * Starts a Deno process that outlives this one (its own session), with its pid and log in .sandbox/. Its `ready`
 * file, if it has one, is removed before it starts, so that only the new process can write it.
 */
async function daemon(name: string, args: string[], ready?: string): Promise<void> {
  if (await pidAlive(`${DIR}/${name}.pid`)) return;
  if (ready) await Deno.remove(ready).catch(() => {});
  const out = await new Deno.Command("bash", {
    args: ["-c", `setsid "$0" "$@" >>"${DIR}/${name}.log" 2>&1 </dev/null & echo $!`, Deno.execPath(), ...args],
    cwd: ROOT,
    stdout: "piped",
  }).output();
  await Deno.writeTextFile(`${DIR}/${name}.pid`, new TextDecoder().decode(out.stdout));
}

/** waitFor, but it fails at once, pointing at the log, when the daemon that is to bring it about has exited. */
async function whileAlive<T>(
  name: string,
  what: string,
  probe: () => Promise<T | undefined | false>,
  timeoutMs: number,
): Promise<T> {
  let exited = false;
  const found = await waitFor(async () => {
    exited = !await pidAlive(`${DIR}/${name}.pid`);
    return exited || await probe();
  }, { what, timeoutMs });
  if (exited) throw new Error(`${name} exited while waiting for ${what}: see .sandbox/${name}.log`);
  return found as T;
}

async function stopDaemon(name: string): Promise<void> {
  const pid = await pidAlive(`${DIR}/${name}.pid`);
  if (pid) {
    Deno.kill(pid, "SIGTERM");
    await waitFor(async () => !(await pidAlive(`${DIR}/${name}.pid`)), { what: `${name} to stop`, timeoutMs: 20_000 })
      .catch(() => Deno.kill(pid, "SIGKILL"));
  }
  await Deno.remove(`${DIR}/${name}.pid`).catch(() => {});
}

async function up(hosts: number): Promise<LabHost[]> {
  await Deno.mkdir(DIR, { recursive: true });
  const t0 = performance.now();
  const kubeconfig = `${DIR}/kubeconfig`;
  const running = await KubeClient.load(kubeconfig).then((c) => c.list(NAMESPACES).then(() => c)).catch(() =>
    undefined
  );
  // A sandbox already up may have older CRDs.
  if (running) await installCrds(running);
  const client = running ?? await (async () => {
    const cp = await startControlPlane({ dir: `${DIR}/controlplane`, detached: true, setup: installCrdsAt });
    await Deno.copyFile(cp.kubeconfigPath, kubeconfig);
    return await KubeClient.load(kubeconfig);
  })();
  const images = REAL ? [{ tarball: await builtPath(`${ROOT}test/jumpstarter/image.sh`), tag: EXPORTER_IMAGE }] : [];
  await Deno.writeTextFile(LAB_FILE, JSON.stringify(LAB) + "\n");
  // Hosts running with the other issuer's images are rebooted to import these (labhost.sh up).
  const labhosts = await startLabHosts({
    ...LAB,
    images,
    kvmMode: values["kvm-mode"],
    podman: values.podman,
    // the real exporter image (772 MB) is imported before sshd starts: minutes on a busy machine
    bootTimeoutSeconds: REAL ? 600 : undefined,
  }, hosts);
  await Deno.writeTextFile(`${DIR}/labhosts.json`, JSON.stringify(labhosts, null, 2) + "\n");
  let env = `KUBECONFIG=${kubeconfig}\nLABHOSTS=${DIR}/labhosts.json\n`;
  const issuer = REAL ? "real-jumpstarter" : "fake-jumpstarter";
  const switching = RUNNING_ISSUER !== -1 && ISSUERS[RUNNING_ISSUER] !== issuer;
  for (const other of ISSUERS.filter((d) => d !== issuer)) await stopDaemon(other);
  if (switching) await reissueCredentials(client);
  await daemon(
    issuer,
    ["run", "-A", "test/sandbox.ts", issuer, "--kubeconfig", kubeconfig],
    REAL ? REAL_READY : undefined,
  );
  if (REAL) env += await realClient(client, kubeconfig);
  await Deno.writeTextFile(`${DIR}/env`, env);
  client.close();
  console.log(
    `sandbox up in ${((performance.now() - t0) / 1000).toFixed(1)}s: ${client.server}, ` +
      `${labhosts.length} lab host(s) ${labhosts.map((h) => h.address).join(" ")}; env in .sandbox/env`,
  );
  return labhosts;
}

/**
 * Tokens one issuer gave do not hold for the other (the stand-in's are not even JWTs, and v0.7.1 reuses a token Secret
 * it finds): every Exporter's Secret goes and its status is emptied, so the issuer now running issues new ones, which
 * the controller then writes to the hosts.
 */
async function reissueCredentials(client: KubeClient): Promise<void> {
  const exporters = (await client.list<Exporter>(EXPORTERS)).items.filter((e) => e.status?.credential);
  for (const e of exporters) {
    const ns = e.metadata.namespace!;
    await client.delete(SECRETS, ns, e.status!.credential!.name).catch(() => {});
    // the whole status is the issuer's (this controller writes none of it): the new one starts from nothing, and no
    // stale Online or lease of the old one is left behind
    await client.mergePatch(EXPORTERS, ns, e.metadata.name!, { status: null }, "status").catch(() => {});
  }
  if (exporters.length) console.log(`credentials of ${exporters.length} Exporter(s) to be issued again`);
}

/**
 * Once the real controller accepts exporters: a Jumpstarter client and the lines of .sandbox/env that let anyone
 * lease from the shell: `$JMP shell --client-config $JMP_CLIENT_CONFIG -l ...`. The client is made with
 * `jmp admin create client` when the cluster has none (a fresh control plane), else its config gets the running
 * controller's CA and endpoint (each start of v0.7.1 brings a new self-signed certificate).
 */
async function realClient(client: KubeClient, kubeconfig: string): Promise<string> {
  await whileAlive(
    "real-jumpstarter",
    "the real Jumpstarter controller to accept an exporter",
    () => Deno.stat(REAL_READY).catch(() => undefined),
    900_000,
  );
  const jmp = await builtPath(`${ROOT}test/jumpstarter/jmp.sh`);
  const config = `${DIR}/client.yaml`;
  const ca = (await client.get<ConfigMap>(CONFIG_MAPS, NAMESPACE, CA_CONFIGMAP.name)).data?.[CA_CONFIGMAP.key] ?? "";
  const existing = await Deno.readTextFile(config).catch(() => undefined);
  if (existing && await client.find(JUMPSTARTER_CLIENTS, NAMESPACE, CLIENT)) {
    await Deno.writeTextFile(config, refreshedClientConfig(existing, { endpoint: JS_ENDPOINT, caPem: ca }));
  } else {
    await Deno.remove(config).catch(() => {});
    const out = await new Deno.Command(jmp, {
      args: ["admin", "create", "client", CLIENT, "-n", NAMESPACE, "--unsafe", "--nointeractive"]
        .concat(["--out", config, "--kubeconfig", kubeconfig]),
      stdout: "piped",
      stderr: "piped",
    }).output();
    if (!out.success) throw new Error(`jmp admin create client failed: ${new TextDecoder().decode(out.stderr)}`);
  }
  // `j`, which a lease's shell runs, is the client venv's too
  return `JMP=${jmp}\nJMP_CLIENT_CONFIG=${config}\nPATH=${jmp.replace(/\/jmp$/, "")}:$PATH\n`;
}

async function down(): Promise<void> {
  await stopDaemon("controller");
  for (const d of ISSUERS) await stopDaemon(d);
  await stopLabHosts(LAB);
  await stopControlPlane(`${DIR}/controlplane`);
  await Deno.remove(LAB_FILE).catch(() => {});
  console.log("sandbox down");
}

async function status(): Promise<void> {
  for (const d of ["controller", ...ISSUERS]) {
    const pid = await pidAlive(`${DIR}/${d}.pid`);
    console.log(`${d}: ${pid ? `running (pid ${pid})` : "stopped"}`);
  }
  const client = await KubeClient.load(`${DIR}/kubeconfig`).catch(() => undefined);
  const ok = await client?.list(NAMESPACES).then(() => true).catch(() => false);
  console.log(`control plane: ${ok ? `running at ${client!.server}` : "stopped"}`);
  const hosts: LabHost[] = JSON.parse(await Deno.readTextFile(`${DIR}/labhosts.json`).catch(() => "[]"));
  for (const h of hosts) {
    const r = await hostExec(h, "systemctl is-system-running").catch(() => undefined);
    console.log(`lab host ${h.name} ${h.address}: ${r ? r.stdout.trim() || "up" : "unreachable"}`);
  }
  client?.close();
}

async function ensure(client: KubeClient, r: typeof SECRETS, obj: KubeObject): Promise<void> {
  try {
    await client.create(r, obj);
  } catch (e) {
    if (!isConflict(e)) throw e;
  }
}

async function demo(): Promise<void> {
  const [host] = await up(1);
  const kubeconfig = `${DIR}/kubeconfig`;
  const client = await KubeClient.load(kubeconfig);
  await ensure(client, NAMESPACES, { metadata: { name: NAMESPACE } });
  // Step 2: what `kubectl create secret generic lab-ssh-key --from-file=ssh-privatekey=KEY -n jumpstarter` makes.
  const key = await Deno.readTextFile(host.privateKeyPath);
  await ensure(client, SECRETS, {
    metadata: { name: "lab-ssh-key", namespace: NAMESPACE },
    type: "Opaque",
    data: { "ssh-privatekey": Buffer.from(key).toString("base64") },
  } as KubeObject);
  // Steps 3 and 4, as written.
  await ensure(client, VIRTUAL_TARGET_CLASSES, await seedExample("virtualtargetclass.yaml", NAMESPACE));
  await ensure(client, EXPORTER_SETS, await seedExample("exporterset.yaml", NAMESPACE));
  // As the operator deploys it: the manifests' ServiceAccount and namespaced Role, not cluster-admin.
  const controllerKubeconfig = await installControllerRbac(client, kubeconfig, NAMESPACE, DIR);
  // manifests/clusterrole.yaml: the controller reads the cluster's id (kube-system's uid)
  await installClusterIdRole(client, NAMESPACE).catch((e) => isConflict(e) || Promise.reject(e));
  await daemon("controller", [
    "run",
    "-A",
    "main.ts",
    "--kubeconfig",
    controllerKubeconfig,
    `--namespace=${NAMESPACE}`,
    "--leader-elect",
    "--health-probe-bind-address=127.0.0.1:0",
    `--host-alias=${SEED_HOST}=${host.address}`,
  ]);
  console.log(
    "controller started as ServiceAccount jumpstarter/" +
      "jumpstarter-exporterset-qemu-ssh-jumpstarter-dev with manifests/role.yaml (log: .sandbox/controller.log); " +
      "waiting for the ExporterSet to become Available",
  );
  const t0 = performance.now();
  await whileAlive("controller", `ExporterSet ${NAMESPACE}/${SET} Available`, async () => {
    const s = await client.get<ExporterSet>(EXPORTER_SETS, NAMESPACE, SET);
    const avail = s.status?.conditions?.find((c) => c.type === "Available");
    return avail?.status === "True" && (s.status?.readyReplicas ?? 0) >= 1;
  }, 180_000);
  console.log(`\nExporterSet ${NAMESPACE}/${SET} is Available after ${((performance.now() - t0) / 1000).toFixed(1)}s`);
  if (REAL) {
    const e = await whileAlive(
      "real-jumpstarter",
      `an Exporter in ${NAMESPACE} Online, as the real Jumpstarter controller reports it`,
      async () =>
        (await client.list<Exporter>(EXPORTERS, NAMESPACE)).items.find((e) =>
          e.status?.conditions?.some((c) => c.type === "Online" && c.status === "True")
        ),
      180_000,
    );
    console.log(
      `Exporter ${NAMESPACE}/${e.metadata.name} is Online after ${((performance.now() - t0) / 1000).toFixed(1)}s`,
    );
  }
  await show(client, [host]);
  console.log(`
Scale it:     deno task sandbox scale N        (what \`kubectl scale exportersets/${SET} --replicas=N\` does:
                                               maxReplicas; or lease one: deno task sandbox lease)
Look around:  export KUBECONFIG=$PWD/.sandbox/kubeconfig; controller log in .sandbox/controller.log;
              ssh -i .sandbox/labhost/keys/id_ed25519 root@${host.address}
Tear down:    deno task sandbox down`);
  if (REAL) {
    console.log(`
Lease it as a user does (the real Jumpstarter, the real exporter and QEMU on the lab host), interactively (inside:
j qemu power on; j qemu console; ...; exit ends the lease and ExitAndReplace deploys a fresh target), or with a
command after --, e.g. -- j qemu power on:
  . .sandbox/env; $JMP shell --client-config $JMP_CLIENT_CONFIG -l ${SELECTOR}`);
  }
  client.close();
}

/** What a person wants to see: the ExporterSet table, the instances per host, and podman ps on each host. */
async function show(client: KubeClient, hosts: LabHost[]): Promise<void> {
  const sets = (await client.list<ExporterSet>(EXPORTER_SETS, NAMESPACE)).items;
  const row = (cols: (string | number | undefined)[]) =>
    cols.map((c, i) => String(c ?? "").padEnd([20, 18, 5, 5, 10, 7, 10][i])).join(" ");
  console.log(`\n${row(["NAME", "CLASS", "MIN", "MAX", "REPLICAS", "READY", "AVAILABLE"])}`);
  for (const s of sets) {
    console.log(row([
      s.metadata.name,
      s.spec.virtualTargetClassName,
      s.spec.minReplicas,
      s.spec.maxReplicas,
      s.status?.replicas,
      s.status?.readyReplicas,
      s.status?.availableReplicas,
    ]));
  }
  const exporters = (await client.list<Exporter>(EXPORTERS, NAMESPACE)).items;
  console.log("\nInstances per host:");
  for (const e of exporters) {
    const host = e.metadata.annotations?.[HOST_ANNOTATION] ?? "(not deployed yet)";
    const leased = e.status?.leaseRef ? ", leased" : "";
    console.log(`  ${host}: ${e.metadata.name} (${e.spec?.enabled === false ? "draining" : "enabled"}${leased})`);
  }
  for (const h of hosts) {
    const ps = await hostExec(
      h,
      `podman ps -a --filter "name=-(runtime|exporter)$" --format '{{.Names}}\t{{.Status}}'`,
    );
    console.log(`\npodman ps -a on ${SEED_HOST} (${h.address}):\n${ps.stdout.replace(/^/gm, "  ").trimEnd()}`);
  }
}

/** `kubectl scale exportersets/NAME --replicas=N`: the scale subresource, which sets spec.maxReplicas. */
async function scale(n: number): Promise<void> {
  const client = await KubeClient.load(`${DIR}/kubeconfig`);
  await client.request("PATCH", `${resourcePath(EXPORTER_SETS, { namespace: NAMESPACE, name: SET })}/scale`, {
    body: { spec: { replicas: n } },
    contentType: "application/merge-patch+json",
  });
  console.log(`scaled ${NAMESPACE}/${SET}: maxReplicas=${n}`);
  client.close();
}

/** Marks the oldest idle exporter leased, as Jumpstarter does when a lease takes it: the warm buffer grows by one. */
async function lease(): Promise<void> {
  if (await pidAlive(`${DIR}/real-jumpstarter.pid`)) {
    throw new Error(
      `the real Jumpstarter runs here: lease with \`. .sandbox/env; $JMP shell --client-config ` +
        `$JMP_CLIENT_CONFIG -l ${SELECTOR}\``,
    );
  }
  const client = await KubeClient.load(`${DIR}/kubeconfig`);
  const idle = (await client.list<Exporter>(EXPORTERS, NAMESPACE)).items.filter((e) => !e.status?.leaseRef);
  if (!idle.length) throw new Error("no idle exporter to lease");
  const e = idle[0];
  await client.mergePatch(
    EXPORTERS,
    NAMESPACE,
    e.metadata.name!,
    { status: { leaseRef: { name: "sandbox" } } },
    "status",
  );
  console.log(`leased ${e.metadata.name}; the controller now keeps minAvailableReplicas idle next to it`);
  client.close();
}

switch (command) {
  case "up":
    await up(Number(values.hosts));
    if (REAL) console.log("lease from the shell: . .sandbox/env; $JMP shell --client-config $JMP_CLIENT_CONFIG -l ...");
    break;
  case "down":
    await down();
    break;
  case "status":
    await status();
    break;
  case "demo":
    await demo();
    break;
  case "scale":
    await scale(Number(positionals[1]));
    break;
  case "lease":
    await lease();
    break;
  case "show": {
    const client = await KubeClient.load(`${DIR}/kubeconfig`);
    await show(client, JSON.parse(await Deno.readTextFile(`${DIR}/labhosts.json`)));
    client.close();
    break;
  }
  case "host": {
    // a lab host's power, as a pool's failover sees it: stop keeps its keys and disks, start brings it back
    const [, action, name] = positionals;
    const hosts: LabHost[] = JSON.parse(await Deno.readTextFile(`${DIR}/labhosts.json`));
    const host = hosts.find((h) => h.name === name);
    if ((action !== "stop" && action !== "start") || !host) {
      console.error(`usage: host stop|start NAME, NAME one of ${hosts.map((h) => h.name).join(", ")}`);
      Deno.exit(2);
    }
    if (action === "stop") await powerOffLabHost(LAB, host.name);
    else await powerOnLabHost({ ...LAB, kvmMode: values["kvm-mode"] }, host);
    console.log(`${host.name} (${host.address}): ${action === "stop" ? "powered off" : "up, sshd answers"}`);
    break;
  }
  case "fake-jumpstarter": {
    const client = await KubeClient.load(values.kubeconfig);
    const fake = startFakeJumpstarter(client);
    await new Promise<void>((r) => Deno.addSignalListener("SIGTERM", () => r()));
    await fake.stop();
    client.close();
    break;
  }
  case "real-jumpstarter": {
    const js = await startRealJumpstarter({
      kubeconfig: values.kubeconfig!,
      namespace: NAMESPACE,
      bridgeAddress: `${LAB.subnet}.1`,
      dir: `${DIR}/jumpstarter`,
    });
    await Deno.writeTextFile(REAL_READY, js.endpoint);
    console.log(`real Jumpstarter controller at ${js.endpoint}; logs ${js.logs.controller}, ${js.logs.router}`);
    await new Promise<void>((r) => Deno.addSignalListener("SIGTERM", () => r()));
    await js.stop();
    break;
  }
  default:
    console.error(
      `unknown command "${command}": use up [--hosts N] | down | status | demo | show | scale N | lease | ` +
        "host stop|start NAME",
    );
    Deno.exit(2);
}
