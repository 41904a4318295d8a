/**
 * The shared environment of one test run: a real control plane and real lab hosts, started once by test/run.ts and
 * described to the test files by the JSON file named in $QSP_TEST_ENV. Each test takes a fresh namespace.
 */
import { parse, parseAllDocuments } from "yaml";
import type { KubeObject } from "../src/api/types.ts";
import { CRDS, JUMPSTARTER_CRDS } from "../src/api/crds.ts";
import { isConflict, KubeClient } from "../src/kube/client.ts";
import { CRDS as CRD_RESOURCE, NAMESPACES } from "../src/kube/resources.ts";
import type { LabHost, LabNet } from "./labhost/labhost.ts";
import type { HostInspection, HostUnits } from "../src/host/remote.ts";
import type { RenderedInstance } from "../src/host/render.ts";
import { drift, starting, unitsLook } from "../src/host/drift.ts";
import { startingCheckMs } from "../src/provision/deploy.ts";
import { STARTING_WAIT_MS } from "../src/provision/host_checks.ts";
import type { UnitsOptions } from "../src/host/lab.ts";

export interface TestEnv {
  kubeconfig: string;
  /** Kubeconfigs for restricted identities, by user name (see test/run.ts). */
  userKubeconfigs: Record<string, string>;
  labhosts: LabHost[];
  /** The run's lab network; tests that boot hosts of their own derive theirs from it (see privateLabNet). */
  labNet: LabNet;
  controlPlaneDir: string;
}

export async function testEnv(): Promise<TestEnv> {
  const path = Deno.env.get("QSP_TEST_ENV");
  if (!path) {
    throw new Error("QSP_TEST_ENV is not set: run the suite with `deno task test` (it starts the environment)");
  }
  return JSON.parse(await Deno.readTextFile(path)) as TestEnv;
}

/**
 * A lab network of a test's own (for tests of the harness and of SSH faults), derived from the run's so that runs
 * side by side on one machine never share a bridge or subnet: tag 1..9 gives bridge `<run bridge><tag>` and subnet
 * `a.b.(c+tag)`.
 */
export async function privateLabNet(tag: number): Promise<LabNet> {
  const run = Deno.env.get("QSP_TEST_ENV") ? (await testEnv()).labNet : { bridge: "qsplabt", subnet: "10.76.0" };
  const [a, b, c] = run.subnet.split(".").map(Number);
  const bridge = `${run.bridge}${tag}`;
  return { dir: `/tmp/qsp-${bridge}`, bridge, subnet: `${a}.${b}.${c + tag}` };
}

export async function freshNamespace(client: KubeClient, prefix = "t"): Promise<string> {
  const name = `${prefix}-${crypto.randomUUID().slice(0, 8)}`;
  await client.create(NAMESPACES, { metadata: { name } });
  return name;
}

/** Creates or updates our CRDs and the test copies of Jumpstarter's, then waits until the API server serves them. */
export async function installCrds(client: KubeClient): Promise<void> {
  const all = [...CRDS, ...JUMPSTARTER_CRDS];
  for (const crd of all) {
    try {
      await client.create(CRD_RESOURCE, crd as unknown as KubeObject);
    } catch (e) {
      if (!isConflict(e)) throw e;
      const current = await client.get<KubeObject>(CRD_RESOURCE, undefined, crd.metadata.name);
      await client.replace(
        CRD_RESOURCE,
        {
          ...crd,
          metadata: { ...crd.metadata, resourceVersion: current.metadata.resourceVersion },
        } as unknown as KubeObject,
      );
    }
  }
  for (const crd of all) {
    await waitFor(async () => {
      const c = await client.get<{ status?: { conditions?: { type: string; status: string }[] } }>(
        CRD_RESOURCE,
        undefined,
        crd.metadata.name,
      );
      return c.status?.conditions?.some((x) => x.type === "Established" && x.status === "True");
    }, { what: `CRD ${crd.metadata.name} established`, timeoutMs: 30_000 });
  }
}

/** installCrds through a client of its own, as startControlPlane's `setup` wants it. */
export async function installCrdsAt(kubeconfigPath: string): Promise<void> {
  const client = await KubeClient.load(kubeconfigPath);
  try {
    await installCrds(client);
  } finally {
    client.close();
  }
}

/** Polls until `fn` returns something truthy; the error names what was awaited and the last value seen. */
export async function waitFor<T>(
  fn: () => Promise<T | undefined | null | false> | T | undefined | null | false,
  opts: { what: string; timeoutMs?: number; intervalMs?: number },
): Promise<T> {
  const deadline = Date.now() + (opts.timeoutMs ?? 60_000);
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
      last = v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) {
      throw new Error(
        `timed out waiting for ${opts.what}; last: ${last instanceof Error ? last.message : JSON.stringify(last)}`,
      );
    }
    await new Promise((r) => setTimeout(r, opts.intervalMs ?? 250));
  }
}

/**
 * Waits until a look at the host finds each instance up, at the controller's pace after an apply that left its units
 * on their way up (deploy.ts startingCheckMs: soon, then less often): a units-only look, as the controller's close
 * checks, given the same wait on the host (host_checks.ts STARTING_WAIT_MS), or a whole inspection, which also wants
 * the files as rendered. Returns how many looks it took.
 */
export async function inspectUntilUp(
  look: (opts: UnitsOptions) => Promise<HostInspection | HostUnits>,
  rendered: RenderedInstance[],
  timeoutMs = 120_000,
): Promise<number> {
  const deadline = Date.now() + timeoutMs;
  for (let looks = 0;; looks++) {
    await new Promise((r) => setTimeout(r, startingCheckMs(looks)));
    const seen = await look({ waitMs: STARTING_WAIT_MS });
    const off = rendered.flatMap((r) => {
      if ("units" in seen) {
        const u = unitsLook(r, seen.units);
        return [...u.drift, ...u.starting];
      }
      const i = seen.instances.find((f) => f.name === r.name);
      return [...drift(r, i), ...starting(r, i)];
    });
    if (!off.length) return looks + 1;
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${rendered.map((r) => r.name).join(", ")} up: ${off.join("; ")}`);
    }
  }
}

/** The feature description's example manifests (manifests/examples/), retargeted to a namespace. */
export async function seedExample(file: "virtualtargetclass.yaml" | "exporterset.yaml", namespace: string) {
  const text = await Deno.readTextFile(new URL(`../manifests/examples/${file}`, import.meta.url));
  const obj = parse(text) as KubeObject & { spec: unknown };
  obj.metadata.namespace = namespace;
  return obj;
}

export function parseYamlDocs(text: string): KubeObject[] {
  return parseAllDocuments(text).map((d) => d.toJS() as KubeObject).filter((o) => o);
}

/** The launcher's flags, as scripts/permissions.sh prints them: what production runs the controller with. */
export async function launcherFlags(): Promise<string[]> {
  const script = new URL("../scripts/permissions.sh", import.meta.url).pathname;
  const out = await new Deno.Command("sh", { args: [script], stdout: "piped" }).output();
  if (!out.success) throw new Error(`${script} failed`);
  return new TextDecoder().decode(out.stdout).trim().split(/\s+/);
}
