/**
 * The benchmark's world: its own lab network, the fleet shapes it deploys, the Kubernetes objects that ask the
 * controller for them, and the very same instances rendered by the project's own code for the other deployers.
 */
import { Buffer } from "node:buffer";
import { seedExample } from "../test/env.ts";
import { FAKE_ENDPOINT } from "../test/fake_jumpstarter.ts";
import { directTarget } from "../test/e2e_world.ts";
import { type LabHost, type LabNet, startLabHosts, stopLabHosts } from "../test/labhost/labhost.ts";
import type { ExporterSet, Secret, VirtualTargetClass } from "../src/api/types.ts";
import { type RenderedInstance, renderInstance } from "../src/host/render.ts";
import type { HostFacts } from "../src/host/host_facts.ts";
import { LabHosts } from "../src/host/lab.ts";
import { SshPool } from "../src/host/ssh.ts";
import { resolveParams } from "../src/provision/params.ts";

/** Never the test suite's or the sandbox's network, so the benchmark can run beside them. */
export const LAB: LabNet = { dir: "/tmp/qsp-bench-lab", bridge: "qsplab8", subnet: "10.84.0" };

/** Instances per lab host: host i carries fleet[i]. */
export type Fleet = number[];

export const instanceCount = (f: Fleet) => f.reduce((a, b) => a + b, 0);
export const fleetLabel = (f: Fleet) =>
  f.every((r) => r === f[0]) ? `${f.length}x${f[0]}` : `${f.length}x(${f.join(",")})`;

/** The token every bench-rendered config carries (the controller's instances get real fake ones). */
export const FIXED_TOKEN = "bench.fake-jwt.not-a-secret";
const SECRET_NAME = "lab-ssh-key";

export async function startLab(hosts: number): Promise<LabHost[]> {
  // Ansible's modules need Python on the managed hosts (the provisioner needs only sh). labhost.sh reads its
  // environment, and the extra package gives this lab its own cached base image.
  Deno.env.set("LAB_EXTRA_PKGS", "python3");
  // eight hosts booting at once on a busy 2-core machine can take longer than labhost.sh's default 90 s
  if (!Deno.env.get("LAB_BOOT_TIMEOUT")) Deno.env.set("LAB_BOOT_TIMEOUT", "300");
  return await startLabHosts(LAB, hosts);
}

export const stopLab = () => stopLabHosts(LAB);

/** How the bench itself reaches a lab host: the lab key, strict host key checking against the lab's known_hosts. */
export const sshTargetOf = directTarget;

/** The seed's VirtualTargetClass and ExporterSet, one set per host pinned to it, and the credentials Secret. */
export interface Seed {
  secret: Secret;
  cls: VirtualTargetClass;
  sets: { host: LabHost; set: ExporterSet }[];
}

export async function seedFor(namespace: string, hosts: LabHost[], fleet: Fleet): Promise<Seed> {
  const b64 = (s: string) => Buffer.from(s).toString("base64");
  const [host0] = hosts;
  const secret: Secret = {
    metadata: { name: SECRET_NAME, namespace },
    type: "Opaque",
    // known_hosts in the Secret makes the controller check host keys strictly, as the other deployers do
    data: {
      "ssh-privatekey": b64(await Deno.readTextFile(host0.privateKeyPath)),
      known_hosts: b64(await Deno.readTextFile(host0.knownHostsPath)),
    },
  };
  const cls = await seedExample("virtualtargetclass.yaml", namespace) as VirtualTargetClass;
  cls.spec.credentialsSecretRef = { name: SECRET_NAME };
  const template = await seedExample("exporterset.yaml", namespace) as ExporterSet;
  const sets = fleet.map((replicas, i) => {
    const host = hosts[i];
    const set = structuredClone(template);
    set.metadata.name = `bench-${host.name}`;
    set.spec.minReplicas = replicas;
    set.spec.maxReplicas = replicas;
    set.spec.minAvailableReplicas = 0;
    set.spec.parameters = { host: { name: host.address } };
    return { host, set };
  });
  return { secret, cls, sets };
}

/** A lab host's facts, which every host of one lab shares (one image): what the files are rendered for. */
export async function labFacts(host: LabHost): Promise<HostFacts | undefined> {
  const pool = new SshPool();
  try {
    return (await new LabHosts(pool).inspect(await directTarget(host))).facts;
  } finally {
    await pool.close();
  }
}

/**
 * What the controller would put on each host for the seed's sets, rendered by the project's own code for the lab's
 * facts (labFacts).
 */
export function renderFleet(
  seed: Seed,
  fleet: Fleet,
  facts: HostFacts | undefined,
): { host: LabHost; instances: RenderedInstance[] }[] {
  return seed.sets.map(({ host, set }, i) => {
    const resolved = resolveParams(seed.cls, set);
    if (!resolved.ok) throw new Error(`seed parameters rejected: ${JSON.stringify(resolved.errors)}`);
    const instances = Array.from({ length: fleet[i] }, (_, k) =>
      renderInstance({
        namespace: "bench",
        name: `${set.metadata.name}-${k}`,
        uid: `bench-${host.name}-${k}`,
        setName: set.metadata.name!,
        params: resolved.params,
        drivers: set.spec.template?.spec?.drivers ?? [],
        exitOnLeaseEnd: true,
        endpoint: FAKE_ENDPOINT,
        token: FIXED_TOKEN,
        caBundle: "",
      }, facts));
    return { host, instances };
  });
}

export type Placement = ReturnType<typeof renderFleet>;
