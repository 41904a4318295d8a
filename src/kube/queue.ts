/**
 * A keyed work queue with the discipline of client-go's: a key is queued at most once, processed by at most one
 * worker at a time (an add during processing re-runs it afterwards), failures retry after the longer of a per-key
 * exponential backoff and an overall token bucket (client-go's DefaultControllerRateLimiter: MaxOf(exponential,
 * bucket of 10 qps, burst 100)), and `shutdown` waits for in-flight work to finish.
 */
import { backoffDelay } from "./backoff.ts";
import { TokenBucket } from "./flowcontrol.ts";

/**
 * First retry of a failed key. client-go starts at 5 ms, which here re-runs a whole reconcile (SSH round trips, API
 * writes) at once into the same failure. 250 ms still catches the common quick case, a 409 Conflict that the watch
 * resolves within tens of ms, and doubles to the cap in 11 failures.
 */
export const RETRY_BASE_MS = 250;
/** The backoff's cap: the default resync, after which the key is due again anyway. */
export const RETRY_MAX_MS = 300_000;
/** Retries of all keys together, a second and at once: many keys failing at once (an API outage) are spread out. */
export const RETRY_QPS = 10;
export const RETRY_BURST = 100;

export interface Outcome {
  /** Run again after this long even if nothing changes (e.g. a cooldown ends or a resync is due). */
  requeueAfterMs?: number;
}

export interface QueueOptions {
  concurrency: number;
  process: (key: string) => Promise<Outcome | void>;
  onError?: (key: string, error: unknown, retryInMs: number) => void;
  /** Called after each processing with its duration, for metrics. */
  onDone?: (key: string, ms: number, ok: boolean) => void;
  baseDelayMs?: number;
  maxDelayMs?: number;
  /** The overall retry bucket (tests); qps <= 0 disables it. */
  retryQps?: number;
  retryBurst?: number;
}

export class WorkQueue {
  private readonly ready: string[] = [];
  private readonly dirty = new Set<string>();
  private readonly processing = new Set<string>();
  private readonly failures = new Map<string, number>();
  private readonly timers = new Map<string, { at: number; id: ReturnType<typeof setTimeout> }>();
  private readonly waiters: (() => void)[] = [];
  private readonly retryBucket: TokenBucket;
  private stopping = false;
  private workers: Promise<void>[] = [];

  constructor(private readonly opts: QueueOptions) {
    this.retryBucket = new TokenBucket(opts.retryQps ?? RETRY_QPS, opts.retryBurst ?? RETRY_BURST);
  }

  add(key: string): void {
    if (this.stopping || this.dirty.has(key)) return;
    this.dirty.add(key);
    if (!this.processing.has(key)) {
      this.ready.push(key);
      this.waiters.shift()?.();
    }
  }

  /** Adds after a delay; an earlier pending delay for the same key wins. */
  addAfter(key: string, ms: number): void {
    if (this.stopping) return;
    if (ms <= 0) return this.add(key);
    const at = Date.now() + ms;
    const pending = this.timers.get(key);
    if (pending && pending.at <= at) return;
    if (pending) clearTimeout(pending.id);
    const id = setTimeout(() => {
      this.timers.delete(key);
      this.add(key);
    }, ms);
    this.timers.set(key, { at, id });
  }

  /** Keys waiting to be processed (not counting delayed ones). */
  depth(): number {
    return this.ready.length;
  }

  start(): void {
    for (let i = 0; i < this.opts.concurrency; i++) this.workers.push(this.worker());
  }

  /** Stops taking work, drops delayed keys, and resolves when in-flight work is done. */
  async shutdown(): Promise<void> {
    this.stopping = true;
    for (const t of this.timers.values()) clearTimeout(t.id);
    this.timers.clear();
    this.ready.length = 0;
    this.dirty.clear();
    for (const w of this.waiters.splice(0)) w();
    await Promise.all(this.workers);
  }

  private async next(): Promise<string | undefined> {
    while (!this.stopping && this.ready.length === 0) await new Promise<void>((r) => this.waiters.push(r));
    return this.stopping ? undefined : this.ready.shift();
  }

  private async worker(): Promise<void> {
    for (let key = await this.next(); key !== undefined; key = await this.next()) {
      this.dirty.delete(key);
      this.processing.add(key);
      const started = performance.now();
      let retryIn: number | undefined;
      let ok = true;
      try {
        const outcome = await this.opts.process(key);
        this.failures.delete(key);
        retryIn = outcome?.requeueAfterMs;
      } catch (e) {
        ok = false;
        const n = (this.failures.get(key) ?? 0) + 1;
        this.failures.set(key, n);
        const backoff = {
          initialMs: this.opts.baseDelayMs ?? RETRY_BASE_MS,
          maxMs: this.opts.maxDelayMs ?? RETRY_MAX_MS,
        };
        retryIn = Math.max(backoffDelay(n, backoff), this.retryBucket.reserve());
        this.opts.onError?.(key, e, retryIn);
      }
      this.opts.onDone?.(key, performance.now() - started, ok);
      this.processing.delete(key);
      if (this.dirty.has(key)) {
        this.ready.push(key);
        this.waiters.shift()?.();
      }
      if (retryIn !== undefined) this.addAfter(key, retryIn);
    }
  }
}
