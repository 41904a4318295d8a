/**
 * Tiny loopback relays for the client tests: an HTTP CONNECT proxy, a SOCKS5 proxy and a plain TCP forwarder. Each
 * listens on loopback only, serves at most `maxConnections` connections, records what it was asked to reach, and
 * closes every connection on close() (the test sanitizers see no leak).
 */

export interface Relay {
  port: number;
  hostname: string;
  /** host:port of every target asked for (CONNECT, SOCKS5) or forwarded to. */
  targets: string[];
  close(): Promise<void>;
}

type Handshake = (conn: Deno.Conn, first: Uint8Array) => Promise<{ target: string; rest: Uint8Array } | undefined>;

function relay(hostname: string, handshake: Handshake, maxConnections: number): Relay {
  const listener = Deno.listen({ hostname, port: 0 });
  const conns = new Set<Deno.Conn>();
  const targets: string[] = [];
  const tasks = new Set<Promise<void>>();
  let served = 0;
  const serve = async (conn: Deno.Conn) => {
    let upstream: Deno.Conn | undefined;
    try {
      const buf = new Uint8Array(4096);
      const n = await conn.read(buf);
      if (n === null) return;
      const hs = await handshake(conn, buf.subarray(0, n));
      if (!hs) return;
      targets.push(hs.target);
      const i = hs.target.lastIndexOf(":");
      upstream = await Deno.connect({
        hostname: hs.target.slice(0, i).replace(/^\[|\]$/g, ""),
        port: Number(hs.target.slice(i + 1)),
      });
      conns.add(upstream);
      if (hs.rest.length) await upstream.write(hs.rest);
      await Promise.all([pipe(conn, upstream), pipe(upstream, conn)]);
    } catch {
      // a closed side ends the relay
    } finally {
      for (const c of [conn, upstream]) {
        if (c && conns.delete(c)) c.close();
      }
    }
  };
  const accept = (async () => {
    for await (const conn of listener) {
      if (++served > maxConnections) {
        conn.close();
        continue;
      }
      conns.add(conn);
      const t = serve(conn);
      tasks.add(t);
      t.finally(() => tasks.delete(t));
    }
  })().catch(() => {});
  return {
    port: (listener.addr as Deno.NetAddr).port,
    hostname,
    targets,
    async close() {
      listener.close();
      for (const c of conns) c.close();
      conns.clear();
      await accept;
      await Promise.all(tasks);
    },
  };
}

async function pipe(from: Deno.Conn, to: Deno.Conn): Promise<void> {
  const buf = new Uint8Array(16384);
  try {
    for (;;) {
      const n = await from.read(buf);
      if (n === null) break;
      let off = 0;
      while (off < n) off += await to.write(buf.subarray(off, n));
    }
  } finally {
    try {
      // a Promise: its rejection (the other side closed first) is caught only when awaited
      await to.closeWrite();
    } catch { /* already closed */ }
  }
}

/** An HTTP CONNECT proxy on 127.0.0.1; anything but CONNECT gets 405. */
export function connectProxy(maxConnections = 16): Relay {
  return relay("127.0.0.1", async (conn, first) => {
    const text = new TextDecoder().decode(first);
    const m = /^CONNECT (\S+) HTTP\/1\.[01]\r\n/.exec(text);
    const end = text.indexOf("\r\n\r\n");
    if (!m || end < 0) {
      await conn.write(new TextEncoder().encode("HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n"));
      return undefined;
    }
    await conn.write(new TextEncoder().encode("HTTP/1.1 200 Connection established\r\n\r\n"));
    return { target: m[1], rest: first.subarray(new TextEncoder().encode(text.slice(0, end + 4)).length) };
  }, maxConnections);
}

/** A SOCKS5 proxy on 127.0.0.1 (no authentication, CONNECT only, IPv4 and domain names). */
export function socks5Proxy(maxConnections = 16): Relay {
  return relay("127.0.0.1", async (conn, first) => {
    if (first[0] !== 5) return undefined;
    await conn.write(new Uint8Array([5, 0]));
    const req = new Uint8Array(512);
    const n = await conn.read(req);
    if (n === null || req[1] !== 1) return undefined;
    let host: string;
    let off: number;
    if (req[3] === 1) {
      host = Array.from(req.subarray(4, 8)).join(".");
      off = 8;
    } else if (req[3] === 3) {
      host = new TextDecoder().decode(req.subarray(5, 5 + req[4]));
      off = 5 + req[4];
    } else return undefined;
    const port = (req[off] << 8) | req[off + 1];
    await conn.write(new Uint8Array([5, 0, 0, 1, 0, 0, 0, 0, 0, 0]));
    return { target: `${host}:${port}`, rest: req.subarray(off + 2, n) };
  }, maxConnections);
}

/** A plain TCP forwarder from `hostname` (e.g. 127.0.0.2, an address the server's certificate does not name). */
export function forwarder(hostname: string, target: string, maxConnections = 16): Relay {
  return relay(hostname, (_conn, first) => Promise.resolve({ target, rest: first }), maxConnections);
}
