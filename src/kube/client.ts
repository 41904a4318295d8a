/**
 * The only door to the API server: REST calls and raw watch streams over Deno's fetch.
 *
 * @kubernetes/client-node is used for what it does well (kubeconfig, in-cluster config, auth plugins); requests go
 * through Deno's own fetch because client-node's watch under Deno cannot be aborted reliably, which stalls informers.
 */
import { KubeConfig } from "@kubernetes/client-node";
import type { KubeObject } from "../api/types.ts";

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
  /** Deletes; a missing object counts as deleted. */
  delete(r: Resource, namespace: string | undefined, name: string, preconditionUid?: string): Promise<void>;
}

export class KubeClient implements KubeApi {
  /** Counts requests so benchmarks and tests can see the API cost of a reconcile. */
  requests = 0;

  private constructor(
    private readonly kc: KubeConfig,
    readonly server: string,
    private readonly http: Deno.HttpClient,
    private readonly requestTimeoutMs: number,
  ) {}

  /** Loads an explicit kubeconfig path, else in-cluster config, else $KUBECONFIG / ~/.kube/config. */
  static async load(kubeconfigPath?: string, opts: ClientOptions = {}): Promise<KubeClient> {
    const kc = new KubeConfig();
    if (kubeconfigPath) kc.loadFromFile(kubeconfigPath);
    else kc.loadFromDefault();
    const cluster = kc.getCurrentCluster();
    if (!cluster) throw new Error("kubeconfig has no current cluster: set a context or pass --kubeconfig");
    const tls: { ca?: string | Buffer; cert?: string | Buffer; key?: string | Buffer } = {};
    await kc.applyToHTTPSOptions(tls);
    const text = (v: string | Buffer | undefined) => v === undefined ? undefined : v.toString();
    const ca = text(tls.ca);
    const cert = text(tls.cert);
    const key = text(tls.key);
    const http = Deno.createHttpClient({
      ...(ca ? { caCerts: [ca] } : {}),
      ...(cert && key ? { cert, key } : {}),
      http2: false,
    });
    return new KubeClient(kc, cluster.server.replace(/\/$/, ""), http, opts.requestTimeoutMs ?? 30_000);
  }

  close(): void {
    this.http.close();
  }

  private async headers(contentType?: string, extra: Record<string, string> = {}): Promise<Headers> {
    // Asked per request: bearer tokens (in-cluster, exec plugins) are refreshed by client-node.
    const opts: { headers?: Record<string, string> } = { headers: {} };
    await this.kc.applyToHTTPSOptions(opts);
    const h = new Headers(opts.headers);
    h.set("Accept", "application/json");
    if (contentType) h.set("Content-Type", contentType);
    for (const [k, v] of Object.entries(extra)) h.set(k, v);
    return h;
  }

  private url(path: string, query?: RequestOptions["query"]): string {
    const u = new URL(this.server + path);
    for (const [k, v] of Object.entries(query ?? {})) if (v !== undefined) u.searchParams.set(k, String(v));
    return u.toString();
  }

  /** One raw request with no deadline (watches); its `signal` is the only way to end it. */
  async fetch(method: string, path: string, opts: RequestOptions = {}): Promise<Response> {
    this.requests++;
    const contentType = opts.body === undefined ? undefined : (opts.contentType ?? "application/json");
    const res = await fetch(this.url(path, opts.query), {
      method,
      headers: await this.headers(contentType, opts.headers),
      body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
      signal: opts.signal,
      client: this.http,
    });
    if (!res.ok) throw await errorOf(res, method, path);
    return res;
  }

  /** One request and its JSON response, bounded by the request timeout. */
  async request<T>(method: string, path: string, opts: RequestOptions = {}): Promise<T> {
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

  /** Deletes; a missing object counts as deleted. */
  async delete(r: Resource, namespace: string | undefined, name: string, preconditionUid?: string): Promise<void> {
    try {
      await this.request("DELETE", resourcePath(r, { namespace, name }), {
        body: preconditionUid
          ? { kind: "DeleteOptions", apiVersion: "v1", preconditions: { uid: preconditionUid } }
          : undefined,
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
      // The API server gzips some watch streams (those that start with initial events), and Deno's fetch ends a
      // gzipped stream after its first flushed chunk: the watch would look closed by the server after one event.
      headers: { "Accept-Encoding": "identity" },
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
  return new KubeError(res.status, reason, `${method} ${path}: ${res.status} ${reason}: ${message}`);
}
