/** Exponential backoff with full jitter, and a sleep that an abort ends early. */

export interface Backoff {
  initialMs: number;
  maxMs: number;
}

/** Delay before retry number `failures` (1-based): uniform in [d/2, d] with d = initial * 2^(failures-1), capped. */
export function backoffDelay(failures: number, b: Backoff, random: () => number = Math.random): number {
  const d = Math.min(b.maxMs, b.initialMs * 2 ** Math.max(0, failures - 1));
  return d / 2 + random() * d / 2;
}

export function abortableSleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}
