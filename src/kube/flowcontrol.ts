/**
 * Flow control toward the API server, after client-go's: a token bucket every request waits on (rest.Config's QPS and
 * Burst), and which failed attempts are tried again, after how long (rest.Request's retry on Retry-After).
 */
import { abortableSleep, backoffDelay } from "./backoff.ts";

/**
 * No client-side limit unless one is asked for (`--kube-api-qps`), as controller-runtime's configuration since 2025
 * (its PR #3119, on SIG API Machinery's advice): API Priority and Fairness, on by default since Kubernetes 1.20,
 * protects the server, and its 429s are retried after their Retry-After (retryDelay). A bucket of 50 qps made the
 * first 100 s of a 500 x 8 converge a queue of 4000 Exporter creates, every reconcile worker waiting in it while the
 * sets that had their credentials could not be applied: the machine's 2 cores were 0.6 to 0.95 busy there, and
 * converge took 1.57 x the hosts' floor, against 1.15 x with no limit (bench/results/scale-findings.md, eleventh round).
 */
export const DEFAULT_QPS = 0;
/** With a `--kube-api-qps`, requests above that rate allowed at once. */
export const DEFAULT_BURST = 100;

/** A Retry-After above this is cut to it: a bogus or hostile header must not park a worker for an hour. */
export const MAX_RETRY_AFTER_MS = 30_000;
/** Attempts after the first one (client-go's maxRetries is 10, but its attempts wait 1 s each; ours back off). */
export const MAX_RETRIES = 6;
const BACKOFF = { initialMs: 250, maxMs: 8_000 };

/**
 * `qps` tokens a second, at most `burst` saved; qps <= 0 means no limit. Reservations in arrival order, like Go's
 * rate.Limiter.Wait: a caller takes its token now and sleeps until the bucket would have held it.
 */
export class TokenBucket {
  private tokens: number;
  private last: number;

  constructor(
    readonly qps: number,
    readonly burst: number,
    private readonly now: () => number = () => performance.now(),
  ) {
    if (qps > 0 && !(burst >= 1)) throw new RangeError(`burst must be >= 1 when qps > 0, got ${burst}`);
    this.tokens = burst;
    this.last = now();
  }

  /** Takes a token; returns how long the caller must wait before using it (0 when one was saved). */
  reserve(): number {
    if (this.qps <= 0) return 0;
    const t = this.now();
    this.tokens = Math.min(this.burst, this.tokens + (t - this.last) / 1000 * this.qps);
    this.last = t;
    this.tokens -= 1;
    return this.tokens >= 0 ? 0 : -this.tokens / this.qps * 1000;
  }

  /**
   * Waits for a token. An abort ends the wait and gives the token back, as Go's Reservation.Cancel does: the request
   * was never sent. Kept spent, every request timed out in a queue longer than its deadline (30 s: 1500 requests at
   * 50 qps, a wave of creates) burned a token, and so did its retry: the bucket paced requests nobody sent.
   */
  async take(signal?: AbortSignal): Promise<number> {
    const ms = this.reserve();
    if (ms > 0) await abortableSleep(ms, signal);
    if (ms > 0 && signal?.aborted) this.tokens += 1;
    return ms;
  }
}

/** What an attempt came to, as far as retrying goes. */
export type Attempt =
  | { status: number; retryAfter?: string | null }
  /** No HTTP answer: `code` is the connect error's (ECONNREFUSED, ECONNRESET, ETIMEDOUT, ...). */
  | { connectError: string };

/** Codes of failures to open a connection (transport.ts's dial; ETIMEDOUT is its connect bound): nothing was sent. */
const NOT_SENT = new Set(["ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH", "EAI_AGAIN", "EPROXY", "ETIMEDOUT"]);
/** Codes where the request may have arrived and been acted on. */
const MAYBE_SENT = new Set(["ECONNRESET", "EPIPE"]);

/**
 * The wait before the next attempt, or undefined for "do not retry". 429 means the server did not act (APF, max
 * in-flight), so any method is retried, a POST too. A 5xx or a lost connection may come after the server acted: only
 * idempotent methods are retried (GET, PUT with its resourceVersion, a merge patch, DELETE), and a POST only when the
 * connection never opened. A Retry-After (seconds or an HTTP date) is honoured up to MAX_RETRY_AFTER_MS; without one
 * the wait is exponential with jitter.
 */
export function retryDelay(
  method: string,
  retries: number,
  attempt: Attempt,
  random: () => number = Math.random,
  nowMs: number = Date.now(),
): number | undefined {
  if (retries >= MAX_RETRIES) return undefined;
  const idempotent = method !== "POST";
  const backoff = backoffDelay(retries + 1, BACKOFF, random);
  if ("connectError" in attempt) {
    const c = attempt.connectError;
    return NOT_SENT.has(c) || (idempotent && MAYBE_SENT.has(c)) ? backoff : undefined;
  }
  const s = attempt.status;
  if (s !== 429 && !(idempotent && (s === 500 || s === 502 || s === 503 || s === 504))) return undefined;
  const after = retryAfterMs(attempt.retryAfter, nowMs);
  return after === undefined ? backoff : Math.min(MAX_RETRY_AFTER_MS, after);
}

/** Retry-After as milliseconds: delay-seconds or an HTTP date (RFC 9110 10.2.3); undefined when absent or invalid. */
export function retryAfterMs(header: string | null | undefined, nowMs: number = Date.now()): number | undefined {
  if (!header) return undefined;
  const v = header.trim();
  if (/^\d+$/.test(v)) return Number(v) * 1000;
  const at = Date.parse(v);
  return Number.isNaN(at) ? undefined : Math.max(0, at - nowMs);
}
