/**
 * The controller's memory of how it reached each lab host, so that a teardown does not depend on objects that may be
 * gone by then: `kubectl delete -f` and `kubectl delete namespace` remove the Secret and the class before (or with)
 * the Exporters, and a rotated key may not be on the host yet. In memory only: a restart forgets it, and then the
 * teardown grace (teardown.ts) bounds how long an Exporter waits.
 */
import { SshError } from "../host/ssh.ts";
import type { LabTarget } from "./credentials.ts";
import { targetString } from "./targets.ts";

/** Keys remembered per host: a rotation or two, and a class switched back and forth. */
const PER_HOST = 4;

const sameCredentials = (a: LabTarget, b: LabTarget) =>
  a.privateKey === b.privateKey && a.knownHosts === b.knownHosts && a.hostKeyPolicy === b.hostKeyPolicy;

/** Remembers that `target` is how its host is reached now (newest last; the oldest beyond PER_HOST goes). */
export function rememberTarget(memory: Map<string, LabTarget[]>, target: LabTarget): void {
  const where = targetString(target);
  const known = memory.get(where) ?? [];
  if (known.length && sameCredentials(known[known.length - 1], target)) return;
  memory.set(where, [...known.filter((t) => !sameCredentials(t, target)), target].slice(-PER_HOST));
}

/**
 * Every way to try `where` (user@host:port): `first` (the current credentials, best first), then those remembered,
 * newest first; each set of credentials once.
 */
export function candidateTargets(memory: Map<string, LabTarget[]>, where: string, first: LabTarget[]): LabTarget[] {
  const out: LabTarget[] = [];
  for (const t of [...first, ...[...memory.get(where) ?? []].reverse()]) {
    if (!out.some((o) => sameCredentials(o, t))) out.push(t);
  }
  return out;
}

/** The host let none of the credentials tried in: each was refused (key or host key). */
export class NoneTaken extends Error {
  constructor(readonly tried: number, readonly last: unknown) {
    super(`the host accepts none of the ${tried} SSH keys known for it: ${last}`);
  }
}

/**
 * `fn` with each of `targets` in turn (candidateTargets) until the host lets one in: a refused key or host key tries
 * the next, as another class's key or known_hosts, or the key before a rotation, may be the one the host takes. Any
 * other failure is `fn`'s answer. Throws NoneTaken when every one was refused.
 */
export async function withFirstTaken<T>(targets: LabTarget[], fn: (target: LabTarget) => Promise<T>): Promise<T> {
  let last: unknown;
  for (const target of targets) {
    try {
      return await fn(target);
    } catch (err) {
      if (!(err instanceof SshError && (err.kind === "auth" || err.kind === "hostkey"))) throw err;
      last = err;
    }
  }
  throw new NoneTaken(targets.length, last);
}
