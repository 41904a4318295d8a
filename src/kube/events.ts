/**
 * core/v1 Events (the operator's Role grants `events` create/patch in the core group, not events.k8s.io).
 * Repeats of the same event on the same object within a window bump `count` instead of creating new objects.
 */
import type { KubeObject } from "../api/types.ts";
import { isNotFound, type KubeApi } from "./client.ts";
import { EVENTS } from "./resources.ts";
import type { Logger } from "../observe/log.ts";

export type EventKind = "Normal" | "Warning";

export interface Recorder {
  event(obj: KubeObject, type: EventKind, reason: string, message: string): void;
}

interface Seen {
  name: string;
  count: number;
  at: number;
}

const WINDOW_MS = 10 * 60_000;
const PRUNE_EVERY_MS = 30_000;
/**
 * Event writes in flight at once. One at a time, the 2000 events of 250 sets converging took minutes to drain
 * behind a busy API server, so events trailed what they told by minutes (bench/results/scale-findings.md).
 */
const MAX_IN_FLIGHT = 8;

export class EventRecorder implements Recorder {
  private readonly seen = new Map<string, Seen>();
  private prunedAt = 0;
  /** Per involved object, its last queued write: an object's events are written in order (a series' count too). */
  private readonly chains = new Map<string, Promise<void>>();
  private inFlight = 0;
  private readonly waiting: (() => void)[] = [];

  constructor(
    private readonly client: KubeApi,
    private readonly component: string,
    private readonly log: Logger,
    private readonly now: () => Date = () => new Date(),
  ) {}

  /** Fire and forget, in order per object; a failed event write is logged, never fatal. */
  event(obj: KubeObject, type: EventKind, reason: string, message: string): void {
    // What the controller did (created, deployed, updated, torn down) belongs in its log too; warnings are logged
    // where they arise, with more detail than an event holds.
    if (type === "Normal") {
      this.log.info(message, {
        reason,
        object: `${obj.kind ?? ""}/${obj.metadata.namespace ?? ""}/${obj.metadata.name}`,
      });
    }
    const key = obj.metadata.uid ?? `${obj.metadata.namespace}/${obj.metadata.name}`;
    const next = (this.chains.get(key) ?? Promise.resolve())
      .then(() => this.limited(() => this.write(obj, type, reason, message)))
      .catch((e) => this.log.warn("could not record event", { reason, error: String(e) }));
    this.chains.set(key, next);
    next.then(() => {
      if (this.chains.get(key) === next) this.chains.delete(key);
    });
  }

  /** Resolves when queued events are written (tests, shutdown). */
  async flush(): Promise<void> {
    while (this.chains.size) await Promise.all(this.chains.values());
  }

  private async limited(write: () => Promise<void>): Promise<void> {
    // a finished write hands its slot to the next waiting one
    if (this.inFlight < MAX_IN_FLIGHT) this.inFlight++;
    else await new Promise<void>((r) => this.waiting.push(r));
    try {
      await write();
    } finally {
      const next = this.waiting.shift();
      if (next) next();
      else this.inFlight--;
    }
  }

  private async write(obj: KubeObject, type: EventKind, reason: string, message: string): Promise<void> {
    const m = obj.metadata;
    // Cluster-scoped objects have no namespace of their own; their events go to "default", as client-go's do.
    const namespace = m.namespace ?? "default";
    const key = `${m.uid}/${type}/${reason}/${message}`;
    const now = this.now();
    const seen = this.seen.get(key);
    if (seen && now.getTime() - seen.at < WINDOW_MS) {
      try {
        await this.client.mergePatch(EVENTS, namespace, seen.name, {
          count: seen.count + 1,
          lastTimestamp: now.toISOString(),
        });
        seen.count++;
        seen.at = now.getTime();
        return;
      } catch (e) {
        // The API server's event TTL (1 h by default) or a user removed it: start a new series.
        if (!isNotFound(e)) throw e;
        this.seen.delete(key);
      }
    }
    const created = await this.client.create(EVENTS, {
      metadata: { generateName: `${m.name}.`, namespace },
      involvedObject: {
        apiVersion: obj.apiVersion,
        kind: obj.kind,
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resourceVersion: m.resourceVersion,
      },
      type,
      reason,
      message: message.slice(0, 1024),
      source: { component: this.component },
      reportingComponent: this.component,
      firstTimestamp: now.toISOString(),
      lastTimestamp: now.toISOString(),
      count: 1,
    } as KubeObject);
    this.seen.set(key, { name: created.metadata.name!, count: 1, at: now.getTime() });
    // pruned now and then, not after every Event: walking the map each time cost 7% of deleting 4000 instances
    if (now.getTime() - this.prunedAt > PRUNE_EVERY_MS) {
      this.prunedAt = now.getTime();
      for (const [k, s] of this.seen) if (now.getTime() - s.at > WINDOW_MS) this.seen.delete(k);
    }
  }
}
