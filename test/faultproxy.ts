/**
 * FaultInjector: a TCP proxy in front of the real API server that produces, on demand, the network faults the real
 * server cannot: an outage (every connection dropped, new ones refused) and a silent, half-dead link (connections stay
 * open but no byte moves either way). It is a fake for faults only: bytes pass through untouched (TLS included, it is
 * never terminated here), so everything else the client sees comes from the real server.
 */
import { parse, stringify } from "yaml";
import { KubeClient } from "../src/kube/client.ts";

export interface FaultStats {
  /** Connections accepted, refused ones included: the client's connection attempts. */
  accepted: number;
  /** Connections closed at once because an outage was on. */
  refused: number;
  /** Connections currently forwarding (or silenced). */
  open: number;
}

interface Link {
  client: Deno.Conn;
  upstream?: Deno.Conn;
  done: Promise<void>;
}

export class FaultInjector {
  readonly url: string;
  private readonly listener: Deno.TcpListener;
  private readonly links = new Set<Link>();
  private readonly counts = { accepted: 0, refused: 0 };
  private outageUntil = 0;
  private outageTimer: ReturnType<typeof setTimeout> | undefined;
  private outageEnded: (() => void) | undefined;
  private silenced: { resumed: Promise<void>; resume: () => void } | undefined;
  private readonly acceptLoop: Promise<void>;

  constructor(private readonly target: { hostname: string; port: number }) {
    this.listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    this.url = `https://127.0.0.1:${this.listener.addr.port}`;
    this.acceptLoop = this.accept();
  }

  /** Proxies to the API server named by a kubeconfig's current cluster. */
  static async forKubeconfig(kubeconfigPath: string): Promise<FaultInjector> {
    const server = new URL(currentServer(parse(await Deno.readTextFile(kubeconfigPath))));
    return new FaultInjector({ hostname: server.hostname, port: Number(server.port || 443) });
  }

  /** A client whose kubeconfig is the given one with its server pointed at this proxy. */
  async client(kubeconfigPath: string, opts?: Parameters<typeof KubeClient.load>[1]): Promise<KubeClient> {
    const config = parse(await Deno.readTextFile(kubeconfigPath));
    const cluster = currentCluster(config);
    cluster.server = this.url;
    const path = await Deno.makeTempFile({ prefix: "qsp-faultproxy-", suffix: ".kubeconfig" });
    try {
      await Deno.writeTextFile(path, stringify(config), { mode: 0o600 });
      return await KubeClient.load(path, opts);
    } finally {
      await Deno.remove(path);
    }
  }

  stats(): FaultStats {
    return { ...this.counts, open: this.links.size };
  }

  /** Drops every open connection and refuses new ones for `ms`; resolves when the outage is over. */
  outage(ms: number): Promise<void> {
    this.outageUntil = Date.now() + ms;
    for (const link of this.links) closeLink(link);
    clearTimeout(this.outageTimer);
    this.outageEnded?.();
    return new Promise((resolve) => {
      this.outageEnded = resolve;
      this.outageTimer = setTimeout(() => {
        this.outageEnded = undefined;
        resolve();
      }, ms);
    });
  }

  /** Stops moving bytes in both directions on every connection, current and new, until `resume`. */
  silence(): void {
    if (this.silenced) return;
    let resume!: () => void;
    const resumed = new Promise<void>((r) => resume = r);
    this.silenced = { resumed, resume };
  }

  /** Delivers what was held back and forwards again, as a healed network would. */
  resume(): void {
    this.silenced?.resume();
    this.silenced = undefined;
  }

  async close(): Promise<void> {
    clearTimeout(this.outageTimer);
    this.outageEnded?.();
    this.resume();
    this.listener.close();
    await this.acceptLoop;
    for (const link of this.links) closeLink(link);
    await Promise.all([...this.links].map((l) => l.done));
  }

  private async accept(): Promise<void> {
    try {
      for await (const conn of this.listener) {
        this.counts.accepted++;
        if (Date.now() < this.outageUntil) {
          this.counts.refused++;
          conn.close();
          continue;
        }
        const link: Link = { client: conn, done: Promise.resolve() };
        this.links.add(link);
        link.done = this.forward(link).finally(() => {
          closeLink(link);
          this.links.delete(link);
        });
      }
    } catch (e) {
      if (!(e instanceof Deno.errors.BadResource)) throw e;
    }
  }

  private async forward(link: Link): Promise<void> {
    try {
      link.upstream = await Deno.connect(this.target);
    } catch {
      return;
    }
    await Promise.race([this.pump(link.client, link.upstream), this.pump(link.upstream, link.client)]);
  }

  /** Copies until either side ends; waits at the silence gate both before reading and before writing. */
  private async pump(from: Deno.Conn, to: Deno.Conn): Promise<void> {
    const buf = new Uint8Array(64 * 1024);
    try {
      for (;;) {
        await this.silenced?.resumed;
        const n = await from.read(buf);
        if (n === null) return;
        await this.silenced?.resumed;
        for (let off = 0; off < n;) off += await to.write(buf.subarray(off, n));
      }
    } catch {
      // A closed or reset socket ends the link, which is all either side can learn from it.
    }
  }
}

function closeLink(link: Link): void {
  for (const c of [link.client, link.upstream]) {
    try {
      c?.close();
    } catch {
      // already closed
    }
  }
}

interface KubeconfigShape {
  "current-context"?: string;
  contexts?: { name: string; context: { cluster: string } }[];
  clusters?: { name: string; cluster: { server: string } }[];
}

function currentCluster(config: KubeconfigShape): { server: string } {
  const ctx = config.contexts?.find((c) => c.name === config["current-context"]);
  const cluster = config.clusters?.find((c) => c.name === ctx?.context.cluster);
  if (!cluster) throw new Error("kubeconfig has no current cluster");
  return cluster.cluster;
}

function currentServer(config: KubeconfigShape): string {
  return currentCluster(config).server;
}
