/**
 * Connections to the API server: one pool of kept-alive node:https connections (node:http for an http:// server),
 * each dialled here (`dial`) with a bound on connecting: direct, or through the kubeconfig's or the environment's
 * proxy (HTTP CONNECT over http or https, SOCKS5), then TLS with the kubeconfig's certificate-authority, client
 * certificate, tls-server-name and insecure-skip-tls-verify. Every request, watches included, ends at once on its
 * signal: the socket is destroyed and the body stream errors with the signal's reason.
 *
 * node:https rather than Deno's fetch, because fetch can neither set the TLS server name nor skip verification, and
 * node:https under Deno measured close to it (1.1-1.2 vs 0.9-1.0 ms a request, same watch latency). The proxies are
 * dialled here rather than taken from https-proxy-agent and socks: README, "Why these parts are hand-written".
 */
import http from "node:http";
import https from "node:https";
import net from "node:net";
import tls from "node:tls";
import type { Duplex } from "node:stream";
import { hostPort } from "./kubeconfig_needs.ts";
import { Semaphore } from "../semaphore.ts";

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

/** What one request authenticates with (kubeconfig.ts's Credentials give it). */
export interface Auth {
  headers: Record<string, string>;
  /** A client certificate an exec plugin returned, instead of the kubeconfig's. */
  cert?: string;
  key?: string;
}

/** How the server is reached, as a kubeconfig says: TLS (PEMs) and the proxy. */
export interface Endpoint {
  ca?: string;
  cert?: string;
  key?: string;
  servername?: string;
  insecure: boolean;
  proxy?: URL;
}

export interface TransportOptions extends Endpoint {
  connectTimeoutMs: number;
}

/** Node's request options, plus the request's signal for the dial (the agent hands the options to createConnection). */
type DialOptions = http.RequestOptions & tls.ConnectionOptions & { qspSignal?: AbortSignal };

/**
 * Requests in flight at once (watches included, one each), so connections to the server, all kept once idle. Node's
 * agent cannot bound them alone: it counts a socket once created, and ours come through a callback. Unbounded, with no
 * client-side request limit, the creates of a 500 x 8 converge opened 263 TLS connections, kept to the end. Fewer
 * kept idle than allowed open makes the agent close and reopen them in a burst (a request can come in before the
 * socket it would reuse is back in the pool).
 */
export const MAX_CONNECTIONS = 64;

/** One pool of keep-alive connections to the server, each opened by `dial`. */
export class Transport {
  private readonly agent: http.Agent;
  private readonly inFlight = new Semaphore(MAX_CONNECTIONS);
  private readonly secure: boolean;
  private readonly address: string;
  private readonly proxyAddress?: string;

  constructor(private readonly server: URL, private readonly o: TransportOptions) {
    this.secure = server.protocol === "https:";
    this.address = hostPort(server.href);
    this.proxyAddress = o.proxy ? hostPort(o.proxy.href) : undefined;
    const pool = { keepAlive: true, maxSockets: MAX_CONNECTIONS, maxFreeSockets: MAX_CONNECTIONS };
    this.agent = this.secure ? new https.Agent(pool) : new http.Agent(pool);
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
  private wrap(e: unknown, toProxy = false): unknown {
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

  /**
   * One request, once fewer than MAX_CONNECTIONS are in flight; the Response's body streams, and errors with the
   * signal's reason once it aborts. It is in flight until its body ends, fails or is cancelled.
   */
  async send(
    method: string,
    url: URL,
    auth: Auth,
    body: Uint8Array | undefined,
    signal?: AbortSignal,
  ): Promise<Response> {
    if (!await this.inFlight.acquire(Infinity, signal)) throw signal!.reason;
    let done = false;
    const release = () => {
      if (!done) this.inFlight.release();
      done = true;
    };
    return await this.request(method, url, auth, body, release, signal).catch((e) => {
      release();
      throw e;
    });
  }

  private request(
    method: string,
    url: URL,
    auth: Auth,
    body: Uint8Array | undefined,
    release: () => void,
    signal?: AbortSignal,
  ): Promise<Response> {
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
      const settle = () => {
        signal?.removeEventListener("abort", onAbort);
        release();
      };
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
    throw new Error(`proxy ${hostPort(proxy.href)} answered CONNECT ${target} with "${status}"`);
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
    if (ok !== 0) throw new Error(`socks5 proxy ${hostPort(proxy.href)} rejected the username and password`);
  } else if (method !== 0) {
    throw new Error(`socks5 proxy ${hostPort(proxy.href)} accepts none of our authentication methods`);
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
      `socks5 proxy ${hostPort(proxy.href)} could not connect to ${host}:${port}: ${why || `error ${reply[1]}`}`,
    );
  }
}
