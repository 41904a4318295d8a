/**
 * FIFO counting semaphore; fail() wakes all waiters so they can notice a dead connection and reconnect. A wait ends
 * without a slot (false) after `ms` (Infinity: no bound) or on `signal`. The SSH pool's channels and handshakes, the
 * API transport's connections.
 */
export class Semaphore {
  #free: number;
  readonly #n: number;
  #waiters: (() => void)[] = [];
  constructor(n: number) {
    this.#free = this.#n = n;
  }
  acquire(ms: number, signal?: AbortSignal): Promise<boolean> {
    if (this.#free > 0) {
      this.#free--;
      return Promise.resolve(true);
    }
    if (ms <= 0 || signal?.aborted) return Promise.resolve(false);
    return new Promise((resolve) => {
      const give = () => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", giveUp);
        resolve(true);
      };
      const giveUp = () => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", giveUp);
        this.#waiters = this.#waiters.filter((w) => w !== give);
        resolve(false);
      };
      const timer = Number.isFinite(ms) ? setTimeout(giveUp, ms) : undefined;
      signal?.addEventListener("abort", giveUp, { once: true });
      this.#waiters.push(give);
    });
  }
  get waiting(): number {
    return this.#waiters.length;
  }
  /** No slot taken and nobody waiting. */
  idle(): boolean {
    return this.#free === this.#n && this.#waiters.length === 0;
  }
  release(): void {
    const next = this.#waiters.shift();
    if (next) next();
    else this.#free++;
  }
  fail(): void {
    // Waiters get a slot on a connection that is no longer alive; ssh.ts's exec() checks `alive` and retries elsewhere.
    const w = this.#waiters;
    this.#waiters = [];
    for (const r of w) {
      this.#free--;
      r();
    }
  }
}
