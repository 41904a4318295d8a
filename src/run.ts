/** `run`: the controller process: clients, leader election, health, signals, graceful shutdown. */
import { type ClientOptions, KubeClient, KubeError, type Resource } from "./kube/client.ts";
import { KubeconfigError } from "./kube/kubeconfig_needs.ts";
import { KubeConnectError } from "./kube/transport.ts";
import { NAMESPACES } from "./kube/resources.ts";
import type { KubeObject } from "./api/types.ts";
import { acquireLeadership, fencedApi, type Leadership } from "./kube/leader.ts";
import { createLogger, type Level } from "./observe/log.ts";
import { Metrics, type Sample } from "./observe/metrics.ts";
import { type HealthServer, parseBindAddress, serveHealth } from "./observe/health.ts";
import { SshPool } from "./host/ssh.ts";
import { LabHosts } from "./host/lab.ts";
import { Controller } from "./provision/controller.ts";
import { cachesFrom } from "./provision/context.ts";
import { type LabTarget } from "./provision/credentials.ts";
import { pinHostKey } from "./provision/host_keys.ts";

export interface RunOptions {
  provisioner: string;
  kubeconfig?: string;
  namespace?: string;
  leaderElect: boolean;
  healthAddress: string;
  metricsAddress: string;
  logLevel: Level;
  logFormat: "text" | "json";
  resyncMs: number;
  sweepMs: number;
  teardownGraceMs: number;
  /** --cluster-id; undefined: the kube-system namespace's uid (readClusterId). */
  clusterId?: string;
  /** undefined: the controller's default. */
  concurrency?: number;
  /** SSH connections open at once (ssh.ts maxConnections); undefined: no bound. */
  maxSshConnections?: number;
  /** Flow control toward the API server (flowcontrol.ts); undefined: its defaults. */
  kubeApi?: { qps: number; burst: number };
  /** --lab-hosts as given: the network permission already enforces it; named here in refusals. */
  labHosts: string;
  hostAliases: Record<string, string>;
  warnings: string[];
  /** What the launcher (main.ts) granted this process's Worker. */
  permissions?: Deno.PermissionOptionsObject;
}

export async function runController(o: RunOptions): Promise<number> {
  const log = createLogger({ level: o.logLevel, format: o.logFormat });
  for (const w of o.warnings) log.warn(w);
  log.debug("permissions", { ...o.permissions });
  const client = await loadClient(o.kubeconfig, o.kubeApi);
  const metrics = new Metrics();
  const shutdown = new AbortController();
  for (const sig of ["SIGTERM", "SIGINT"] as const) {
    Deno.addSignalListener(sig, () => {
      log.info("shutting down", { signal: sig });
      shutdown.abort();
    });
  }

  // Fencing: from the moment leadership is lost, no host command starts or goes on, and no reconcile writes to the API.
  const fence = new AbortController();
  const fencedClient = fencedApi(client, fence.signal);
  client.fenceRetries(fence.signal);
  // A 5 s keepalive notices a dead host within ~15 s; the pool's 15 s default would hold a worker for a minute.
  const pool = new SshPool({
    maxConnections: o.maxSshConnections,
    keepaliveIntervalMs: 5_000,
    keepaliveCountMax: 3,
    onConnect: (t) => metrics.sshConnections.inc({ host: t.host }),
    onHostKeyAccepted: async (t, line, fp) => {
      const target = t as LabTarget;
      log.warn(
        "pinned a new host key (trust on first use); add known_hosts to the credentials Secret to verify " +
          "it strictly",
        { host: `${t.host}:${t.port}`, fingerprint: fp, secret: `${target.namespace}/qemu-ssh-known-hosts` },
      );
      await pinHostKey(fencedClient, target, line);
    },
  });
  metrics.gauge(
    "rest_client_requests_total",
    "Requests this process sent to the API server, by method and resource.",
    () =>
      [...client.requestsByCall].map(([call, n]) => {
        const [method, resource] = call.split(" ");
        return [{ method, resource }, n];
      }),
    "counter",
  );
  metrics.gauge(
    "rest_client_retries_total",
    "Requests sent again after a 429, a 5xx or a lost connection (Retry-After honoured).",
    () => [[{}, client.retries]],
    "counter",
  );
  metrics.gauge(
    "rest_client_rate_limiter_wait_seconds_total",
    "Seconds requests waited for the --kube-api-qps token bucket, summed over requests.",
    () => [[{}, client.rateLimitedSeconds]],
    "counter",
  );
  // what of the RSS is this isolate's V8 heap (bounded by the launcher's --max-old-space-size) and what is outside it
  metrics.gauge(
    "deno_memory_bytes",
    "Deno.memoryUsage() of the controller's isolate: rss (the whole process), heapTotal, heapUsed, external.",
    () => Object.entries(Deno.memoryUsage()).map(([kind, bytes]): Sample => [{ kind }, bytes]),
  );
  // exactly what the controller's informers will watch (cachesFrom makes them), read once before anything starts
  await preflight(client, Object.values(cachesFrom((r) => r)), o.namespace, o.kubeconfig);
  const clusterId = await readClusterId(client, o.clusterId);
  log.info("cluster identity", { clusterId, provisioner: o.provisioner });
  const controller = new Controller({
    client,
    hosts: new LabHosts(pool, { hostAliases: o.hostAliases, labHosts: o.labHosts, metrics, fence: fence.signal }),
    log,
    provisioner: o.provisioner,
    namespace: o.namespace,
    resyncMs: o.resyncMs,
    sweepMs: o.sweepMs,
    teardownGraceMs: o.teardownGraceMs,
    clusterId,
    concurrency: o.concurrency,
    metrics,
    fence: fence.signal,
  });

  // A standby replica is ready (it is healthy, just waiting); the leader once its caches are synced.
  let leading = !o.leaderElect;
  // as client-go names it, so the usual "no leader" alert fits: a standby says 0, a process without election 1
  const leaseName = `exporterset-${o.provisioner.replaceAll(".", "-")}`;
  metrics.gauge(
    "leader_election_master_status",
    "1 while this process leads (or runs without leader election), else 0.",
    () => [[{ name: leaseName }, leading ? 1 : 0]],
  );
  const servers: HealthServer[] = [];
  const health = parseBindAddress(o.healthAddress);
  if (health) servers.push(serveHealth(health, { ready: () => !leading || controller.ready, metrics }));
  const metricsAddr = parseBindAddress(o.metricsAddress);
  if (metricsAddr) servers.push(serveHealth(metricsAddr, { ready: () => true, metrics }));

  let leadership: Leadership | undefined;
  if (o.leaderElect) {
    if (!o.namespace) throw new Error("--leader-elect needs a namespace for its Lease: set NAMESPACE or --namespace");
    leadership = await acquireLeadership(client, {
      namespace: o.namespace,
      name: leaseName,
      identity: `${Deno.hostname()}_${crypto.randomUUID().slice(0, 8)}`,
      log,
    }, shutdown.signal);
    if (!leadership) return await close(0);
    leading = true;
  }
  const lost = leadership?.lost ?? new AbortController().signal;
  // the fence falls with the Lease, before in-flight reconciles are even asked to stop
  lost.addEventListener("abort", () => fence.abort(lost.reason), { once: true });

  await controller.start();
  await new Promise((r) => {
    shutdown.signal.addEventListener("abort", r);
    lost.addEventListener("abort", r);
  });
  await controller.stop();
  return await close(lost.aborted ? 1 : 0);

  async function close(code: number): Promise<number> {
    await leadership?.release();
    await pool.close();
    for (const s of servers) await s.shutdown();
    client.close();
    log.info("stopped");
    return code;
  }
}

/**
 * What names this cluster in the ownership of the instances on the lab hosts: `given` (--cluster-id), else the uid
 * of the kube-system namespace, which every cluster has and no other cluster shares. Read once at start; a cluster
 * that does not let us read it stops here with the fix named, as guessing would let two clusters take each other's
 * instances for their own orphans.
 */
export async function readClusterId(
  client: Pick<KubeClient, "find" | "server">,
  given: string | undefined,
): Promise<string> {
  if (given !== undefined) return given;
  const fix = "grant get on namespaces/kube-system (manifests/clusterrole.yaml and clusterrolebinding.yaml), or " +
    "name this cluster with --cluster-id, unique among the clusters that share lab hosts";
  try {
    const ns = await client.find<KubeObject>(NAMESPACES, undefined, "kube-system");
    if (ns?.metadata.uid) return ns.metadata.uid;
    throw new Error(`the API server at ${client.server} has no namespace kube-system to name this cluster: ${fix}`);
  } catch (e) {
    if (e instanceof KubeError && e.status === 403) {
      throw new Error(`forbidden to read namespace kube-system, whose uid names this cluster: ${fix}`);
    }
    throw e;
  }
}

/**
 * The client, or one line naming what is wrong and how to fix it (kubeconfig.ts's KubeconfigError names the kubeconfig
 * file, the context and the file or field at fault; "no kubeconfig found" lists the places tried). `opts` is for tests.
 */
export async function loadClient(kubeconfig?: string, opts?: ClientOptions): Promise<KubeClient> {
  try {
    return await KubeClient.load(kubeconfig, opts);
  } catch (e) {
    if (e instanceof KubeconfigError) throw new Error(e.message);
    const source = kubeconfig ?? "$KUBECONFIG, ~/.kube/config or the in-cluster config";
    throw new Error(`cannot load the kubeconfig (${source}): ${e instanceof Error ? e.message : e}`);
  }
}

/**
 * One read of every resource the controller watches, so a wrong server, missing CRDs or missing rights fail at
 * start with one message naming what is wrong, instead of informers retrying quietly forever.
 */
export async function preflight(
  client: KubeClient,
  watched: Resource[],
  namespace: string | undefined,
  _kubeconfig?: string,
): Promise<void> {
  const where = namespace ? `in namespace ${namespace}` : "cluster-wide";
  const s = client.source;
  const from = s.inCluster ? `in-cluster config, ${s.path}` : `kubeconfig ${s.path}, context "${s.context}"`;
  for (const r of watched) {
    try {
      await client.list(r, namespace, { limit: 1 });
    } catch (e) {
      const what = `${r.plural}${r.group ? `.${r.group}` : ""}`;
      if (e instanceof KubeError && e.status === 401) {
        throw new Error(
          `the API server at ${client.server} rejected the credentials of user "${s.user}" (${from}): ` +
            `${e.message}: renew the token or client certificate`,
        );
      }
      if (e instanceof KubeError && e.status === 403) {
        throw new Error(`forbidden to list ${what} ${where}: grant the Role in manifests/role.yaml to this identity`);
      }
      if (e instanceof KubeError && e.status === 404) {
        throw new Error(`the API server at ${client.server} does not serve ${what}: install the CRDs (crds/)`);
      }
      if (e instanceof KubeError) throw new Error(`listing ${what} ${where}: ${e.message}`);
      // an exec credential plugin or a tokenFile that failed: the message names them already
      if (e instanceof KubeconfigError) throw new Error(e.message);
      const unreachable = `cannot reach the API server ${client.server} (${from})`;
      if (e instanceof DOMException && e.name === "TimeoutError") {
        throw new Error(
          `${unreachable}: ${e.message}: check the address, firewalls and proxy-url or HTTPS_PROXY (timeout)`,
        );
      }
      if (e instanceof KubeConnectError) {
        const fix = e.code === "ECONNREFUSED"
          ? "is the API server running, and is the cluster's server address right?"
          : e.code === "ENOTFOUND" || e.code === "EAI_AGAIN"
          ? "check the host name in the cluster's server (or proxy-url) and DNS"
          : e.code === "ETIMEDOUT"
          ? "check the address, firewalls and proxy-url or HTTPS_PROXY"
          : e.code === "EPROXY"
          ? "check proxy-url, and that the proxy allows CONNECT to this host and port"
          : e.code === "ERR_TLS_CERT_ALTNAME_INVALID"
          ? "use a server address the certificate names, or set the cluster's tls-server-name to one of its names"
          : e.tls
          ? "set the cluster's certificate-authority(-data) to the CA that signed the server's certificate"
          : "check the server address and the network";
        throw new Error(`${unreachable}: ${e.message}: ${fix}`);
      }
      throw new Error(`${unreachable}: ${e instanceof Error ? e.message : e}`);
    }
  }
}
