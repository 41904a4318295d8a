/**
 * Where the client's configuration comes from, read: the kubeconfig located in controller-runtime's order (or the
 * in-cluster service account), the certificate files it names, the proxy, and the credentials asked per request
 * (token, tokenFile, exec plugin, basic, impersonation). kubeconfig_needs.ts parses and merges the files, pure, so the
 * launcher can use it too; the I/O is here. client-node's KubeConfig was not taken for this: README, "Why these parts
 * are hand-written", lists what it misses.
 */
import {
  type KubeconfigConnection,
  KubeconfigError,
  type KubeconfigFile,
  proxyFromEnvironment,
  resolveKubeconfig,
  SERVICE_ACCOUNT_DIR,
} from "./kubeconfig_needs.ts";
import type { Auth, Endpoint } from "./transport.ts";

export interface LoadOptions {
  /** Where $KUBECONFIG, $HOME, KUBERNETES_SERVICE_* and the proxy variables are read (tests); default Deno.env. */
  env?: (name: string) => string | undefined;
  /** The in-cluster service account directory (tests); default /var/run/secrets/kubernetes.io/serviceaccount. */
  serviceAccountDir?: string;
}

/** Where the client's configuration came from, for messages. */
export interface ClientSource {
  /** The kubeconfig file (or `:`-joined $KUBECONFIG list), or the service account directory in a pod. */
  path: string;
  inCluster: boolean;
  context: string;
  cluster: string;
  user: string;
}

/** A configuration ready to connect with: its files read, its credentials checked. */
export interface ClientConfig {
  /** `https://host:port` (or http). */
  server: string;
  source: ClientSource;
  /** TLS as the kubeconfig says; the proxy is its proxy-url, else the environment's for this server. */
  endpoint: Endpoint;
  credentials: Credentials;
}

/**
 * Loads like controller-runtime: an explicit kubeconfig path, else the files of $KUBECONFIG, else the in-cluster
 * config (KUBERNETES_SERVICE_HOST/PORT and the service account token), else ~/.kube/config. Certificate files are read
 * here; a problem with any of them is a KubeconfigError naming the file, the context and the fix.
 */
export async function loadConfig(kubeconfigPath?: string, opts: LoadOptions = {}): Promise<ClientConfig> {
  const env = opts.env ?? envVar;
  const conn = await locate(kubeconfigPath, env, opts.serviceAccountDir ?? SERVICE_ACCOUNT_DIR);
  const pem = (data: string | undefined, file: string | undefined, field: string, owner: string) =>
    data !== undefined ? Promise.resolve(data) : file ? readFor(conn, file, field, owner) : Promise.resolve(undefined);
  const [ca, cert, key] = await Promise.all([
    pem(conn.caData, conn.caFile, "certificate-authority", `cluster "${conn.cluster}"`),
    pem(conn.certData, conn.certFile, "client-certificate", `user "${conn.user}"`),
    pem(conn.keyData, conn.keyFile, "client-key", `user "${conn.user}"`),
  ]);
  const credentials = new Credentials(conn, env);
  await credentials.check();
  const proxy = conn.proxyUrl ?? proxyFromEnvironment(conn.server, env);
  return {
    server: conn.server,
    source: {
      path: conn.path,
      inCluster: conn.context === IN_CLUSTER,
      context: conn.context,
      cluster: conn.cluster,
      user: conn.user,
    },
    endpoint: {
      ca,
      cert,
      key,
      servername: conn.tlsServerName,
      insecure: conn.insecureSkipTlsVerify,
      proxy: proxy ? new URL(proxy) : undefined,
    },
    credentials,
  };
}

const IN_CLUSTER = "in-cluster";

/** An environment variable; one the permission set does not grant reads as unset. */
function envVar(name: string): string | undefined {
  try {
    return Deno.env.get(name);
  } catch {
    return undefined;
  }
}

function reason(e: unknown): string {
  if (e instanceof Deno.errors.NotFound) return "no such file";
  if (e instanceof Deno.errors.PermissionDenied) return "permission denied";
  if (e instanceof Deno.errors.IsADirectory) return "is a directory";
  return (e instanceof Error ? e.message : String(e)).split("\n")[0];
}

/** A relative path stays relative (to the working directory), as the permission set grants it. */
async function readKubeconfig(path: string): Promise<KubeconfigFile> {
  return { text: await Deno.readTextFile(path), path };
}

/** The kubeconfig to use, in client-go's order; the error names every place tried. */
async function locate(
  explicit: string | undefined,
  env: (name: string) => string | undefined,
  saDir: string,
): Promise<KubeconfigConnection> {
  if (explicit) {
    let file: KubeconfigFile;
    try {
      file = await readKubeconfig(explicit);
    } catch (e) {
      throw new KubeconfigError(`cannot read kubeconfig ${explicit} (--kubeconfig): ${reason(e)}: fix the path`);
    }
    return resolveKubeconfig([file]);
  }
  const tried = ["--kubeconfig (not given)"];
  const list = env("KUBECONFIG");
  if (list) {
    const files: KubeconfigFile[] = [];
    const missing: string[] = [];
    for (const p of list.split(":").filter(Boolean)) {
      try {
        files.push(await readKubeconfig(p));
      } catch (e) {
        // client-go skips missing files of the list; any other problem is the user's to fix
        if (!(e instanceof Deno.errors.NotFound)) {
          throw new KubeconfigError(`cannot read kubeconfig ${p} (from $KUBECONFIG): ${reason(e)}`);
        }
        missing.push(p);
      }
    }
    if (files.length) return resolveKubeconfig(files);
    tried.push(`$KUBECONFIG=${list} (${missing.length > 1 ? "no such files" : "no such file"})`);
  } else {
    tried.push("$KUBECONFIG (not set)");
  }
  // controller-runtime's order: in a pod the service account comes before a home directory's kubeconfig
  const host = env("KUBERNETES_SERVICE_HOST");
  const port = env("KUBERNETES_SERVICE_PORT");
  if (host && port) {
    return {
      path: saDir,
      context: IN_CLUSTER,
      cluster: IN_CLUSTER,
      user: "serviceaccount",
      server: `https://${host.includes(":") ? `[${host}]` : host}:${port}`,
      caFile: `${saDir}/ca.crt`,
      tokenFile: `${saDir}/token`,
      insecureSkipTlsVerify: false,
    };
  }
  tried.push(
    host || port
      ? `in-cluster config (${host ? "KUBERNETES_SERVICE_PORT" : "KUBERNETES_SERVICE_HOST"} not set)`
      : "in-cluster config (KUBERNETES_SERVICE_HOST not set)",
  );
  if (!list) {
    const home = env("HOME");
    if (home) {
      const path = `${home.replace(/\/$/, "")}/.kube/config`;
      try {
        return resolveKubeconfig([await readKubeconfig(path)]);
      } catch (e) {
        if (e instanceof KubeconfigError) throw e;
        // a permission set without it is "not there", as for client-go's missing file
        if (!(e instanceof Deno.errors.NotFound || e instanceof Deno.errors.NotCapable)) {
          throw new KubeconfigError(`cannot read kubeconfig ${path}: ${reason(e)}`);
        }
        tried.push(`${path} (${e instanceof Deno.errors.NotFound ? "no such file" : "not readable here"})`);
      }
    } else {
      tried.push("~/.kube/config ($HOME not set)");
    }
  }
  throw new KubeconfigError(
    `no kubeconfig found; tried ${tried.join(", ")}: pass --kubeconfig FILE, set KUBECONFIG, or run in a pod with ` +
      "a service account",
  );
}

/** A file a kubeconfig (or the pod) names; the error names the file, who names it and how to fix it. */
async function readFor(conn: KubeconfigConnection, file: string, field: string, owner: string): Promise<string> {
  try {
    return await Deno.readTextFile(file);
  } catch (e) {
    if (conn.context === IN_CLUSTER) {
      throw new KubeconfigError(
        `in-cluster config: cannot read ${file}: ${reason(e)}: mount the service account token ` +
          "(automountServiceAccountToken: true) or pass --kubeconfig",
      );
    }
    const inline = field === "tokenFile" ? "token" : `${field}-data`;
    throw new KubeconfigError(
      `kubeconfig ${conn.path}: cannot read ${field} ${file} of ${owner} (context "${conn.context}"): ${reason(e)}: ` +
        `fix the path (relative paths are relative to the kubeconfig's directory) or inline it as ${inline}`,
    );
  }
}

// ---------------------------------------------------------------- credentials

interface ExecCredential {
  token?: string;
  cert?: string;
  key?: string;
  /** ms since the epoch; undefined = until the server says 401. */
  expires?: number;
}

const TOKEN_FILE_REFRESH_MS = 60_000; // client-go re-reads a tokenFile once a minute

/** Bearer tokens (static, tokenFile, exec plugin), basic auth and impersonation, per request. */
export class Credentials {
  private fileToken?: { token: string; read: number };
  private exec?: ExecCredential;
  private running?: Promise<ExecCredential>;

  constructor(
    private readonly conn: KubeconfigConnection,
    private readonly env: (name: string) => string | undefined,
  ) {}

  /** Reads what can be read at load, so a missing tokenFile fails there rather than on the first request. */
  async check(): Promise<void> {
    if (!this.conn.token && this.conn.tokenFile) await this.tokenFromFile();
  }

  /** A 401: the exec plugin's credential is stale whatever its expiry said (client-go does the same). */
  unauthorized(): void {
    this.exec = undefined;
  }

  async get(): Promise<Auth> {
    const c = this.conn;
    const auth: Auth = { headers: {} };
    let token = c.token;
    if (!token && c.tokenFile) token = await this.tokenFromFile();
    if (c.exec) {
      const cred = await this.execCredential();
      token = cred.token ?? token;
      auth.cert = cred.cert;
      auth.key = cred.key;
    }
    if (token) auth.headers["Authorization"] = `Bearer ${token}`;
    else if (c.username !== undefined && c.password !== undefined) {
      auth.headers["Authorization"] = `Basic ${btoa(`${c.username}:${c.password}`)}`;
    }
    if (c.impersonate?.user) auth.headers["Impersonate-User"] = c.impersonate.user;
    if (c.impersonate?.uid) auth.headers["Impersonate-Uid"] = c.impersonate.uid;
    // several groups would need repeated headers; node:http sends an array as such
    if (c.impersonate?.groups?.length) {
      (auth.headers as Record<string, string | string[]>)["Impersonate-Group"] = c.impersonate.groups;
    }
    return auth;
  }

  private async tokenFromFile(): Promise<string> {
    const now = Date.now();
    if (this.fileToken && now - this.fileToken.read < TOKEN_FILE_REFRESH_MS) return this.fileToken.token;
    try {
      const token = (await Deno.readTextFile(this.conn.tokenFile!)).trim();
      this.fileToken = { token, read: now };
      return token;
    } catch {
      if (this.fileToken) return this.fileToken.token; // a rotation in progress: keep the last one
      return await readFor(this.conn, this.conn.tokenFile!, "tokenFile", `user "${this.conn.user}"`);
    }
  }

  private execCredential(): Promise<ExecCredential> {
    const cached = this.exec;
    // renewed a little before it expires, so a request never carries a token that dies on the way
    if (cached && (cached.expires === undefined || cached.expires - 10_000 > Date.now())) {
      return Promise.resolve(cached);
    }
    this.running ??= this.runExec().then(
      (cred) => {
        this.exec = cred;
        this.running = undefined;
        return cred;
      },
      (e) => {
        this.running = undefined;
        throw e;
      },
    );
    return this.running;
  }

  private async runExec(): Promise<ExecCredential> {
    const c = this.conn;
    const x = c.exec!;
    const what = `exec plugin ${x.command} of user "${c.user}" (kubeconfig ${c.path}, context "${c.context}")`;
    const info = {
      apiVersion: x.apiVersion,
      kind: "ExecCredential",
      spec: {
        interactive: false,
        ...(x.provideClusterInfo
          ? {
            cluster: {
              server: c.server,
              ...(c.tlsServerName ? { "tls-server-name": c.tlsServerName } : {}),
              ...(c.insecureSkipTlsVerify ? { "insecure-skip-tls-verify": true } : {}),
              ...(c.caData ? { "certificate-authority-data": btoa(c.caData) } : {}),
              ...(c.proxyUrl ? { "proxy-url": c.proxyUrl } : {}),
              ...(x.clusterConfig !== undefined ? { config: x.clusterConfig } : {}),
            },
          }
          : {}),
      },
    };
    let out: Deno.CommandOutput;
    try {
      out = await new Deno.Command(x.command, {
        args: x.args,
        env: { ...Object.fromEntries(x.env.map((e) => [e.name, e.value])), KUBERNETES_EXEC_INFO: JSON.stringify(info) },
        stdin: "null",
        stdout: "piped",
        stderr: "piped",
      }).output();
    } catch (e) {
      const hint = x.installHint ? `: ${x.installHint.trim().split("\n")[0]}` : ": install it or fix the command";
      throw new KubeconfigError(`${what} cannot run: ${reason(e)}${hint}`);
    }
    const stderr = new TextDecoder().decode(out.stderr).trim().split("\n").pop() ?? "";
    if (!out.success) throw new KubeconfigError(`${what} exited with ${out.code}${stderr ? `: ${stderr}` : ""}`);
    let cred: {
      apiVersion?: string;
      kind?: string;
      status?: { token?: string; clientCertificateData?: string; clientKeyData?: string; expirationTimestamp?: string };
    };
    try {
      cred = JSON.parse(new TextDecoder().decode(out.stdout));
    } catch (e) {
      throw new KubeconfigError(`${what} printed no ExecCredential JSON: ${reason(e)}`);
    }
    if (cred?.kind !== "ExecCredential" || cred.apiVersion !== x.apiVersion) {
      throw new KubeconfigError(
        `${what} printed ${cred?.kind ?? "no kind"} ${
          cred?.apiVersion ?? ""
        }, not an ExecCredential of ${x.apiVersion}`,
      );
    }
    const s = cred.status ?? {};
    if (!s.token && !(s.clientCertificateData && s.clientKeyData)) {
      throw new KubeconfigError(`${what} returned neither a token nor a client certificate and key`);
    }
    const expires = s.expirationTimestamp ? Date.parse(s.expirationTimestamp) : undefined;
    return { token: s.token, cert: s.clientCertificateData, key: s.clientKeyData, expires };
  }
}
