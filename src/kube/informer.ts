/**
 * List + watch + cache for one resource, owned here rather than taken from client-node, whose Watch under Deno never
 * ends on a half-dead stream: undici ignores an abort once the response headers are in (README, "Why these parts are
 * hand-written").
 *
 * - Watches ask for bookmarks and carry a server-side timeout, so a healthy quiet watch ends by itself; a watch that
 *   sends nothing (not even the server's close) for `idleTimeoutMs` is presumed dead and restarted.
 * - 410 Gone (compacted resourceVersion) triggers a relist; the relist is diffed against the cache so handlers
 *   see the deletions they missed. Other failures resume the watch from the last resourceVersion, and the server
 *   replays what happened meanwhile (or answers 410).
 * - Lists are bounded by the client's request timeout, so a half-dead connection cannot stall a relist either.
 * - Every failure backs off exponentially with full jitter, capped, so a lost API server is not hammered and is
 *   retried forever.
 */
import type { KubeObject } from "../api/types.ts";
import { isGone, type KubeClient, KubeError, type Resource } from "./client.ts";
import { abortableSleep, backoffDelay } from "./backoff.ts";
import type { Logger } from "../observe/log.ts";

export type EventType = "ADDED" | "MODIFIED" | "DELETED";
export type Handler<T> = (type: EventType, obj: T) => void;

export interface InformerOptions {
  namespace?: string;
  labelSelector?: string;
  /** Server-side watch timeout (default 60); the watch is re-established after it. */
  watchTimeoutSeconds?: number;
  /**
   * No event (bookmarks included) for this long means the connection is dead. Must exceed the watch timeout, or
   * every quiet watch would be taken for dead; defaults to the watch timeout plus 30 s.
   */
  idleTimeoutMs?: number;
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  log: Logger;
}

export const objectKey = (o: KubeObject) => `${o.metadata.namespace ?? ""}/${o.metadata.name}`;

/** What reconciling reads from a cache; the unit tests' fake (FakeKube.cache) reads its store directly. */
export interface Cache<T> {
  get(namespace: string | undefined, name: string): T | undefined;
  list(namespace?: string): T[];
}

/**
 * Drops what nobody here reads but every object carries: `metadata.managedFields`, server-side apply's record, one
 * entry per writer (an Exporter of ours has three: create, annotations, Jumpstarter's status), each a tree of objects
 * per field written, held for every cached object. Writes are merge patches, which leave it alone on the server.
 */
function slim<T extends KubeObject>(o: T): T {
  delete (o.metadata as { managedFields?: unknown }).managedFields;
  return o;
}

export class Informer<T extends KubeObject> implements Cache<T> {
  private readonly cache = new Map<string, T>();
  private readonly handlers: Handler<T>[] = [];
  private resourceVersion = "";
  private resolveSynced!: () => void;
  readonly synced = new Promise<void>((r) => this.resolveSynced = r);
  hasSynced = false;
  readonly stats = { lists: 0, watches: 0, restarts: 0, idleTimeouts: 0 };
  private readonly watchTimeoutSeconds: number;
  private readonly idleMs: number;

  constructor(
    private readonly client: KubeClient,
    readonly resource: Resource,
    private readonly opts: InformerOptions,
  ) {
    this.watchTimeoutSeconds = opts.watchTimeoutSeconds ?? 60;
    this.idleMs = opts.idleTimeoutMs ?? this.watchTimeoutSeconds * 1000 + 30_000;
    if (this.idleMs <= this.watchTimeoutSeconds * 1000) {
      throw new Error(`informer ${resource.plural}: idleTimeoutMs must exceed watchTimeoutSeconds`);
    }
  }

  on(handler: Handler<T>): void {
    this.handlers.push(handler);
  }

  get(namespace: string | undefined, name: string): T | undefined {
    return this.cache.get(`${namespace ?? ""}/${name}`);
  }

  list(namespace?: string): T[] {
    const all = [...this.cache.values()];
    return namespace === undefined ? all : all.filter((o) => o.metadata.namespace === namespace);
  }

  /** Runs until `signal` aborts. */
  async run(signal: AbortSignal): Promise<void> {
    const log = this.opts.log.child({ resource: this.resource.plural });
    let failures = 0;
    let needList = true;
    let justListed = false;
    while (!signal.aborted) {
      try {
        if (needList) {
          await this.relist(signal);
          needList = false;
          justListed = true;
        }
        const started = Date.now();
        const gotEvents = await this.watchOnce(signal);
        justListed = false;
        // A server that closes watches at once must not cause a hot loop; a quiet watch that ran its course is fine.
        failures = gotEvents || Date.now() - started >= 1000 ? 0 : failures + 1;
      } catch (e) {
        if (signal.aborted) break;
        this.stats.restarts++;
        if (isGone(e)) {
          log.info("watch expired (410), relisting");
          needList = true;
          // The server answered, so earlier connection failures are over; but a 410 on the first watch after a fresh
          // list would otherwise relist in a loop with no pause.
          failures = justListed ? failures + 1 : 0;
        } else {
          failures++;
          log.warn("list/watch failed, retrying", { error: String(e), failures });
        }
      }
      if (failures > 0) await abortableSleep(backoffDelay(failures, this.backoff()), signal);
    }
  }

  private get typeMeta() {
    const r = this.resource;
    return { apiVersion: r.group ? `${r.group}/${r.version}` : r.version, kind: r.kind };
  }

  private backoff() {
    return { initialMs: this.opts.backoffInitialMs ?? 200, maxMs: this.opts.backoffMaxMs ?? 30_000 };
  }

  private async relist(signal: AbortSignal): Promise<void> {
    this.stats.lists++;
    const fresh = new Map<string, T>();
    let cont: string | undefined;
    let rv = "";
    do {
      const page = await this.client.list<T>(this.resource, this.opts.namespace, {
        labelSelector: this.opts.labelSelector,
        limit: 500,
        continue: cont,
      }, signal);
      // List items of built-in types come without apiVersion/kind (watch events carry them): fill them in so every
      // cached object can be referred to, e.g. as an Event's involvedObject.
      for (const item of page.items) fresh.set(objectKey(item), slim({ ...this.typeMeta, ...item }));
      cont = page.metadata.continue || undefined;
      rv = page.metadata.resourceVersion ?? "";
    } while (cont);
    const old = new Map(this.cache);
    this.cache.clear();
    for (const [k, o] of fresh) this.cache.set(k, o);
    this.resourceVersion = rv;
    for (const [k, o] of old) if (!fresh.has(k)) this.emit("DELETED", o);
    for (const [k, o] of fresh) {
      const before = old.get(k);
      if (!before) this.emit("ADDED", o);
      else if (before.metadata.resourceVersion !== o.metadata.resourceVersion) this.emit("MODIFIED", o);
    }
    if (!this.hasSynced) {
      this.hasSynced = true;
      this.resolveSynced();
    }
  }

  /** One watch request; returns whether any event arrived. Throws on errors (410 included). */
  private async watchOnce(signal: AbortSignal): Promise<boolean> {
    this.stats.watches++;
    const idle = new AbortController();
    const both = AbortSignal.any([signal, idle.signal]);
    const idleMs = this.idleMs;
    let timer = setTimeout(() => idle.abort(), idleMs);
    const touch = () => {
      clearTimeout(timer);
      timer = setTimeout(() => idle.abort(), idleMs);
    };
    let any = false;
    try {
      const events = this.client.watch<T>(this.resource, this.opts.namespace, {
        resourceVersion: this.resourceVersion,
        labelSelector: this.opts.labelSelector,
        timeoutSeconds: this.watchTimeoutSeconds,
      }, both);
      for await (const ev of events) {
        touch();
        any = true;
        if (ev.type === "ERROR") {
          const status = ev.object as unknown as { code?: number; reason?: string; message?: string };
          throw new KubeError(status.code ?? 500, status.reason ?? "WatchError", status.message ?? "watch error");
        }
        this.resourceVersion = ev.object.metadata.resourceVersion ?? this.resourceVersion;
        if (ev.type === "BOOKMARK") continue;
        const key = objectKey(slim(ev.object));
        if (ev.type === "DELETED") this.cache.delete(key);
        else this.cache.set(key, ev.object);
        this.emit(ev.type, ev.object);
      }
      return any;
    } catch (e) {
      if (idle.signal.aborted && !signal.aborted) {
        this.stats.idleTimeouts++;
        this.opts.log.warn("watch silent, restarting", { resource: this.resource.plural, idleMs });
        return any;
      }
      throw e;
    } finally {
      clearTimeout(timer);
    }
  }

  /** A throwing handler must not cost the other handlers their event, nor restart the watch. */
  private emit(type: EventType, obj: T): void {
    for (const h of this.handlers) {
      try {
        h(type, obj);
      } catch (e) {
        this.opts.log.error("informer event handler failed", {
          resource: this.resource.plural,
          object: objectKey(obj),
          error: String(e),
        });
      }
    }
  }
}
