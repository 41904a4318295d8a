// A real etcd, kube-apiserver and kube-controller-manager on loopback, with TLS and RBAC, for tests and the sandbox.
// The controller-manager runs only the garbage collector and the namespace controller: ownerReferences and namespace
// deletion behave as in a cluster, and nothing else acts behind the tests' backs.

import { builtPath } from "../built.ts";

export interface ControlPlane {
  dir: string;
  server: string;
  kubeconfigPath: string;
  caCertPath: string;
  stop(): Promise<void>;
  /** Kills kube-apiserver (SIGKILL), waits `downMs`, starts it again on the same port and etcd; resolves when ready. */
  restartApiServer(downMs?: number): Promise<void>;
  userKubeconfig(user: string, groups?: string[]): Promise<string>;
}

const READY_TIMEOUT_MS = 90_000;
const STOP_GRACE_MS = 5_000;
// Stopped in this order so no component sees the one it talks to vanish while it still runs.
const COMPONENTS = ["kube-controller-manager", "kube-apiserver", "etcd"] as const;
type Component = typeof COMPONENTS[number];

const buildScript = new URL("./build.sh", import.meta.url).pathname;

export const controlPlaneBinaries = (): Promise<string> => builtPath(buildScript);

export interface ControlPlaneOptions {
  dir: string;
  /** Leaves the processes running when this process exits (the sandbox); stop them with stopControlPlane. */
  detached?: boolean;
  /**
   * Runs with the admin kubeconfig once the API server is ready, before the controller-manager starts: its garbage
   * collector learns new kinds only every 30 s, and until then leaves the dependents of their objects in place.
   */
  setup?: (kubeconfigPath: string) => Promise<void>;
  /** API Priority and Fairness on, as in a real cluster (test/apf_storm.ts makes it shed one user's requests). */
  priorityAndFairness?: boolean;
}

export async function startControlPlane(opts: ControlPlaneOptions): Promise<ControlPlane> {
  const dir = await Deno.realPath(await ensureDir(opts.dir));
  for (const name of COMPONENTS) {
    const pid = await runningPid(dir, name);
    if (pid !== undefined) throw new Error(`${name} is already running in ${dir} (pid ${pid}); stop it first`);
  }
  const binDir = await controlPlaneBinaries();
  const pki = await generatePki(dir);
  const [etcdPort, etcdPeerPort, apiPort, kcmPort] = freePorts(4);
  const server = `https://127.0.0.1:${apiPort}`;
  const etcdUrl = `http://127.0.0.1:${etcdPort}`;
  const etcdPeerUrl = `http://127.0.0.1:${etcdPeerPort}`;
  // Peer URLs are baked into etcd's data dir and the ports change on every start, so old data cannot be reused.
  await Deno.remove(`${dir}/etcd-data`, { recursive: true }).catch(ignoreNotFound);

  const apiArgs = [
    `--etcd-servers=${etcdUrl}`,
    "--bind-address=127.0.0.1",
    "--advertise-address=127.0.0.1",
    `--secure-port=${apiPort}`,
    `--tls-cert-file=${pki.serverCert}`,
    `--tls-private-key-file=${pki.serverKey}`,
    `--client-ca-file=${pki.caCert}`,
    "--authorization-mode=RBAC",
    `--service-account-issuer=${server}`,
    `--service-account-key-file=${pki.saPub}`,
    `--service-account-signing-key-file=${pki.saKey}`,
    "--service-cluster-ip-range=10.0.0.0/24",
    "--allow-privileged=true",
    // The controller-manager runs without the serviceaccount controller, so nothing would ever create the default
    // ServiceAccount that this plugin demands.
    "--disable-admission-plugins=ServiceAccount",
    // As on OpenShift: setting blockOwnerDeletion needs `update` on the owner's finalizers, which the Role must grant.
    "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
    // Loopback endpoints fail validation, so the reconciler would log an error every few seconds.
    "--endpoint-reconciler-type=none",
    // Tests burst requests from one identity: flow control would only add queuing and one more post-start hook.
    `--enable-priority-and-fairness=${opts.priorityAndFairness ?? false}`,
    "--profiling=false",
  ];
  const startApiServer = async () => {
    const child = await spawn(dir, "kube-apiserver", `${binDir}/kube-apiserver`, apiArgs, detached);
    const admin = await clientFor(pki.caCert, pki.adminCert, pki.adminKey);
    await waitUntilOk("kube-apiserver", dir, child, `${server}/readyz`, admin);
    return child;
  };
  const caPem = await Deno.readTextFile(pki.caCert);
  const kubeconfigPath = `${dir}/kubeconfig`;
  await writeKubeconfig(kubeconfigPath, server, caPem, "admin", pki.adminCert, pki.adminKey);
  const userKubeconfig = async (user: string, groups: string[] = []) => {
    const file = user.replace(/[^A-Za-z0-9._-]/g, "_");
    const { cert, key } = await issueCert(pki, `user-${file}`, { cn: user, orgs: groups, usage: "clientAuth" });
    const path = `${dir}/kubeconfig-${file}`;
    await writeKubeconfig(path, server, caPem, user, cert, key);
    return path;
  };
  const children: Deno.ChildProcess[] = [];
  const detached = opts.detached ?? false;
  try {
    children.push(
      await spawn(dir, "etcd", `${binDir}/etcd`, [
        "--name=qsp",
        `--data-dir=${dir}/etcd-data`,
        `--listen-client-urls=${etcdUrl}`,
        `--advertise-client-urls=${etcdUrl}`,
        `--listen-peer-urls=${etcdPeerUrl}`,
        `--initial-advertise-peer-urls=${etcdPeerUrl}`,
        `--initial-cluster=qsp=${etcdPeerUrl}`,
        // Throwaway data: durability is not worth the fsync latency on every write.
        "--unsafe-no-fsync",
        "--log-level=warn",
      ], detached),
    );
    await waitFor("etcd", dir, children[0], async () => {
      const res = await fetch(`${etcdUrl}/health`);
      const body = await res.text();
      return res.ok && JSON.parse(body).health === "true";
    });

    children.push(await startApiServer());
    await opts.setup?.(kubeconfigPath);

    const kcm = await spawn(dir, "kube-controller-manager", `${binDir}/kube-controller-manager`, [
      // Without per-controller ServiceAccounts every controller acts as this user, and the garbage collector must be
      // able to delete any kind: the bootstrap role of system:kube-controller-manager alone does not allow that.
      `--kubeconfig=${await userKubeconfig("system:kube-controller-manager", ["system:masters"])}`,
      "--use-service-account-credentials=false",
      "--controllers=garbage-collector-controller,namespace-controller",
      // The default (20 workers) is sized for clusters far bigger than a test's, on machines with more than 2 cores.
      "--concurrent-gc-syncs=5",
      "--leader-elect=false",
      "--bind-address=127.0.0.1",
      `--secure-port=${kcmPort}`,
      // Signed by our CA, so the readiness probe can verify it; it already names 127.0.0.1.
      `--tls-cert-file=${pki.serverCert}`,
      `--tls-private-key-file=${pki.serverKey}`,
      "--profiling=false",
    ], detached);
    children.push(kcm);
    // /healthz is always allowed, so an anonymous client is enough.
    const anonymous = Deno.createHttpClient({ caCerts: [caPem] });
    await waitUntilOk("kube-controller-manager", dir, kcm, `https://127.0.0.1:${kcmPort}/healthz`, anonymous);
  } catch (err) {
    await stopChildren(dir, children);
    throw err;
  }

  if (detached) { for (const child of children) child.unref(); }

  return {
    dir,
    server,
    kubeconfigPath,
    caCertPath: pki.caCert,
    stop: () => detached ? stopControlPlane(dir) : stopChildren(dir, children),
    async restartApiServer(downMs = 0) {
      const api = children[1];
      signal(api.pid, "SIGKILL");
      await api.status;
      await new Promise((r) => setTimeout(r, downMs));
      children[1] = await startApiServer();
    },
    userKubeconfig,
  };
}

export async function stopControlPlane(dir: string): Promise<void> {
  const realDir = await Deno.realPath(dir).catch(() => undefined);
  if (realDir === undefined) return;
  for (const name of COMPONENTS) {
    const pid = await runningPid(realDir, name);
    if (pid !== undefined) {
      signal(pid, "SIGTERM");
      if (!await exited(pid, STOP_GRACE_MS)) {
        signal(pid, "SIGKILL");
        if (!await exited(pid, STOP_GRACE_MS)) throw new Error(`${name} (pid ${pid}) survived SIGKILL`);
      }
    }
    await Deno.remove(`${realDir}/${name}.pid`).catch(ignoreNotFound);
  }
}

// Our own children are stopped through their handles: that reaps them, and also covers the moment before the wrapper
// shell has exec'd the binary, when the pid file does not yet name it.
async function stopChildren(dir: string, children: Deno.ChildProcess[]): Promise<void> {
  for (const child of [...children].reverse()) {
    signal(child.pid, "SIGTERM");
    const timer = setTimeout(() => signal(child.pid, "SIGKILL"), STOP_GRACE_MS);
    await child.status;
    clearTimeout(timer);
  }
  for (const name of COMPONENTS) await Deno.remove(`${dir}/${name}.pid`).catch(ignoreNotFound);
}

function signal(pid: number, sig: Deno.Signal): void {
  try {
    Deno.kill(pid, sig);
  } catch (err) {
    // Already gone: exactly what the caller wants.
    if (!(err instanceof Deno.errors.NotFound)) throw err;
  }
}

interface Pki {
  dir: string;
  caCert: string;
  caKey: string;
  serverCert: string;
  serverKey: string;
  adminCert: string;
  adminKey: string;
  saKey: string;
  saPub: string;
}

async function generatePki(dir: string): Promise<Pki> {
  const pkiDir = await ensureDir(`${dir}/pki`);
  const caCert = `${pkiDir}/ca.crt`;
  const caKey = `${pkiDir}/ca.key`;
  await openssl([
    "req",
    "-x509",
    ...ecKeyArgs,
    "-keyout",
    caKey,
    "-out",
    caCert,
    "-days",
    "3650",
    "-subj",
    "/CN=qemu-ssh-provisioner-test-ca",
    "-addext",
    "basicConstraints=critical,CA:TRUE",
    "-addext",
    "keyUsage=critical,keyCertSign,cRLSign",
  ]);
  const saKey = `${pkiDir}/sa.key`;
  const saPub = `${pkiDir}/sa.pub`;
  await openssl(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", saKey]);
  await openssl(["pkey", "-in", saKey, "-pubout", "-out", saPub]);

  const base = { dir: pkiDir, caCert, caKey, saKey, saPub };
  const server = await issueCert(base, "server", {
    cn: "kube-apiserver",
    usage: "serverAuth",
    sans: ["IP:127.0.0.1", "DNS:localhost"],
  });
  const admin = await issueCert(base, "admin", { cn: "admin", orgs: ["system:masters"], usage: "clientAuth" });
  return { ...base, serverCert: server.cert, serverKey: server.key, adminCert: admin.cert, adminKey: admin.key };
}

const ecKeyArgs = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];

async function issueCert(
  pki: { dir: string; caCert: string; caKey: string },
  name: string,
  spec: { cn: string; orgs?: string[]; usage: "serverAuth" | "clientAuth"; sans?: string[] },
): Promise<{ cert: string; key: string }> {
  const cert = `${pki.dir}/${name}.crt`;
  const key = `${pki.dir}/${name}.key`;
  const csr = `${pki.dir}/${name}.csr`;
  const ext = `${pki.dir}/${name}.ext`;
  const subject = [["CN", spec.cn], ...(spec.orgs ?? []).map((o) => ["O", o])]
    .map(([k, v]) => `/${k}=${v.replace(/[\\/+]/g, "\\$&")}`)
    .join("");
  await openssl(["req", "-new", ...ecKeyArgs, "-keyout", key, "-out", csr, "-subj", subject]);
  const extLines = [
    "basicConstraints=CA:FALSE",
    `keyUsage=critical,digitalSignature${spec.usage === "serverAuth" ? ",keyEncipherment" : ""}`,
    `extendedKeyUsage=${spec.usage}`,
    ...(spec.sans ? [`subjectAltName=${spec.sans.join(",")}`] : []),
  ];
  await Deno.writeTextFile(ext, extLines.join("\n") + "\n");
  const serial = "0x" + Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0"))
    .join("");
  await openssl([
    "x509",
    "-req",
    "-in",
    csr,
    "-CA",
    pki.caCert,
    "-CAkey",
    pki.caKey,
    "-set_serial",
    serial,
    "-days",
    "365",
    "-extfile",
    ext,
    "-out",
    cert,
  ]);
  await Promise.all([Deno.remove(csr), Deno.remove(ext)]);
  return { cert, key };
}

async function openssl(args: string[]): Promise<void> {
  const out = await new Deno.Command("openssl", { args, stdout: "piped", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(`openssl ${args.join(" ")} failed:\n${new TextDecoder().decode(out.stderr)}`);
  }
}

async function writeKubeconfig(
  path: string,
  server: string,
  caPem: string,
  user: string,
  certPath: string,
  keyPath: string,
): Promise<void> {
  const [cert, key] = await Promise.all([Deno.readTextFile(certPath), Deno.readTextFile(keyPath)]);
  // JSON strings are valid YAML scalars, which sidesteps YAML quoting rules for arbitrary user names.
  const q = JSON.stringify;
  const yaml = `apiVersion: v1
kind: Config
clusters:
  - name: qsp
    cluster:
      server: ${q(server)}
      certificate-authority-data: ${btoa(caPem)}
users:
  - name: ${q(user)}
    user:
      client-certificate-data: ${btoa(cert)}
      client-key-data: ${btoa(key)}
contexts:
  - name: qsp
    context:
      cluster: qsp
      user: ${q(user)}
current-context: qsp
`;
  await Deno.writeTextFile(path, yaml, { mode: 0o600 });
}

async function clientFor(caCertPath: string, certPath: string, keyPath: string): Promise<Deno.HttpClient> {
  const [ca, cert, key] = await Promise.all([caCertPath, certPath, keyPath].map((p) => Deno.readTextFile(p)));
  return Deno.createHttpClient({ caCerts: [ca], cert, key });
}

async function spawn(
  dir: string,
  name: Component,
  binary: string,
  args: string[],
  detached: boolean,
): Promise<Deno.ChildProcess> {
  const log = `${dir}/${name}.log`;
  // Deno cannot hand a file to a child's stdio, and a pipe would die with us when detached, so the shell redirects and
  // then execs, keeping the pid the binary's own.
  const child = new Deno.Command("sh", {
    args: ["-c", `exec "$@" >>"$QSP_LOG" 2>&1 </dev/null`, "sh", binary, ...args],
    env: { QSP_LOG: log },
    stdin: "null",
    stdout: "null",
    stderr: "null",
    detached,
  }).spawn();
  await Deno.writeTextFile(`${dir}/${name}.pid`, `${child.pid}\n`);
  return child;
}

async function waitFor(
  name: Component,
  dir: string,
  child: Deno.ChildProcess,
  probe: () => Promise<boolean>,
): Promise<void> {
  let exit: Deno.CommandStatus | undefined;
  child.status.then((s) => exit = s);
  const deadline = Date.now() + READY_TIMEOUT_MS;
  let delay = 50;
  while (true) {
    if (exit) throw new Error(`${name} exited with code ${exit.code} before it was ready\n${await logTail(dir, name)}`);
    if (await probe().catch(() => false)) return;
    if (Date.now() > deadline) {
      throw new Error(`${name} was not ready after ${READY_TIMEOUT_MS / 1000}s\n${await logTail(dir, name)}`);
    }
    await new Promise((r) => setTimeout(r, delay));
    delay = Math.min(delay * 2, 250);
  }
}

/** Waits until `url` answers "ok" to `client`, which it closes. */
async function waitUntilOk(
  name: Component,
  dir: string,
  child: Deno.ChildProcess,
  url: string,
  client: Deno.HttpClient,
): Promise<void> {
  try {
    await waitFor(name, dir, child, async () => {
      const res = await fetch(url, { client });
      return res.ok && (await res.text()).trim() === "ok";
    });
  } finally {
    client.close();
  }
}

async function logTail(dir: string, name: Component, lines = 40): Promise<string> {
  const path = `${dir}/${name}.log`;
  const text = await Deno.readTextFile(path).catch(() => "");
  return `--- last ${lines} lines of ${path} ---\n${text.trimEnd().split("\n").slice(-lines).join("\n")}`;
}

function freePorts(n: number): number[] {
  // All listeners stay open until every port is picked, so the same port cannot come back twice.
  const listeners = Array.from({ length: n }, () => Deno.listen({ hostname: "127.0.0.1", port: 0 }));
  const ports = listeners.map((l) => l.addr.port);
  for (const l of listeners) l.close();
  return ports;
}

// The pid file alone could point at an unrelated process after a reboot or pid reuse, so the command line must match.
async function runningPid(dir: string, name: Component): Promise<number | undefined> {
  const text = await Deno.readTextFile(`${dir}/${name}.pid`).catch(() => "");
  const pid = Number.parseInt(text.trim(), 10);
  if (!Number.isInteger(pid) || pid <= 0) return undefined;
  const cmdline = await Deno.readTextFile(`/proc/${pid}/cmdline`).catch(() => "");
  const [argv0 = "", ...args] = cmdline.split("\0");
  const ours = argv0.endsWith(`/${name}`) && args.some((a) => a.includes(dir));
  return ours && !await gone(pid) ? pid : undefined;
}

// A zombie counts as gone: it no longer runs, and only its parent (maybe not us) can reap it.
async function gone(pid: number): Promise<boolean> {
  const stat = await Deno.readTextFile(`/proc/${pid}/stat`).catch(() => "");
  // The state field follows the parenthesised command name, which may itself contain spaces.
  return stat === "" || stat.slice(stat.lastIndexOf(")") + 2).startsWith("Z");
}

async function exited(pid: number, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await gone(pid)) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return await gone(pid);
}

async function ensureDir(path: string): Promise<string> {
  await Deno.mkdir(path, { recursive: true });
  return path;
}

function ignoreNotFound(err: unknown): void {
  if (!(err instanceof Deno.errors.NotFound)) throw err;
}
