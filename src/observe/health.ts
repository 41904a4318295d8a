/** `/healthz`, `/readyz` (caches synced) and `/metrics` over plain HTTP, as controller-runtime serves them. */
import type { Metrics } from "./metrics.ts";

export interface HealthServer {
  port: number;
  shutdown(): Promise<void>;
}

/**
 * Parses controller-runtime style addresses: ":8081", "0.0.0.0:8081", "127.0.0.1:0", "[::]:8081". "0" means disabled.
 */
export function parseBindAddress(addr: string): { hostname: string; port: number } | undefined {
  if (addr === "0" || addr === "") return undefined;
  const m = /^(.*):(\d+)$/.exec(addr);
  if (!m) throw new Error(`invalid bind address "${addr}" (expected HOST:PORT, :PORT or 0 to disable)`);
  return { hostname: m[1].replace(/^\[(.*)\]$/, "$1") || "0.0.0.0", port: Number(m[2]) };
}

export function serveHealth(
  addr: { hostname: string; port: number },
  opts: { ready: () => boolean; metrics?: Metrics },
): HealthServer {
  const server = Deno.serve({ ...addr, onListen: () => {} }, (req) => {
    const path = new URL(req.url).pathname;
    if (path === "/healthz") return new Response("ok\n");
    if (path === "/readyz") {
      return opts.ready() ? new Response("ok\n") : new Response("caches not synced\n", { status: 503 });
    }
    if (path === "/metrics" && opts.metrics) {
      return new Response(opts.metrics.render(), { headers: { "content-type": "text/plain; version=0.0.4" } });
    }
    return new Response("not found\n", { status: 404 });
  });
  return { port: server.addr.port, shutdown: () => server.shutdown() };
}
