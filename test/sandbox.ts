/**
 * `deno task sandbox up [--hosts N] [--jumpstarter fake|real] [--kvm-mode 0660|0666] [--podman 4.9.3] | down |
 * status | demo | show | scale N | lease | host stop|start NAME`: a local world to run the provisioner in.
 *
 * up:     a real control plane (CRDs installed), N real lab hosts, and what issues exporter credentials: the
 *         FakeJumpstarterController (--jumpstarter fake, the default), or the real Jumpstarter controller and router
 *         with the real exporter image on the lab hosts (--jumpstarter real; .sandbox/env then also has JMP and
 *         JMP_CLIENT_CONFIG for `jmp shell`); writes .sandbox/kubeconfig, .sandbox/env and .sandbox/labhosts.json.
 *         Each lab host has a /dev/kvm node of its own, 0660 root:kvm as Debian and Ubuntu ship it, or --kvm-mode's
 *         (0666 as Fedora and RHEL ship it), applied when a host boots.
 *         --podman VERSION: the lab hosts run that Podman 4.x, built from source, instead of Debian's 5.4 (a host
 *         keeps the Podman it was created with: `down` first to change it).
 * demo:   up with one host, then the feature description's examples exactly as written (Secret, VirtualTargetClass,
 *         ExporterSet in namespace jumpstarter; the class's host lab-host-01.example.com is mapped to the first lab
 *         host with --host-alias), starts the controller, and waits until the exporter runs on the host.
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
import { installControllerRbac } from "./rbac.ts";
import { startFakeJumpstarter } from "./fake_jumpstarter.ts";
import { CA_CONFIGMAP, startRealJumpstarter } from "./jumpstarter/controller.ts";
import { isConflict, KubeClient, resourcePath } from "../src/kube/client.ts";
import { HOST_ANNOTATION } from "../src/provision/marks.ts";
import {
  CONFIG_MAPS,
  EXPORTER_SETS,
  EXPORTERS,
  NAMESPACES,
  SECRETS,
  VIRTUAL_TARGET_CLASSES,
} from "../src/kube/resources.ts";
import type { Exporter, ExporterSet, KubeObject } from "../src/api/types.ts";

const ROOT = new URL("../", import.meta.url).pathname;
const DIR = `${ROOT}.sandbox`;
const LAB: LabNet = { dir: `${DIR}/labhost`, bridge: "qsplab0", subnet: "10.77.0" };
const EXPORTER_IMAGE = "quay.io/jumpstarter-dev/jumpstarter:latest";
const SEED_HOST = "lab-host-01.example.com";
const NAMESPACE = "jumpstarter";
const SET = "aarch64-ssh-pool";

const { positionals, values } = parseArgs({
  args: Deno.args,
  allowPositionals: true,
  options: {
    hosts: { type: "string", default: "1" },
    kubeconfig: { type: "string" },
    jumpstarter: { type: "string", default: "fake" },
    "kvm-mode": { type: "string", default: "0660" },
    podman: { type: "string" },
  },
});
const command = positionals[0] ?? "status";
if (values.jumpstarter !== "fake" && values.jumpstarter !== "real") {
  console.error(`--jumpstarter must be fake or real, not "${values.jumpstarter}"`);
  Deno.exit(2);
}
const REAL = values.jumpstarter === "real";
/** The credential issuers, one of which runs: the stand-in, or the real Jumpstarter controller and router. */
const ISSUERS = ["fake-jumpstarter", "real-jumpstarter"];

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

/** Starts a Deno process that outlives this one (its own session), with its pid and log in .sandbox/. */
async function daemon(name: string, args: string[]): Promise<void> {
  if (await pidAlive(`${DIR}/${name}.pid`)) return;
  const out = await new Deno.Command("bash", {
    args: ["-c", `setsid "$0" "$@" >>"${DIR}/${name}.log" 2>&1 </dev/null & echo $!`, Deno.execPath(), ...args],
    cwd: ROOT,
    stdout: "piped",
  }).output();
  await Deno.writeTextFile(`${DIR}/${name}.pid`, new TextDecoder().decode(out.stdout));
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
  const labhosts = await startLabHosts({ ...LAB, images, kvmMode: values["kvm-mode"], podman: values.podman }, hosts);
  await Deno.writeTextFile(`${DIR}/labhosts.json`, JSON.stringify(labhosts, null, 2) + "\n");
  let env = `KUBECONFIG=${kubeconfig}\nLABHOSTS=${DIR}/labhosts.json\n`;
  const issuer = REAL ? "real-jumpstarter" : "fake-jumpstarter";
  for (const other of ISSUERS.filter((d) => d !== issuer)) await stopDaemon(other);
  await daemon(issuer, ["run", "-A", "test/sandbox.ts", issuer, "--kubeconfig", kubeconfig]);
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
 * Once the real controller has published its CA: a Jumpstarter client (`jmp admin create client`) and the lines of
 * .sandbox/env that let anyone lease from the shell: `$JMP shell --client-config $JMP_CLIENT_CONFIG -l ...`.
 */
async function realClient(client: KubeClient, kubeconfig: string): Promise<string> {
  await waitFor(() => client.find(CONFIG_MAPS, NAMESPACE, CA_CONFIGMAP.name), {
    what: `the real Jumpstarter controller (log: .sandbox/jumpstarter/) to publish its CA`,
    timeoutMs: 900_000,
  });
  const jmp = await builtPath(`${ROOT}test/jumpstarter/jmp.sh`);
  const config = `${DIR}/client.yaml`;
  if (!await Deno.stat(config).catch(() => undefined)) {
    const out = await new Deno.Command(jmp, {
      args: ["admin", "create", "client", "sandbox", "-n", NAMESPACE, "--unsafe", "--nointeractive"]
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
  await waitFor(async () => {
    const s = await client.get<ExporterSet>(EXPORTER_SETS, NAMESPACE, SET);
    const avail = s.status?.conditions?.find((c) => c.type === "Available");
    return avail?.status === "True" && (s.status?.readyReplicas ?? 0) >= 1;
  }, { what: `ExporterSet ${NAMESPACE}/${SET} Available`, timeoutMs: 180_000 });
  console.log(`\nExporterSet ${NAMESPACE}/${SET} is Available after ${((performance.now() - t0) / 1000).toFixed(1)}s`);
  await show(client, [host]);
  if (REAL) {
    console.log(`
Lease it as a user does (the real Jumpstarter, the real exporter and QEMU on the lab host):
  . .sandbox/env; $JMP shell --client-config $JMP_CLIENT_CONFIG -l board=aarch64-qemu,virtual=true
  (inside: j qemu power on; j qemu console; ...; exit ends the lease and ExitAndReplace deploys a fresh target)`);
  }
  console.log(`
Scale it:     deno task sandbox scale N        (what \`kubectl scale exportersets/${SET} --replicas=N\` does:
                                               maxReplicas; or lease one: deno task sandbox lease)
Look around:  export KUBECONFIG=$PWD/.sandbox/kubeconfig; controller log in .sandbox/controller.log;
              ssh -i .sandbox/labhost/keys/id_ed25519 root@${host.address}
Tear down:    deno task sandbox down`);
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
      "the real Jumpstarter runs here: lease with `. .sandbox/env; $JMP shell --client-config " +
        "$JMP_CLIENT_CONFIG -l board=aarch64-qemu,virtual=true`",
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
