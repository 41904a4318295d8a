/**
 * The only door to the API server: REST calls and raw watch streams, paced by flowcontrol.ts's token bucket and tried
 * again where its retryDelay says it is safe. The configuration and credentials come from kubeconfig.ts, the
 * connections from transport.ts. Hand-written rather than client-node's request layer, which makes one TLS handshake
 * per request and needs an unscoped --allow-env: README, "Why these parts are hand-written", has the figures.
 */
import type { KubeObject } from "../api/types.ts";
import { abortableSleep } from "./backoff.ts";
import { type Attempt, DEFAULT_BURST, DEFAULT_QPS, retryDelay, TokenBucket } from "./flowcontrol.ts";
import { type ClientSource, type Credentials, loadConfig, type LoadOptions } from "./kubeconfig.ts";
import { type Auth, KubeConnectError, Transport } from "./transport.ts";

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

export interface ClientOptions extends LoadOptions {
  /**
   * Bound on every request except watches, response body included, from when it holds its rate-limit token. A
   * connection can go half-dead without being closed (no RST, no FIN), and only a deadline turns that into an error
   * instead of a caller stuck forever.
   */
  requestTimeoutMs?: number;
  /** Bound on opening a connection: TCP, proxy and TLS handshake (default 10 s; client-go's TLS handshake bound). */
  connectTimeoutMs?: number;
  /** Requests a second, sustained (client-go's QPS; default DEFAULT_QPS of flowcontrol.ts); <= 0: no limit. */
  qps?: number;
  /** Requests allowed at once above the sustained rate (client-go's Burst; default DEFAULT_BURST). */
  burst?: number;
  /** Told of each retry before its wait: for a debug log, and for tests to see Retry-After honoured. */
  onRetry?: (retry: RetryInfo) => void;
  /** Told of each request as it is sent, watches included (tests: which grants a run used). */
  onRequest?: (method: string, path: string, query: RequestOptions["query"]) => void;
}

export interface RetryInfo {
  method: string;
  path: string;
  /** The HTTP status, or the connect error's code. */
  cause: number | string;
  retryAfter?: string;
  waitMs: number;
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
  /** Seconds requests waited in the token bucket, summed: how much the QPS setting held the controller back. */
  rateLimitedSeconds = 0;
  /** Once aborted, failed attempts are no longer retried (a fenced ex-leader's writes must not go out late). */
  private retryFence?: AbortSignal;

  private constructor(
    readonly server: string,
    readonly source: ClientSource,
    private readonly transport: Transport,
    private readonly credentials: Credentials,
    private readonly requestTimeoutMs: number,
    private readonly limiter: TokenBucket,
    private readonly hooks: Pick<ClientOptions, "onRetry" | "onRequest">,
  ) {}

  /** Loads the configuration as kubeconfig.ts's loadConfig says; a problem with it is a KubeconfigError. */
  static async load(kubeconfigPath?: string, opts: ClientOptions = {}): Promise<KubeClient> {
    const config = await loadConfig(kubeconfigPath, opts);
    const transport = new Transport(new URL(config.server), {
      ...config.endpoint,
      connectTimeoutMs: opts.connectTimeoutMs ?? 10_000,
    });
    const limiter = new TokenBucket(opts.qps ?? DEFAULT_QPS, opts.burst ?? DEFAULT_BURST);
    const timeout = opts.requestTimeoutMs ?? 30_000;
    return new KubeClient(
      config.server,
      config.source,
      transport,
      config.credentials,
      timeout,
      limiter,
      { onRetry: opts.onRetry, onRequest: opts.onRequest },
    );
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
    await this.turn(opts.signal);
    return this.send(method, path, opts);
  }

  /** Waits for the rate limit's token; an abort of `signal` ends the wait (and gives the token back). */
  private async turn(signal?: AbortSignal): Promise<void> {
    this.rateLimitedSeconds += await this.limiter.take(signal) / 1000;
    signal?.throwIfAborted();
  }

  /** Sends a request that holds its token. */
  private async send(method: string, path: string, opts: RequestOptions): Promise<Response> {
    this.requests++;
    const call = `${method} ${resourceOfPath(path)}`;
    this.requestsByCall.set(call, (this.requestsByCall.get(call) ?? 0) + 1);
    this.hooks.onRequest?.(method, path, opts.query);
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
        this.hooks.onRetry?.({
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

  /**
   * The deadline bounds the request from when it holds its token, not its wait in the bucket: a queue longer than the
   * deadline (30 s: 1500 requests at 50 qps, a wave of creates) timed out every request in it before it was sent. A
   * caller that must not wait that long bounds the whole with its own signal (leader election's renew deadline).
   */
  private async attempt<T>(method: string, path: string, opts: RequestOptions): Promise<T> {
    await this.turn(opts.signal);
    const ms = opts.timeoutMs ?? this.requestTimeoutMs;
    const deadline = new AbortController();
    const timer = setTimeout(
      () => deadline.abort(new DOMException(`${method} ${path}: no complete response in ${ms} ms`, "TimeoutError")),
      ms,
    );
    const signal = opts.signal ? AbortSignal.any([opts.signal, deadline.signal]) : deadline.signal;
    try {
      const res = await this.send(method, path, { ...opts, signal });
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
