/**
 * The world of the end-to-end scenarios (test/e2e_*_test.ts): a fresh namespace on the shared control plane, the real
 * controller in this process scoped to it, the FakeJumpstarterController issuing credentials, and helpers that look
 * at the lab hosts the way a person would (systemctl, podman, journalctl over the system ssh client).
 */
import { Buffer } from "node:buffer";
import { freshNamespace, seedExample, testEnv, waitFor } from "./env.ts";
import { type FakeJumpstarter, startFakeJumpstarter } from "./fake_jumpstarter.ts";
import { hostExec, type LabHost } from "./labhost/labhost.ts";
import { KubeClient } from "../src/kube/client.ts";
import {
  EVENTS,
  EXPORTER_SETS,
  EXPORTERS,
  JUMPSTARTER_LEASES,
  NAMESPACES,
  SECRETS,
  VIRTUAL_TARGET_CLASSES,
} from "../src/kube/resources.ts";
import { readClusterId } from "../src/run.ts";
import type { Exporter, ExporterSet, KubeObject, Lease, Secret, VirtualTargetClass } from "../src/api/types.ts";
import { configMountDir, configPath, quadletPath, volumeName } from "../src/host/render.ts";
import { SshPool, type SshPoolOptions, type SshTarget } from "../src/host/ssh.ts";
import { LabHosts } from "../src/host/lab.ts";
import { Controller } from "../src/provision/controller.ts";
import { HOST_ANNOTATION } from "../src/provision/marks.ts";
import { pinHostKey } from "../src/provision/host_keys.ts";
import type { LabTarget } from "../src/provision/credentials.ts";
import { createLogger } from "../src/observe/log.ts";

export const SEED_HOST = "lab-host-01.example.com";
/** A second lab host name, resolved through the (mutable) alias table to the second lab host. */
export const SECOND_HOST = "lab-host-02.example.com";
export const SET = "aarch64-ssh-pool";
export const CLASS = "qemu-ssh-aarch64";

export interface World {
  client: KubeClient;
  ns: string;
  /** The lab host behind SEED_HOST. */
  host: LabHost;
  /** The other lab host (behind SECOND_HOST). */
  host2: LabHost;
  controller: Controller;
  hosts: LabHosts;
  pool: SshPool;
  fake: FakeJumpstarter;
  /** Host name -> address, read on every SSH command: tests may repoint a name. */
  aliases: Record<string, string>;
  stop(): Promise<void>;
}

export interface WorldOptions {
  /** false: the test runs controllers of its own (started later with w.controller.start() if wanted). */
  startController?: boolean;
  resyncMs?: number;
  concurrency?: number;
  pool?: SshPoolOptions;
  /** Another cluster's admin kubeconfig (default: the run's control plane). */
  kubeconfig?: string;
  /** The namespace to create (default: a fresh random name). */
  namespace?: string;
  /** Names the cluster in the instances' ownership (default: read from the cluster, as `run` does). */
  clusterId?: string;
  sweepMs?: number;
  teardownGraceMs?: number;
}

export async function world(opts: WorldOptions = {}): Promise<World> {
  const env = await testEnv();
  const client = await KubeClient.load(opts.kubeconfig ?? env.kubeconfig);
  const ns = opts.namespace ?? await freshNamespace(client, "e2e");
  if (opts.namespace) await client.create(NAMESPACES, { metadata: { name: ns } });
  const [host, host2] = env.labhosts;
  const fake = startFakeJumpstarter(client, ns);
  const aliases: Record<string, string> = { [SEED_HOST]: host.address, [SECOND_HOST]: host2.address };
  // the cluster's own id, read as `run` reads it
  const ours = ourController(client, ns, aliases, { ...opts, clusterId: await readClusterId(client, opts.clusterId) });
  if (opts.startController !== false) await ours.controller.start();
  return {
    client,
    ns,
    host,
    host2,
    ...ours,
    fake,
    aliases,
    async stop() {
      await ours.controller.stop();
      await fake.stop();
      await ours.pool.close();
      client.close();
    },
  };
}

/**
 * This project's controller in the test process, scoped to one namespace, reaching lab hosts by the (mutable) alias
 * table and pinning host keys on first use, as `run` does. Not started.
 */
export function ourController(
  client: KubeClient,
  namespace: string,
  aliases: Record<string, string>,
  opts: Omit<WorldOptions, "startController"> & { clusterId: string },
): { controller: Controller; hosts: LabHosts; pool: SshPool } {
  const pool = new SshPool({
    ...opts.pool,
    onHostKeyAccepted: (t, line) => pinHostKey(client, t as LabTarget, line),
  });
  const hosts = new LabHosts(pool, { hostAliases: aliases });
  const controller = new Controller({
    client,
    hosts,
    log: createLogger({ level: Deno.env.get("QSP_TEST_LOG") ? "debug" : "error" }),
    provisioner: "qemu-ssh.jumpstarter.dev",
    namespace,
    resyncMs: opts.resyncMs ?? 60_000,
    sweepMs: opts.sweepMs ?? 3_600_000,
    teardownGraceMs: opts.teardownGraceMs,
    clusterId: opts.clusterId,
    concurrency: opts.concurrency,
  });
  return { controller, hosts, pool };
}

/** An SSH target for looking at a lab host directly (by address, strict host keys), not through the controller. */
export async function directTarget(host: LabHost): Promise<SshTarget> {
  return {
    host: host.address,
    port: host.port,
    user: host.user,
    privateKey: await Deno.readTextFile(host.privateKeyPath),
    knownHosts: await Deno.readTextFile(host.knownHostsPath),
    hostKeyPolicy: "Strict",
  };
}

/** Step 2 of the seed: `kubectl create secret generic lab-ssh-key --from-file=ssh-privatekey=...`, plus extra keys. */
export async function createKeySecret(w: World, extra: Record<string, string> = {}): Promise<void> {
  const key = await Deno.readTextFile(w.host.privateKeyPath);
  const data: Record<string, string> = { "ssh-privatekey": b64(key) };
  for (const [k, v] of Object.entries(extra)) data[k] = b64(v);
  await w.client.create<Secret>(SECRETS, { metadata: { name: "lab-ssh-key", namespace: w.ns }, type: "Opaque", data });
}

export async function createClass(w: World, edit: (c: VirtualTargetClass) => void = () => {}): Promise<void> {
  const cls = await seedExample("virtualtargetclass.yaml", w.ns) as VirtualTargetClass;
  edit(cls);
  await w.client.create(VIRTUAL_TARGET_CLASSES, cls as KubeObject);
}

export async function createSet(
  w: World,
  edit: (s: ExporterSet) => void = () => {},
): Promise<ExporterSet> {
  const set = await seedExample("exporterset.yaml", w.ns) as ExporterSet;
  edit(set);
  return await w.client.create(EXPORTER_SETS, set as KubeObject) as ExporterSet;
}

/** Steps 2 to 4 of the seed, as written, with an optional edit of the ExporterSet. */
export async function applySeed(w: World, setOverride: (s: ExporterSet) => void = () => {}): Promise<void> {
  await createKeySecret(w);
  await createClass(w);
  await createSet(w, setOverride);
}

export const b64 = (s: string): string => Buffer.from(s).toString("base64");
export const unb64 = (s: string): string => Buffer.from(s, "base64").toString("utf8");

export const exporters = async (w: World): Promise<Exporter[]> =>
  (await w.client.list<Exporter>(EXPORTERS, w.ns)).items;
export const getSet = (w: World, name = SET): Promise<ExporterSet> =>
  w.client.get<ExporterSet>(EXPORTER_SETS, w.ns, name);
export const cond = (s: ExporterSet, type: string) => s.status?.conditions?.find((c) => c.type === type);
export const ownedBy = (e: Exporter, set: string): boolean => e.metadata.ownerReferences?.[0]?.name === set;

export interface KubeEvent extends KubeObject {
  type: string;
  reason: string;
  message: string;
  count?: number;
  involvedObject: { kind: string; name: string };
}

/** A lease under way on the Exporter, as Jumpstarter records it; returns the Lease's name. */
export async function lease(w: World, exporter: string): Promise<string> {
  const l = await w.client.create<Lease>(JUMPSTARTER_LEASES, {
    metadata: { generateName: "lease-", namespace: w.ns },
    spec: { selector: { matchLabels: { board: "aarch64-qemu" } } },
  });
  const name = l.metadata.name!;
  await w.client.mergePatch(JUMPSTARTER_LEASES, w.ns, name, { status: { exporterRef: { name: exporter } } }, "status");
  await w.client.mergePatch(EXPORTERS, w.ns, exporter, { status: { leaseRef: { name } } }, "status");
  return name;
}

export const events = async (w: World): Promise<KubeEvent[]> => (await w.client.list<KubeEvent>(EVENTS, w.ns)).items;

/** Waits until the set has `n` exporters, each deployed and Available in the set's status. */
export async function waitReady(w: World, n: number, set = SET, timeoutMs = 90_000): Promise<Exporter[]> {
  return await waitFor(async () => {
    const s = await getSet(w, set);
    const es = (await exporters(w)).filter((e) => ownedBy(e, set) && !e.metadata.deletionTimestamp);
    return s.status?.readyReplicas === n && es.length === n &&
        es.every((e) => e.metadata.annotations?.[HOST_ANNOTATION])
      ? es
      : undefined;
  }, { what: `${set}: ${n} ready exporters`, timeoutMs });
}

/** The stand-in exporter's last report line, once it reached its runtime (launcher, tcp and kvm checked). */
export async function waitStandinUp(host: LabHost, name: string, timeoutMs = 60_000): Promise<string> {
  return await waitFor(async () => {
    const line = (await journal(host, name)).split("\n").filter((l) => l.includes("standin-exporter: name=")).pop();
    return line && /launcher=ok tcp=ok/.test(line) ? line : undefined;
  }, { what: `the stand-in exporter ${name} to reach its runtime on ${host.name}`, timeoutMs });
}

export async function sh(host: LabHost, command: string): Promise<string> {
  const r = await hostExec(host, command);
  if (r.code !== 0) throw new Error(`${host.name}: ${command}: exit ${r.code}: ${r.stderr}`);
  return r.stdout;
}

export const journal = (host: LabHost, name: string): Promise<string> =>
  sh(host, `journalctl -o cat --no-pager -u ${name}-exporter.service || true`);

/** `systemctl is-active` of both units, e.g. "active active". */
export async function unitStates(host: LabHost, name: string): Promise<string> {
  const r = await hostExec(host, `systemctl is-active ${name}-runtime.service ${name}-exporter.service`);
  return r.stdout.trim().split("\n").join(" ");
}

/** Start time and PID of both containers: equal values mean neither was restarted. */
export async function containerIdentity(host: LabHost, name: string): Promise<string> {
  return (await sh(
    host,
    `podman inspect --format '{{.Name}} {{.State.StartedAt}} {{.State.Pid}}' ${name}-runtime ${name}-exporter`,
  )).trim();
}

/**
 * Everything of the instances on the host, as one text to compare byte for byte: the digests of their files, their
 * units' invocations (a restart starts a new one), their containers' ids and start times, their volumes.
 */
export async function instanceState(host: LabHost, names: string[]): Promise<string> {
  if (names.length === 0) return "";
  const q = (s: string) => `'${s}'`;
  const files = names.flatMap((n) => [
    quadletPath(`${n}-runtime`),
    quadletPath(`${n}-exporter`),
    configPath(n),
    `${configMountDir(n)}/${n}.yaml`,
  ]);
  const containers = names.flatMap((n) => [`${n}-runtime`, `${n}-exporter`]);
  // what is missing is part of the state (its error message), not a failure to read it
  return (await sh(
    host,
    `{ sha256sum ${files.map(q).join(" ")}; ` +
      // one line per unit, naming it (callers pick an instance's lines by its name)
      `for u in ${containers.join(" ")}; do ` +
      `echo "$u.service $(systemctl show -p InvocationID,ActiveEnterTimestamp --value "$u.service" | tr '\n' ' ')"; ` +
      `done; ` +
      `podman inspect -f '{{.Name}} {{.Id}} {{.State.StartedAt}} {{.RestartCount}}' ${containers.join(" ")}; ` +
      `podman volume inspect -f '{{.Name}} {{.CreatedAt}}' ${names.map(volumeName).join(" ")}; } 2>&1 || true`,
  )).trim();
}

/** A lease under way on the Exporter, as Jumpstarter records it (the Lease's status and the Exporter's leaseRef). */
export async function leaseExporter(
  client: KubeClient,
  ns: string,
  exporter: string,
  selector: Record<string, string>,
): Promise<void> {
  const l = await client.create<Lease>(JUMPSTARTER_LEASES, {
    metadata: { generateName: "lease-", namespace: ns },
    spec: { selector: { matchLabels: selector } },
  });
  await client.mergePatch(JUMPSTARTER_LEASES, ns, l.metadata.name!, {
    status: { exporterRef: { name: exporter }, ended: false },
  }, "status");
  await client.mergePatch(EXPORTERS, ns, exporter, { status: { leaseRef: { name: l.metadata.name } } }, "status");
}

/** Whether any trace of the instance is on the host: files, the /disk image, containers, volumes, units. */
export async function hostHas(host: LabHost, name: string): Promise<boolean> {
  const r = await hostExec(
    host,
    `ls /etc/containers/systemd/ /etc/jumpstarter/exporters/ /var/lib/qemu-ssh.jumpstarter.dev/disks/ 2>/dev/null | ` +
      `grep -c ${name} || true; ` +
      `podman ps -a --format '{{.Names}}' | grep -c ${name} || true; ` +
      `podman volume ls -q | grep -c ${name} || true; ` +
      `systemctl list-units --all --no-legend '${name}-*' | grep -c . || true`,
  );
  return !r.stdout.trim().split("\n").every((n) => n.trim() === "0");
}

/** The host's own known_hosts lines, recorded under `name` instead of its address. */
export async function knownHostsAs(host: LabHost, name: string): Promise<string> {
  const lines = (await Deno.readTextFile(host.knownHostsPath)).split("\n");
  return lines.filter((l) => l.startsWith(`${host.address} `)).map((l) => `${name}${l.slice(host.address.length)}`)
    .join("\n") + "\n";
}

/**
 * Pulls the lab host's network cable: its interface goes down in its network namespace, so packets to it vanish
 * (connects fail, an open SSH connection hangs) until `plugIn`.
 */
export async function unplug(host: LabHost): Promise<void> {
  await ipLink(host, "down");
}

export async function plugIn(host: LabHost): Promise<void> {
  await ipLink(host, "up");
}

async function ipLink(host: LabHost, state: "up" | "down"): Promise<void> {
  // labhost.sh names a host's network namespace <bridge>-<host>
  const netns = `${(await testEnv()).labNet.bridge}-${host.name}`;
  const out = await new Deno.Command("ip", { args: ["-n", netns, "link", "set", "eth0", state], stderr: "piped" })
    .output();
  if (!out.success) throw new Error(`ip -n ${netns} link set eth0 ${state}: ${new TextDecoder().decode(out.stderr)}`);
}

/** Reconciles finished so far (successful or not). */
export function reconciles(w: World): number {
  const m = w.controller.metrics.reconcileTotal;
  return m.get({ controller: "exporterset", result: "success" }) +
    m.get({ controller: "exporterset", result: "error" });
}

export const seconds = (since: number): string => `${((performance.now() - since) / 1000).toFixed(1)}s`;
