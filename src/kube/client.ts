/**
 * The only door to the API server: REST calls and raw watch streams, over node:https (node:http for an http:// server).
 *
 * Connections honour what client-go honours in a kubeconfig: certificate-authority, client certificates,
 * insecure-skip-tls-verify, tls-server-name and proxy-url (http, https, socks5; else HTTPS_PROXY / NO_PROXY), each
 * dialled here (`dial`) with a bound on connecting. Deno's fetch cannot skip verification or set the TLS server name,
 * and node:https under Deno measured close to it (1.1-1.2 vs 0.9-1.0 ms a request, same watch latency). Every
 * request, watches included, ends at once on its signal: the socket is destroyed and the body stream errors with the
 * signal's reason. The kubeconfig is read by kubeconfig_needs.ts; credentials (token, tokenFile, exec plugins, basic)
 * are asked per request in `headers()`.
 */
import http from "node:http";
import https from "node:https";
import net from "node:net";
import tls from "node:tls";
import type { Duplex } from "node:stream";
import type { KubeObject } from "../api/types.ts";
import { abortableSleep } from "./backoff.ts";
import { type Attempt, DEFAULT_BURST, DEFAULT_QPS, retryDelay, TokenBucket } from "./flowcontrol.ts";
import {
  type KubeconfigConnection,
  KubeconfigError,
  type KubeconfigFile,
  proxyFromEnvironment,
  resolveKubeconfig,
  SERVICE_ACCOUNT_DIR,
} from "./kubeconfig_needs.ts";

export { KubeconfigError } from "./kubeconfig_needs.ts";

export interface Resource {
  group: string; // "" for core
  version: string;
  plural: string;
  kind: string;
}

export interface ObjectList<T> {
  metadata: { resourceVersion?: string; continue?: string };
  items: T[];
}

export interface WatchEvent<T> {
  type: "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK" | "ERROR";
  object: T;
}

export class KubeError extends Error {
  constructor(
    readonly status: number,
    readonly reason: string,
    message: string,
    /** The response's Retry-After header, when it had one. */
    readonly retryAfter?: string,
  ) {
    super(message);
    this.name = "KubeError";
  }
}

export const isNotFound = (e: unknown) => e instanceof KubeError && e.status === 404;
export const isConflict = (e: unknown) => e instanceof KubeError && e.status === 409;
export const isGone = (e: unknown) => e instanceof KubeError && e.status === 410;

export interface RequestOptions {
  query?: Record<string, string | number | boolean | undefined>;
  body?: unknown;
  contentType?: string;
  signal?: AbortSignal;
  /** Overrides the client's requestTimeoutMs for this request. */
  timeoutMs?: number;
  headers?: Record<string, string>;
}

export interface ClientOptions {
  /**
   * Bound on every request except watches, response body included. A connection can go half-dead without being
   * closed (no RST, no FIN), and only a deadline turns that into an error instead of a caller stuck forever.
   */
  requestTimeoutMs?: number;
  /** Bound on opening a connection: TCP, proxy and TLS handshake (default 10 s; client-go's TLS handshake bound). */
  connectTimeoutMs?: number;
  /** Where $KUBECONFIG, $HOME, KUBERNETES_SERVICE_* and the proxy variables are read (tests); default Deno.env. */
  env?: (name: string) => string | undefined;
  /** The in-cluster service account directory (tests); default /var/run/secrets/kubernetes.io/serviceaccount. */
  serviceAccountDir?: string;
  /** Requests a second, sustained (client-go's QPS; default DEFAULT_QPS of flowcontrol.ts); <= 0: no limit. */
  qps?: number;
  /** Requests allowed at once above the sustained rate (client-go's Burst; default DEFAULT_BURST). */
  burst?: number;
  /** Told of each retry before its wait: for a debug log, and for tests to see Retry-After honoured. */
  onRetry?: (retry: RetryInfo) => void;
}

export interface RetryInfo {
  method: string;
  path: string;
  /** The HTTP status, or the connect error's code. */
  cause: number | string;
  retryAfter?: string;
  waitMs: number;
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

/** The API server (or the proxy on the way) could not be reached: no HTTP answer at all. */
export class KubeConnectError extends Error {
  constructor(
    /** host:port dialled: the server's, or the proxy's when `viaProxy`. */
    readonly address: string,
    /** ECONNREFUSED, ENOTFOUND, ETIMEDOUT, ECONNRESET, EPROXY, a TLS code (CERT_*, ERR_TLS_CERT_ALTNAME_INVALID, ...). */
    readonly code: string,
    readonly detail: string,
    readonly viaProxy?: string,
  ) {
    super(`${address}${viaProxy && viaProxy !== address ? ` (through proxy ${viaProxy})` : ""}: ${detail} (${code})`);
    this.name = "KubeConnectError";
  }

  get tls(): boolean {
    return /CERT|TLS|SSL|SELF_SIGNED|UNABLE_TO|DEPTH_ZERO/.test(this.code);
  }
}

export function resourcePath(
  r: Resource,
  opts: { namespace?: string; name?: string; subresource?: string } = {},
): string {
  const base = r.group === "" ? `/api/${r.version}` : `/apis/${r.group}/${r.version}`;
  const ns = opts.namespace ? `/namespaces/${encodeURIComponent(opts.namespace)}` : "";
  const name = opts.name ? `/${encodeURIComponent(opts.name)}` : "";
  const sub = opts.subresource ? `/${opts.subresource}` : "";
  return `${base}${ns}/${r.plural}${name}${sub}`;
}

/** The resource a request path names: `/apis/g/v/namespaces/ns/exportersets/x/status` -> `exportersets/status`. */
export function resourceOfPath(path: string): string {
  const parts = path.split("?")[0].split("/").filter(Boolean);
  const rest = parts.slice(parts[0] === "api" ? 2 : 3);
  if (rest[0] === "namespaces" && rest.length > 2) rest.splice(0, 2);
  return [rest[0], rest[2]].filter(Boolean).join("/");
}

/** DeleteOptions.preconditions: delete only that object (uid), or only as last seen (resourceVersion). */
export interface Preconditions {
  uid?: string;
  resourceVersion?: string;
}

/** The writes and reads reconciling makes besides its caches; FakeKube (fake_client.ts) is the unit tests' one. */
export interface KubeApi {
  find<T>(r: Resource, namespace: string | undefined, name: string): Promise<T | undefined>;
  create<T extends KubeObject>(r: Resource, obj: T): Promise<T>;
  /** JSON merge patch (RFC 7386); `null` deletes a key. */
  mergePatch<T>(
    r: Resource,
    namespace: string | undefined,
    name: string,
    patch: unknown,
    subresource?: string,
  ): Promise<T>;
  /** Deletes; a missing object counts as deleted; a failed precondition is a 409 Conflict. */
  delete(r: Resource, namespace: string | undefined, name: string, preconditions?: Preconditions): Promise<void>;
}

export class KubeClient implements KubeApi {
  /** Counts requests so benchmarks and tests can see the API cost of a reconcile. */
  requests = 0;
  /** The same by "METHOD resource" (plural, with a subresource: "PATCH exportersets/status"), for the metrics. */
  readonly requestsByCall = new Map<string, number>();
  /** Attempts sent again after a 429, a 5xx or a lost connection (see flowcontrol.ts), for the metrics. */
  retries = 0;
  /** Once aborted, failed attempts are no longer retried (a fenced ex-leader's writes must not go out late). */
  private retryFence?: AbortSignal;

  private constructor(
    readonly server: string,
    readonly source: ClientSource,
    private readonly transport: Transport,
    private readonly credentials: Credentials,
    private readonly requestTimeoutMs: number,
    private readonly limiter: TokenBucket,
    private readonly onRetry?: (retry: RetryInfo) => void,
  ) {}

  /**
   * Loads like controller-runtime: an explicit kubeconfig path, else the files of $KUBECONFIG, else the in-cluster
   * config (KUBERNETES_SERVICE_HOST/PORT and the service account token), else ~/.kube/config. Certificate files are read here;
   * a problem with any of them is a KubeconfigError naming the file, the context and the fix.
   */
  static async load(kubeconfigPath?: string, opts: ClientOptions = {}): Promise<KubeClient> {
    const env = opts.env ?? envVar;
    const conn = await locate(kubeconfigPath, env, opts.serviceAccountDir ?? SERVICE_ACCOUNT_DIR);
    const source: ClientSource = {
      path: conn.path,
      inCluster: conn.context === IN_CLUSTER,
      context: conn.context,
      cluster: conn.cluster,
      user: conn.user,
    };
    const pem = (data: string | undefined, file: string | undefined, field: string, owner: string) =>
      data !== undefined
        ? Promise.resolve(data)
        : file
        ? readFor(conn, file, field, owner)
        : Promise.resolve(undefined);
    const [ca, cert, key] = await Promise.all([
      pem(conn.caData, conn.caFile, "certificate-authority", `cluster "${conn.cluster}"`),
      pem(conn.certData, conn.certFile, "client-certificate", `user "${conn.user}"`),
      pem(conn.keyData, conn.keyFile, "client-key", `user "${conn.user}"`),
    ]);
    const credentials = new Credentials(conn, env);
    await credentials.check();
    const proxy = conn.proxyUrl ?? proxyFromEnvironment(conn.server, env);
    const transport = new Transport(new URL(conn.server), {
      ca,
      cert,
      key,
      servername: conn.tlsServerName,
      insecure: conn.insecureSkipTlsVerify,
      proxy: proxy ? new URL(proxy) : undefined,
      connectTimeoutMs: opts.connectTimeoutMs ?? 10_000,
    });
    const limiter = new TokenBucket(opts.qps ?? DEFAULT_QPS, opts.burst ?? DEFAULT_BURST);
    const timeout = opts.requestTimeoutMs ?? 30_000;
    return new KubeClient(conn.server, source, transport, credentials, timeout, limiter, opts.onRetry);
  }

  /** Stops retries once `fence` aborts; attempts already sent finish as they would. */
  fenceRetries(fence: AbortSignal): void {
    this.retryFence = fence;
  }

  close(): void {
    this.transport.close();
  }

  private async headers(contentType?: string, extra: Record<string, string> = {}): Promise<Auth> {
    // Asked per request: tokens from a tokenFile or an exec plugin change while the process runs.
    const auth = await this.credentials.get();
    auth.headers["Accept"] = "application/json";
    if (contentType) auth.headers["Content-Type"] = contentType;
    Object.assign(auth.headers, extra);
    return auth;
  }

  private url(path: string, query?: RequestOptions["query"]): URL {
    const u = new URL(this.server + path);
    for (const [k, v] of Object.entries(query ?? {})) if (v !== undefined) u.searchParams.set(k, String(v));
    return u;
  }

  /** One raw request with no deadline (watches); its `signal` is the only way to end it. Waits on the rate limit. */
  async fetch(method: string, path: string, opts: RequestOptions = {}): Promise<Response> {
    await this.limiter.take(opts.signal);
    opts.signal?.throwIfAborted();
    this.requests++;
    const call = `${method} ${resourceOfPath(path)}`;
    this.requestsByCall.set(call, (this.requestsByCall.get(call) ?? 0) + 1);
    const contentType = opts.body === undefined ? undefined : (opts.contentType ?? "application/json");
    const auth = await this.headers(contentType, opts.headers);
    const body = opts.body === undefined ? undefined : new TextEncoder().encode(JSON.stringify(opts.body));
    const res = await this.transport.send(method, this.url(path, opts.query), auth, body, opts.signal);
    if (res.status === 401) this.credentials.unauthorized();
    if (!res.ok) throw await errorOf(res, method, path);
    return res;
  }

  /**
   * One request and its JSON response, each attempt bounded by the request timeout. A 429, a 5xx or a lost connection
   * is tried again where flowcontrol.ts's retryDelay says it is safe, after the server's Retry-After or a back-off.
   */
  async request<T>(method: string, path: string, opts: RequestOptions = {}): Promise<T> {
    for (let retries = 0;; retries++) {
      try {
        return await this.attempt<T>(method, path, opts);
      } catch (e) {
        const attempt = attemptOf(e);
        const wait = attempt && retryDelay(method, retries, attempt);
        if (attempt === undefined || wait === undefined || opts.signal?.aborted || this.retryFence?.aborted) throw e;
        this.retries++;
        this.onRetry?.({
          method,
          path,
          cause: "status" in attempt ? attempt.status : attempt.connectError,
          retryAfter: "status" in attempt ? attempt.retryAfter ?? undefined : undefined,
          waitMs: wait,
        });
        const stop = this.retryFence
          ? AbortSignal.any([this.retryFence, ...opts.signal ? [opts.signal] : []])
          : opts.signal;
        await abortableSleep(wait, stop);
        if (stop?.aborted) throw e;
      }
    }
  }

  private async attempt<T>(method: string, path: string, opts: RequestOptions): Promise<T> {
    const ms = opts.timeoutMs ?? this.requestTimeoutMs;
    const deadline = new AbortController();
    const timer = setTimeout(
      () => deadline.abort(new DOMException(`${method} ${path}: no complete response in ${ms} ms`, "TimeoutError")),
      ms,
    );
    const signal = opts.signal ? AbortSignal.any([opts.signal, deadline.signal]) : deadline.signal;
    try {
      const res = await this.fetch(method, path, { ...opts, signal });
      return await res.json() as T;
    } finally {
      clearTimeout(timer);
    }
  }

  // ---------------------------------------------------------------- typed helpers

  list<T>(r: Resource, namespace?: string, query: RequestOptions["query"] = {}, signal?: AbortSignal) {
    return this.request<ObjectList<T>>("GET", resourcePath(r, { namespace }), { query, signal });
  }

  get<T>(r: Resource, namespace: string | undefined, name: string, signal?: AbortSignal) {
    return this.request<T>("GET", resourcePath(r, { namespace, name }), { signal });
  }

  /** Returns undefined when the object does not exist. */
  async find<T>(
    r: Resource,
    namespace: string | undefined,
    name: string,
    signal?: AbortSignal,
  ): Promise<T | undefined> {
    try {
      return await this.get<T>(r, namespace, name, signal);
    } catch (e) {
      if (isNotFound(e)) return undefined;
      throw e;
    }
  }

  create<T extends KubeObject>(r: Resource, obj: T, signal?: AbortSignal) {
    return this.request<T>("POST", resourcePath(r, { namespace: obj.metadata.namespace }), {
      body: withKind(r, obj),
      signal,
    });
  }

  replace<T extends KubeObject>(r: Resource, obj: T, subresource?: string, signal?: AbortSignal) {
    const m = obj.metadata;
    return this.request<T>("PUT", resourcePath(r, { namespace: m.namespace, name: m.name, subresource }), {
      body: withKind(r, obj),
      signal,
    });
  }

  /** JSON merge patch (RFC 7386); `null` deletes a key. */
  mergePatch<T>(r: Resource, namespace: string | undefined, name: string, patch: unknown, subresource?: string) {
    return this.request<T>("PATCH", resourcePath(r, { namespace, name, subresource }), {
      body: patch,
      contentType: "application/merge-patch+json",
    });
  }

  /** Server-side apply; the field manager owns what it sends. */
  apply<T extends KubeObject>(r: Resource, obj: T, fieldManager: string) {
    const m = obj.metadata;
    return this.request<T>("PATCH", resourcePath(r, { namespace: m.namespace, name: m.name }), {
      body: withKind(r, obj),
      contentType: "application/apply-patch+yaml",
      query: { fieldManager, force: true },
    });
  }

  async delete(r: Resource, namespace: string | undefined, name: string, preconditions?: Preconditions) {
    try {
      await this.request("DELETE", resourcePath(r, { namespace, name }), {
        body: preconditions ? { kind: "DeleteOptions", apiVersion: "v1", preconditions } : undefined,
      });
    } catch (e) {
      if (!isNotFound(e)) throw e;
    }
  }

  /** One watch request as a stream of events; the caller owns retries (see informer.ts). */
  async *watch<T>(
    r: Resource,
    namespace: string | undefined,
    query: RequestOptions["query"],
    signal: AbortSignal,
  ): AsyncGenerator<WatchEvent<T>> {
    const res = await this.fetch("GET", resourcePath(r, { namespace }), {
      query: { ...query, watch: true, allowWatchBookmarks: true },
      // No Accept-Encoding is sent, so the API server never gzips (it would, for streams of initial events).
      signal,
    });
    if (!res.body) return;
    let buf = "";
    for await (const chunk of res.body.pipeThrough(new TextDecoderStream())) {
      buf += chunk;
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (line) yield JSON.parse(line) as WatchEvent<T>;
      }
    }
  }
}

/** A failure retryDelay can judge: an HTTP error status, or no connection at all. */
function attemptOf(e: unknown): Attempt | undefined {
  if (e instanceof KubeError) return { status: e.status, retryAfter: e.retryAfter };
  if (e instanceof KubeConnectError && !e.tls) return { connectError: e.code };
  return undefined;
}

function withKind<T extends KubeObject>(r: Resource, obj: T): T {
  return { ...obj, apiVersion: r.group ? `${r.group}/${r.version}` : r.version, kind: r.kind };
}

async function errorOf(res: Response, method: string, path: string): Promise<KubeError> {
  const text = await res.text().catch(() => "");
  let reason = res.statusText;
  let message = text.slice(0, 500);
  try {
    const status = JSON.parse(text) as { reason?: string; message?: string };
    reason = status.reason ?? reason;
    message = status.message ?? message;
  } catch {
    // not a Status object: keep the raw text
  }
  const retryAfter = res.headers.get("retry-after") ?? undefined;
  return new KubeError(res.status, reason, `${method} ${path}: ${res.status} ${reason}: ${message}`, retryAfter);
}

// ---------------------------------------------------------------- configuration

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

interface Auth {
  headers: Record<string, string>;
  /** A client certificate an exec plugin returned, instead of the kubeconfig's. */
  cert?: string;
  key?: string;
}

interface ExecCredential {
  token?: string;
  cert?: string;
  key?: string;
  /** ms since the epoch; undefined = until the server says 401. */
  expires?: number;
}

const TOKEN_FILE_REFRESH_MS = 60_000; // client-go re-reads a tokenFile once a minute

/** Bearer tokens (static, tokenFile, exec plugin), basic auth and impersonation, per request. */
class Credentials {
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

// ---------------------------------------------------------------- transport

interface TransportOptions {
  ca?: string;
  cert?: string;
  key?: string;
  servername?: string;
  insecure: boolean;
  proxy?: URL;
  connectTimeoutMs: number;
}

/** Node's request options, plus the request's signal for the dial (the agent hands the options to createConnection). */
type DialOptions = http.RequestOptions & tls.ConnectionOptions & { qspSignal?: AbortSignal };

/** One pool of keep-alive connections to the server, each opened by `dial`. */
class Transport {
  private readonly agent: http.Agent;
  private readonly secure: boolean;
  private readonly address: string;
  private readonly proxyAddress?: string;

  constructor(private readonly server: URL, private readonly o: TransportOptions) {
    this.secure = server.protocol === "https:";
    this.address = hostPortOf(server);
    this.proxyAddress = o.proxy ? hostPortOf(o.proxy) : undefined;
    this.agent = this.secure ? new https.Agent({ keepAlive: true }) : new http.Agent({ keepAlive: true });
    // Node's agent lets createConnection answer through a callback: the pool stays Node's, the dial is ours.
    (this.agent as unknown as { createConnection: unknown }).createConnection = (
      options: DialOptions,
      cb: (err: Error | null, socket?: Duplex) => void,
    ) => {
      this.open(options).then((s) => cb(null, s), (e) => cb(e));
      return undefined;
    };
  }

  close(): void {
    this.agent.destroy();
  }

  /** TCP (direct or through the proxy), then TLS, bounded by connectTimeoutMs and ended by the request's signal. */
  private async open(options: DialOptions): Promise<Duplex> {
    const signal = options.qspSignal;
    const raw = await this.dial(signal);
    if (!this.secure) return raw;
    const { hostname } = this.target();
    // the certificate is checked for servername, else for host (which Node takes as "localhost" when left out)
    const servername = this.o.servername ?? (net.isIP(hostname) ? undefined : hostname);
    const sock = tls.connect({
      socket: raw as net.Socket,
      host: hostname,
      ...(servername ? { servername } : {}),
      ca: options.ca,
      cert: options.cert,
      key: options.key,
      rejectUnauthorized: !this.o.insecure,
    });
    // the handshake's own bound: the socket now belongs to the request, which destroys it on its signal
    const timer = setTimeout(
      () => sock.destroy(this.error("ETIMEDOUT", `no TLS handshake within ${this.o.connectTimeoutMs} ms`)),
      this.o.connectTimeoutMs,
    );
    const done = () => clearTimeout(timer);
    sock.once("secureConnect", done);
    sock.once("close", done);
    sock.once("error", done);
    return sock;
  }

  /** A TCP stream to the server: direct, or tunnelled through the proxy (HTTP CONNECT or SOCKS5). */
  private dial(signal?: AbortSignal): Promise<Duplex> {
    const { hostname, port } = this.target();
    const proxy = this.o.proxy;
    const ms = this.o.connectTimeoutMs;
    return new Promise<Duplex>((resolve, reject) => {
      let sock: net.Socket | tls.TLSSocket | undefined;
      const finish = (e?: unknown) => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        if (e === undefined) {
          sock!.removeListener("error", finish);
          resolve(sock!);
        } else {
          sock?.destroy();
          reject(e);
        }
      };
      const onAbort = () => finish(signal!.reason);
      const timer = setTimeout(() => finish(this.error("ETIMEDOUT", `no connection within ${ms} ms`)), ms);
      if (signal?.aborted) return onAbort();
      signal?.addEventListener("abort", onAbort, { once: true });
      const fail = (e: unknown) => finish(this.wrap(e, !!proxy));
      if (!proxy) {
        sock = net.connect({ host: hostname, port });
        sock.once("connect", () => finish());
        sock.once("error", fail);
        return;
      }
      const pport = Number(proxy.port) || (proxy.protocol === "https:" ? 443 : proxy.protocol === "http:" ? 80 : 1080);
      const phost = proxy.hostname.replace(/^\[|\]$/g, "");
      sock = proxy.protocol === "https:"
        ? tls.connect({ host: phost, port: pport, ...(net.isIP(phost) ? {} : { servername: phost }) })
        : net.connect({ host: phost, port: pport });
      sock.once("error", fail);
      sock.once(proxy.protocol === "https:" ? "secureConnect" : "connect", () => {
        const handshake = proxy.protocol.startsWith("socks")
          ? socks5(sock!, hostname, port, proxy)
          : httpConnect(sock!, this.address, proxy);
        handshake.then(() => finish(), (e) => finish(this.error("EPROXY", e instanceof Error ? e.message : String(e))));
      });
    });
  }

  private target() {
    return {
      hostname: this.server.hostname.replace(/^\[|\]$/g, ""),
      port: Number(this.server.port) || (this.secure ? 443 : 80),
    };
  }

  private error(code: string, detail: string): KubeConnectError {
    return new KubeConnectError(this.address, code, detail, this.proxyAddress);
  }

  /** A Node network or TLS error as a KubeConnectError naming the address and the name a certificate was checked for. */
  wrap(e: unknown, toProxy = false): unknown {
    if (e instanceof KubeConnectError || !(e instanceof Error)) return e;
    const code = (e as { code?: string }).code ?? e.name;
    const address = toProxy ? this.proxyAddress! : this.address;
    const name = this.o.servername ?? this.server.hostname;
    const detail = ({
      ECONNREFUSED: "connection refused",
      ENOTFOUND: `cannot resolve ${toProxy ? this.o.proxy!.hostname : this.server.hostname}`,
      EAI_AGAIN: `cannot resolve ${toProxy ? this.o.proxy!.hostname : this.server.hostname} (DNS did not answer)`,
      ECONNRESET: "connection reset",
      EHOSTUNREACH: "host unreachable",
      ENETUNREACH: "network unreachable",
      ETIMEDOUT: "timed out",
    } as Record<string, string>)[code] ??
      (/CERT|TLS|SELF_SIGNED|UNABLE_TO|DEPTH_ZERO/.test(code)
        ? `TLS: the server's certificate for ${name} is not accepted: ${e.message.split("\n")[0]}`
        : e.message.split("\n")[0]);
    return new KubeConnectError(address, code, detail, toProxy ? undefined : this.proxyAddress);
  }

  /** One request; the Response's body streams, and errors with the signal's reason once it aborts. */
  send(method: string, url: URL, auth: Auth, body: Uint8Array | undefined, signal?: AbortSignal): Promise<Response> {
    return new Promise<Response>((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason);
      const headers: Record<string, string | string[] | number> = { ...auth.headers };
      if (body) headers["Content-Length"] = body.byteLength;
      const options: DialOptions = {
        hostname: url.hostname.replace(/^\[|\]$/g, ""),
        port: Number(url.port) || (this.secure ? 443 : 80),
        path: url.pathname + url.search,
        method,
        headers,
        agent: this.agent,
        // part of the pool's key, so an exec plugin's client certificate gets connections of its own
        ca: this.o.ca,
        cert: auth.cert ?? this.o.cert,
        key: auth.key ?? this.o.key,
        servername: this.o.servername,
        rejectUnauthorized: !this.o.insecure,
        qspSignal: signal,
      };
      const req = (this.secure ? https : http).request(options);
      let stream: ReadableStreamDefaultController<Uint8Array> | undefined;
      let ended = false;
      const failure = (e: unknown) => signal?.aborted ? signal.reason : this.wrap(e);
      const onAbort = () => req.destroy(signal!.reason);
      signal?.addEventListener("abort", onAbort, { once: true });
      const settle = () => signal?.removeEventListener("abort", onAbort);
      req.on("error", (e) => {
        settle();
        if (!stream) return reject(failure(e));
        if (!ended) {
          ended = true;
          stream.error(failure(e));
        }
      });
      req.on("response", (res: http.IncomingMessage) => {
        const h = new Headers();
        for (const [k, v] of Object.entries(res.headers)) if (typeof v === "string") h.set(k, v);
        const responseBody = new ReadableStream<Uint8Array>({
          start(c) {
            stream = c;
            res.on("data", (chunk: Uint8Array) => {
              if (ended) return;
              c.enqueue(new Uint8Array(chunk));
              if ((c.desiredSize ?? 1) <= 0) res.pause();
            });
            res.on("end", () => {
              settle();
              if (ended) return;
              ended = true;
              c.close();
            });
            res.on("error", (e) => req.emit("error", e));
            res.on("close", () => {
              if (!ended) {
                req.emit("error", Object.assign(new Error("connection closed mid-response"), { code: "ECONNRESET" }));
              }
            });
          },
          pull() {
            res.resume();
          },
          cancel() {
            ended = true;
            settle();
            req.destroy();
          },
        }, { highWaterMark: 16 });
        const status = res.statusCode ?? 0;
        const nullBody = status === 204 || status === 304 || method === "HEAD";
        if (nullBody) responseBody.cancel();
        resolve(new Response(nullBody ? null : responseBody, { status, statusText: res.statusMessage, headers: h }));
      });
      req.end(body);
    });
  }
}

function hostPortOf(u: URL): string {
  const defaults: Record<string, string> = { "https:": "443", "http:": "80", "socks5:": "1080", "socks5h:": "1080" };
  return `${u.hostname}:${u.port || defaults[u.protocol] || "443"}`;
}

/** Reads from `sock` until `done(bytes)` says how many bytes were the answer; any bytes after it are put back. */
function readUntil(sock: Duplex, done: (buf: Uint8Array) => number | undefined): Promise<Uint8Array> {
  return new Promise((resolve, reject) => {
    let buf = new Uint8Array(0);
    const onData = (chunk: Uint8Array) => {
      const next = new Uint8Array(buf.length + chunk.length);
      next.set(buf);
      next.set(chunk, buf.length);
      buf = next;
      const n = done(buf);
      if (n === undefined) return;
      cleanup();
      // nothing follows the answer until we speak (TLS hello, request); put back anything that did anyway
      if (n < buf.length) sock.unshift(buf.subarray(n));
      resolve(buf.subarray(0, n));
    };
    const onEnd = () => {
      cleanup();
      reject(new Error("the proxy closed the connection"));
    };
    const onError = (e: Error) => {
      cleanup();
      reject(e);
    };
    const cleanup = () => {
      sock.removeListener("data", onData);
      sock.removeListener("end", onEnd);
      sock.removeListener("error", onError);
    };
    sock.on("data", onData);
    sock.once("end", onEnd);
    sock.once("error", onError);
  });
}

/** HTTP CONNECT through an http(s) proxy; user:password in its URL becomes Proxy-Authorization. */
async function httpConnect(sock: Duplex, target: string, proxy: URL): Promise<void> {
  const auth = proxy.username
    ? `Proxy-Authorization: Basic ${
      btoa(`${decodeURIComponent(proxy.username)}:${decodeURIComponent(proxy.password)}`)
    }\r\n`
    : "";
  sock.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n${auth}\r\n`);
  const answer = await readUntil(sock, (b) => {
    const i = new TextDecoder().decode(b).indexOf("\r\n\r\n");
    return i < 0 ? (b.length > 16384 ? b.length : undefined) : i + 4;
  });
  const status = new TextDecoder().decode(answer).split("\r\n")[0];
  if (!/^HTTP\/1\.[01] 2\d\d/.test(status)) {
    throw new Error(`proxy ${hostPortOf(proxy)} answered CONNECT ${target} with "${status}"`);
  }
}

/** SOCKS5 (RFC 1928), the target sent by name so the proxy resolves it; user:password (RFC 1929) when in the URL. */
async function socks5(sock: Duplex, host: string, port: number, proxy: URL): Promise<void> {
  const enc = new TextEncoder();
  const withAuth = proxy.username !== "";
  sock.write(new Uint8Array(withAuth ? [5, 2, 0, 2] : [5, 1, 0]));
  const [, method] = await readUntil(sock, (b) => b.length >= 2 ? 2 : undefined);
  if (method === 2 && withAuth) {
    const u = enc.encode(decodeURIComponent(proxy.username));
    const p = enc.encode(decodeURIComponent(proxy.password));
    sock.write(new Uint8Array([1, u.length, ...u, p.length, ...p]));
    const [, ok] = await readUntil(sock, (b) => b.length >= 2 ? 2 : undefined);
    if (ok !== 0) throw new Error(`socks5 proxy ${hostPortOf(proxy)} rejected the username and password`);
  } else if (method !== 0) {
    throw new Error(`socks5 proxy ${hostPortOf(proxy)} accepts none of our authentication methods`);
  }
  const v4 = net.isIPv4(host) ? host.split(".").map(Number) : undefined;
  const name = enc.encode(host);
  const addr = v4 ? [1, ...v4] : [3, name.length, ...name];
  sock.write(new Uint8Array([5, 1, 0, ...addr, port >> 8, port & 255]));
  const reply = await readUntil(sock, (b) => {
    if (b.length < 5) return undefined;
    const len = b[3] === 1 ? 4 : b[3] === 4 ? 16 : 1 + b[4];
    return b.length >= 4 + len + 2 ? 4 + len + 2 : undefined;
  });
  if (reply[1] !== 0) {
    const why = [
      "",
      "general failure",
      "not allowed by ruleset",
      "network unreachable",
      "host unreachable",
      "connection refused",
      "TTL expired",
      "command not supported",
      "address type not supported",
    ][reply[1]] ?? "";
    throw new Error(
      `socks5 proxy ${hostPortOf(proxy)} could not connect to ${host}:${port}: ${why || `error ${reply[1]}`}`,
    );
  }
}
