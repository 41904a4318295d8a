/** How problems read in status and events, and how soon a set with problems is looked at again. */
import { SshError } from "../host/ssh.ts";
import type { Problem } from "./status.ts";

/** Problems that fix themselves (a host back online) are retried sooner than those that wait for a person. */
const TRANSIENT_PROBLEMS = new Set(["HostUnreachable", "HostBusy", "TeardownFailed", "MoveBlocked"]);
const TRANSIENT_RETRY_MS = 10_000;
const PROBLEM_RETRY_MS = 30_000;

/**
 * Refusals of the apply script that have their own reason, by error code (host/remote.ts): most wait for a person to
 * fix the host; any other failed apply is DeployFailed.
 */
const REFUSAL_REASONS = new Map([
  // another script held the host's lock past its bound: nothing to fix, retried soon (TRANSIENT_PROBLEMS)
  ["host-busy", "HostBusy"],
  ["kvm-missing", "KvmMissing"],
  ["kvm-denied", "KvmDenied"],
  ["podman-too-old", "PodmanTooOld"],
  ["loop-missing", "LoopMissing"],
  ["disk-shrink", "DiskShrinkRefused"],
]);

/** The reason a failed apply is reported under, from its first error's code. */
export function applyFailureReason(code: string | undefined): string {
  return REFUSAL_REASONS.get(code ?? "") ?? "DeployFailed";
}

/** A failed apply in status and events: the host it ran on, then each error as `code: message`. */
export function applyFailureText(host: string, errors: string[]): string {
  return `on ${host}: ${errors.join("; ")}`;
}

/** A set is looked at again at least every `resyncMs`, sooner with problems: `--resync` bounds every interval. */
export function retryAfterMs(resyncMs: number, problems: Problem[]): number {
  if (problems.some((p) => TRANSIENT_PROBLEMS.has(p.reason))) return Math.min(resyncMs, TRANSIENT_RETRY_MS);
  return problems.length ? Math.min(resyncMs, PROBLEM_RETRY_MS) : resyncMs;
}

/**
 * An error's message for status and events. While the SSH pool backs off it rethrows the last failure with a
 * countdown ("next attempt allowed in 7s"); that text changes on every reconcile and would make a new Event object and
 * a status write each time, so the underlying failure is reported instead.
 */
export function errorText(e: unknown): string {
  if (e instanceof SshError && e.retryAt !== undefined && e.cause instanceof Error) {
    return `${e.cause.message} (retrying with backoff)`;
  }
  return e instanceof Error ? e.message : String(e);
}
