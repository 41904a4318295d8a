/**
 * The real Jumpstarter controller and router (v0.7.1, built by ./build.sh) as child processes against the test
 * control plane, for tests and the sandbox. They listen on fixed ports (8082 gRPC, 8083 router, 8084 dashboard,
 * 127.0.0.1:8085 internal OIDC), so only one can run per machine.
 *
 * v0.7.1 serves self-signed certificates (one for the controller, one for the router, new on every start) and
 * publishes them nowhere; this module reads them off the ports and writes them to the ConfigMap that exporters take
 * their CA bundle from.
 */
import { builtPath } from "../built.ts";
import { Buffer } from "node:buffer";
import http2 from "node:http2";
import { parse } from "yaml";
import type { ConfigMap, Exporter, KubeObject, Secret } from "../../src/api/types.ts";
import { isConflict, KubeClient } from "../../src/kube/client.ts";
import { CONFIG_MAPS, CRDS, EXPORTERS, NAMESPACES, SECRETS } from "../../src/kube/resources.ts";
import { waitFor } from "../env.ts";

/** Where exporters look for the CA bundle by default (ExporterSet / VirtualTargetClass without caBundleConfigMapRef). */
export const CA_CONFIGMAP = { name: "jumpstarter-service-ca-cert", key: "ca.crt" };

const PORTS = { grpc: 8082, router: 8083, dashboard: 8084, oidc: 8085 };
const READY_TIMEOUT_MS = 60_000;
const STOP_TIMEOUT_MS = 5_000;
const FIELD_MANAGER = "qsp-test-jumpstarter";
// Exporters and Leases come from the project's own CRDs (installCrds in test/env.ts); v0.7.1 watches these too.
const OWN_CRDS = ["exporters.jumpstarter.dev", "leases.jumpstarter.dev"];
const EXTRA_CRDS = ["jumpstarter.dev_clients.yaml", "jumpstarter.dev_exporteraccesspolicies.yaml"];

export interface RealJumpstarterOptions {
  /** Admin kubeconfig of the control plane. */
  kubeconfig: string;
  /** Where the controller's ConfigMaps live (e.g. "jumpstarter"); Exporters may be in any namespace. */
  namespace: string;
  /** The address lab hosts reach this machine at (the lab bridge's, e.g. 10.76.0.1). */
  bridgeAddress: string;
  /** Logs and the signing keys (kept, so tokens stay valid across restarts) go here. */
  dir: string;
}

export interface RealJumpstarter {
  /** The gRPC endpoint exporters use, also what the controller writes to Exporter status.endpoint. */
  endpoint: string;
  routerEndpoint: string;
  /** PEM of the running controller's and router's certificates, as written to CA_CONFIGMAP. */
  caBundle(): string;
  /** Stops and starts both again (new certificates, same signing keys); resolves when ready again, as start does. */
  restart(): Promise<void>;
  stop(): Promise<void>;
  logs: { controller: string; router: string };
}

const buildScript = new URL("./build.sh", import.meta.url).pathname;

export const jumpstarterBinaries = (): Promise<string> => builtPath(buildScript);

/** Resolves once CA_CONFIGMAP holds the running certificates and the controller accepts an exporter. */
export async function startRealJumpstarter(opts: RealJumpstarterOptions): Promise<RealJumpstarter> {
  // Before anything is written: a second instance must not retarget the running one's ConfigMap.
  await checkPortsFree();
  await Deno.mkdir(opts.dir, { recursive: true });
  const dir = await Deno.realPath(opts.dir);
  const binDir = await jumpstarterBinaries();
  const endpoint = `${opts.bridgeAddress}:${PORTS.grpc}`;
  const routerEndpoint = `${opts.bridgeAddress}:${PORTS.router}`;
  const logs = { controller: `${dir}/jumpstarter-controller.log`, router: `${dir}/jumpstarter-router.log` };
  const env = {
    ...await signingKeys(dir),
    NAMESPACE: opts.namespace,
    KUBECONFIG: opts.kubeconfig,
    GRPC_ENDPOINT: endpoint,
    GRPC_ROUTER_ENDPOINT: routerEndpoint,
  };
  const client = await KubeClient.load(opts.kubeconfig);
  let children: Deno.ChildProcess[] = [];
  let ca = "";
  const stopChildren = async () => {
    await Promise.all(children.map(kill));
    children = [];
  };
  const start = async () => {
    children = [
      // Health probes would default to :8081; nothing here reads them, and "0" binds nothing that could collide.
      spawn(`${binDir}/jumpstarter-controller`, ["--health-probe-bind-address=0"], env, logs.controller),
      spawn(`${binDir}/jumpstarter-router`, [], env, logs.router),
    ];
    let exited: string | undefined;
    children.forEach((child, i) =>
      child.status.then((s) => exited ??= `${i ? "router" : "controller"} exited with code ${s.code}`)
    );
    const deadline = Date.now() + READY_TIMEOUT_MS;
    const until: Until = async (what, probe) => {
      let last = "";
      for (;;) {
        const failure = exited ??
          (Date.now() > deadline ? `${what}: not after ${READY_TIMEOUT_MS / 1000} s${last && ` (${last})`}` : "");
        if (failure) throw new Error(`Jumpstarter ${failure}; see ${logs.controller} and ${logs.router}`);
        const value = await probe().catch((err) => void (last = err instanceof Error ? err.message : String(err)));
        if (value) return value;
        await new Promise((r) => setTimeout(r, 200));
      }
    };
    try {
      // Exporters talk to the controller, and to the router once leased, with one CA bundle: it must hold both.
      ca = await until("serves TLS on both ports", async () => {
        const pems = await Promise.all([PORTS.grpc, PORTS.router].map(servedCertificate));
        return pems.every(Boolean) ? pems.join("") : undefined;
      });
      await client.apply<ConfigMap>(CONFIG_MAPS, caConfigMap(opts.namespace, ca), FIELD_MANAGER);
      await acceptsExporter(client, opts.namespace, until, (...who) => register(endpoint, ca, ...who));
    } catch (err) {
      await stopChildren();
      throw err;
    }
  };

  try {
    await installCrds(client, binDir);
    await client.create(NAMESPACES, { metadata: { name: opts.namespace } }).catch(ignoreConflict);
    await client.apply<ConfigMap>(CONFIG_MAPS, {
      metadata: { name: "jumpstarter-controller", namespace: opts.namespace },
      data: {
        router: `default:\n  endpoint: ${routerEndpoint}\n`,
        // v0.7.1 exits with "invalid duration" when minTime is missing.
        config: "grpc:\n  keepalive:\n    minTime: 1s\n    permitWithoutStream: true\n",
      },
    }, FIELD_MANAGER);
    await start();
  } catch (err) {
    client.close();
    throw err;
  }
  return {
    endpoint,
    routerEndpoint,
    caBundle: () => ca,
    async restart() {
      await stopChildren();
      await start();
    },
    async stop() {
      await stopChildren();
      client.close();
    },
    logs,
  };
}

const caConfigMap = (namespace: string, pem: string): ConfigMap => ({
  metadata: { name: CA_CONFIGMAP.name, namespace },
  data: { [CA_CONFIGMAP.key]: pem },
});

async function installCrds(client: KubeClient, binDir: string): Promise<void> {
  for (const name of OWN_CRDS) {
    if (!await client.find(CRDS, undefined, name)) {
      throw new Error(`CRD ${name} is missing: install the project's test CRDs first (installCrds in test/env.ts)`);
    }
  }
  for (const file of EXTRA_CRDS) {
    const crd = parse(await Deno.readTextFile(`${binDir}/${file}`)) as KubeObject;
    await client.create(CRDS, crd).catch(ignoreConflict);
    await waitFor(async () => {
      const c = await client.get<{ status?: { conditions?: { type: string; status: string }[] } }>(
        CRDS,
        undefined,
        crd.metadata.name!,
      );
      return c.status?.conditions?.some((x) => x.type === "Established" && x.status === "True");
    }, { what: `CRD ${crd.metadata.name} established`, timeoutMs: 30_000 });
  }
}

/** Random per working dir and then kept: tokens signed before a restart stay valid after it. */
async function signingKeys(dir: string): Promise<{ CONTROLLER_KEY: string; ROUTER_KEY: string }> {
  const path = `${dir}/signing-keys.json`;
  const saved = await Deno.readTextFile(path).catch(() => undefined);
  if (saved) return JSON.parse(saved);
  const random = () =>
    Array.from(crypto.getRandomValues(new Uint8Array(32)), (b) => b.toString(16).padStart(2, "0"))
      .join("");
  const keys = { CONTROLLER_KEY: random(), ROUTER_KEY: random() };
  await Deno.writeTextFile(path, JSON.stringify(keys), { mode: 0o600 });
  return keys;
}

async function checkPortsFree(): Promise<void> {
  for (const [what, port] of Object.entries(PORTS)) {
    try {
      Deno.listen({ hostname: what === "oidc" ? "127.0.0.1" : "0.0.0.0", port }).close();
    } catch (err) {
      if (!(err instanceof Deno.errors.AddrInUse)) throw err;
      const holder = await new Deno.Command("ss", { args: ["-Hltnp", `sport = :${port}`], stdout: "piped" }).output()
        .then((o) => new TextDecoder().decode(o.stdout).match(/users:\(\((.*?)\)\)/)?.[1] ?? "unknown process")
        .catch(() => "unknown process");
      throw new Error(
        `port ${port} (Jumpstarter ${what}) is in use by ${holder}: probably another real Jumpstarter controller ` +
          "(the sandbox's or another test run's); its ports are fixed, so only one can run per machine",
      );
    }
  }
}

/** Retries a probe until it returns something, the processes exit or the start's deadline passes. */
type Until = <T>(what: string, probe: () => Promise<T | undefined>) => Promise<T>;

/**
 * Resolves once the controller accepts an exporter: a probe Exporter of its own gets a token from it and registers
 * with it over gRPC; then the probe is deleted, with its token Secret (a Secret left owned by a deleted Exporter would
 * make the controller fail a later one of the same name, hence a new name each time). Ports answering and the CA being
 * served are not enough: for ~10 s after every start the controller's verifier has not fetched OIDC discovery from its
 * own 127.0.0.1:8085 yet and turns every exporter away with "oidc: authenticator not initialized".
 */
async function acceptsExporter(
  client: KubeClient,
  namespace: string,
  until: Until,
  register: (token: string, namespace: string, name: string) => Promise<void>,
): Promise<void> {
  const probe = await client.create<Exporter>(EXPORTERS, {
    metadata: { generateName: "qsp-readiness-probe-", namespace },
    spec: {},
  });
  const name = probe.metadata.name!;
  try {
    const token = await until(`issues a token to Exporter ${namespace}/${name}`, async () => {
      const secret = (await client.get<Exporter>(EXPORTERS, namespace, name)).status?.credential?.name;
      const token = secret && (await client.find<Secret>(SECRETS, namespace, secret))?.data?.token;
      return token ? Buffer.from(token, "base64").toString() : undefined;
    });
    await until(`accepts Exporter ${namespace}/${name}`, () => register(token, namespace, name).then(() => true));
  } finally {
    await client.delete(EXPORTERS, namespace, name).catch(() => {});
    await client.delete(SECRETS, namespace, `${name}-exporter`).catch(() => {});
  }
}

/** An exporter's Register call with an empty RegisterRequest; throws with the controller's gRPC status otherwise. */
async function register(endpoint: string, ca: string, token: string, namespace: string, name: string): Promise<void> {
  const path = "/jumpstarter.v1.ControllerService/Register";
  // who is calling, as jumpstarter's exporters say it (jumpstarter/config/grpc.py)
  const trailers = await grpcCall(endpoint, ca, path, {
    authorization: `Bearer ${token}`,
    "jumpstarter-kind": "Exporter",
    "jumpstarter-namespace": namespace,
    "jumpstarter-name": name,
  });
  if (trailers["grpc-status"] !== "0") {
    throw new Error(`${path}: grpc-status ${trailers["grpc-status"]}: ${trailers["grpc-message"]}`);
  }
}

/** One unary gRPC call with an empty message; resolves with its trailers (grpc-status, grpc-message). */
async function grpcCall(endpoint: string, ca: string, path: string, metadata: Record<string, string>) {
  const session = http2.connect(`https://${endpoint}`, { ca });
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await new Promise<http2.IncomingHttpHeaders>((resolve, reject) => {
      timer = setTimeout(() => reject(new Error(`${path}: no gRPC status after 5 s`)), 5_000);
      session.on("error", reject);
      const req = session.request({
        ":method": "POST",
        ":path": path,
        "content-type": "application/grpc",
        te: "trailers",
        ...metadata,
      });
      // A failed call may come as headers only (trailers-only response).
      req.on("response", (h) => h["grpc-status"] !== undefined && resolve(h));
      req.on("trailers", resolve).on("error", reject).resume();
      // One empty gRPC message: no compression flag, zero length.
      req.end(new Uint8Array(5));
    });
  } finally {
    clearTimeout(timer);
    session.destroy();
  }
}

/** The PEM certificate served on a local port, or undefined while nothing answers TLS there. */
async function servedCertificate(port: number): Promise<string | undefined> {
  // gRPC servers refuse TLS clients that do not offer h2 by ALPN.
  const out = await new Deno.Command("openssl", {
    args: ["s_client", "-connect", `127.0.0.1:${port}`, "-alpn", "h2"],
    stdin: "null",
    stdout: "piped",
    stderr: "null",
    signal: AbortSignal.timeout(5_000),
  }).output();
  return new TextDecoder().decode(out.stdout).match(
    /-----BEGIN CERTIFICATE-----\n[^-]+-----END CERTIFICATE-----\n/,
  )?.[0];
}

function spawn(binary: string, args: string[], env: Record<string, string>, log: string): Deno.ChildProcess {
  // Deno cannot hand a file to a child's stdio, so the shell redirects and then execs, keeping the binary's pid.
  return new Deno.Command("sh", {
    args: ["-c", `exec "$@" >>"$QSP_LOG" 2>&1 </dev/null`, "sh", binary, ...args],
    env: { ...env, QSP_LOG: log },
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
}

// SIGKILL at once: v0.7.1's controller ignores SIGTERM until its 30 s graceful-shutdown timeout (its gRPC and dashboard
// servers never stop), and neither process keeps state that a graceful stop would save.
async function kill(child: Deno.ChildProcess): Promise<void> {
  try {
    child.kill("SIGKILL");
  } catch {
    // Already exited: what we want.
  }
  let timer: ReturnType<typeof setTimeout> | undefined;
  const stuck = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`pid ${child.pid} survived SIGKILL for ${STOP_TIMEOUT_MS} ms`)),
      STOP_TIMEOUT_MS,
    );
  });
  await Promise.race([child.status, stuck]).finally(() => clearTimeout(timer));
}

function ignoreConflict(err: unknown): void {
  if (!isConflict(err)) throw err;
}
