import assert from "node:assert/strict";
import { KubeConnectError, MAX_CONNECTIONS, Transport } from "./transport.ts";
import { connectProxy, type Relay, socks5Proxy } from "../../test/proxies.ts";

const NO_AUTH = { headers: {} };

/** A loopback HTTP server answering each request with its method and path; `/stream` sends one line and holds on. */
function server() {
  const held: ReadableStreamDefaultController<Uint8Array>[] = [];
  const s = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (req) => {
    const url = new URL(req.url);
    if (url.pathname === "/stream") {
      return new Response(
        new ReadableStream({
          start(c) {
            held.push(c);
            c.enqueue(new TextEncoder().encode("first\n"));
          },
        }),
      );
    }
    return new Response(`${req.method} ${url.pathname}${url.search}`);
  });
  return {
    url: `http://127.0.0.1:${s.addr.port}`,
    async close() {
      for (const c of held) c.close();
      await s.shutdown();
    },
  };
}

async function withTransport(
  proxy: Relay | undefined,
  scheme: string,
  fn: (t: Transport, base: string) => Promise<void>,
): Promise<void> {
  const api = server();
  const t = new Transport(new URL(api.url), {
    insecure: false,
    proxy: proxy && new URL(`${scheme}://127.0.0.1:${proxy.port}`),
    connectTimeoutMs: 5000,
  });
  try {
    await fn(t, api.url);
  } finally {
    t.close();
    await proxy?.close();
    await api.close();
  }
}

for (
  const [name, proxy, scheme] of [["direct", undefined, ""], ["HTTP CONNECT", connectProxy, "http"], [
    "SOCKS5",
    socks5Proxy,
    "socks5",
  ]] as const
) {
  Deno.test(`transport (${name}): requests on kept-alive connections; a body ends on its signal`, async () => {
    const relay = proxy?.();
    await withTransport(relay, scheme, async (t, base) => {
      for (const path of ["/api/v1/namespaces?limit=1", "/version"]) {
        const res = await t.send("GET", new URL(base + path), NO_AUTH, undefined, undefined);
        assert.equal(await res.text(), `GET ${path}`);
      }
      const body = new TextEncoder().encode("{}");
      const posted = await t.send("POST", new URL(`${base}/x`), NO_AUTH, body, undefined);
      assert.equal(await posted.text(), "POST /x");
      // kept alive: the proxy was asked for the server once
      if (relay) assert.deepEqual(relay.targets, [new URL(base).host]);

      const ac = new AbortController();
      const res = await t.send("GET", new URL(`${base}/stream`), NO_AUTH, undefined, ac.signal);
      const reader = res.body!.getReader();
      assert.equal(new TextDecoder().decode((await reader.read()).value), "first\n");
      const why = new Error("stop");
      ac.abort(why);
      await assert.rejects(reader.read(), (e) => e === why);
    });
  });
}

Deno.test("transport: connect failures are KubeConnectErrors naming the address dialled and the code", async () => {
  const closed = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = closed.addr.port;
  closed.close();
  const refused = new Transport(new URL(`http://127.0.0.1:${port}`), { insecure: false, connectTimeoutMs: 5000 });
  try {
    await assert.rejects(
      refused.send("GET", new URL(`http://127.0.0.1:${port}/version`), NO_AUTH, undefined, undefined),
      (e) => e instanceof KubeConnectError && e.code === "ECONNREFUSED" && e.address === `127.0.0.1:${port}`,
    );
  } finally {
    refused.close();
  }

  // a proxy that refuses the CONNECT
  const proxy = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const answering = (async () => {
    for await (const conn of proxy) {
      await conn.read(new Uint8Array(4096));
      await conn.write(new TextEncoder().encode("HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n"));
      conn.close();
    }
  })();
  const server = "http://api.example:80";
  const denied = new Transport(new URL(server), {
    insecure: false,
    proxy: new URL(`http://127.0.0.1:${proxy.addr.port}`),
    connectTimeoutMs: 5000,
  });
  try {
    await assert.rejects(
      denied.send("GET", new URL(`${server}/version`), NO_AUTH, undefined, undefined),
      (e) =>
        e instanceof KubeConnectError && e.code === "EPROXY" && e.viaProxy === `127.0.0.1:${proxy.addr.port}` &&
        /answered CONNECT api\.example:80 with "HTTP\/1\.1 403 Forbidden"/.test(e.message),
    );
  } finally {
    denied.close();
    proxy.close();
    await answering.catch(() => {});
  }
});

Deno.test("transport: at most MAX_CONNECTIONS requests in flight, over as many connections, kept for the next burst", async () => {
  let inFlight = 0;
  let most = 0;
  const ports = new Set<number>();
  const s = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (_req, info) => {
    ports.add(info.remoteAddr.port);
    most = Math.max(most, ++inFlight);
    await new Promise((r) => setTimeout(r, 20));
    inFlight--;
    return new Response("ok");
  });
  const t = new Transport(new URL(`http://127.0.0.1:${s.addr.port}`), { insecure: false, connectTimeoutMs: 5000 });
  const burst = () =>
    Promise.all(Array.from({ length: 3 * MAX_CONNECTIONS }, async () => {
      const res = await t.send("GET", new URL(`http://127.0.0.1:${s.addr.port}/`), NO_AUTH, undefined, undefined);
      assert.equal(await res.text(), "ok");
    }));
  try {
    await burst();
    await burst();
    assert.equal(most, MAX_CONNECTIONS);
    assert.equal(ports.size, MAX_CONNECTIONS);
  } finally {
    t.close();
    await s.shutdown();
  }
});
